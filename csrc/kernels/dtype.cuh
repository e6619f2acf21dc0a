// Storage types and their arithmetic types on the device: 16-bit floats are
// stored as they come and computed in float32; complex values (complex.cuh) are
// their own arithmetic type.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "complex.cuh"

namespace linrec {

template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<__half> { using type = float; };
template <> struct AccOf<__nv_bfloat16> { using type = float; };
template <typename T> using acc_t = typename AccOf<T>::type;

template <typename Acc> __device__ __forceinline__ Acc to_acc(float v) { return v; }
template <typename Acc> __device__ __forceinline__ Acc to_acc(double v) { return v; }
template <typename Acc> __device__ __forceinline__ Acc to_acc(__half v) { return __half2float(v); }
template <typename Acc> __device__ __forceinline__ Acc to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename Acc, typename R> __device__ __forceinline__ Acc to_acc(Complex<R> v) { return v; }

template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace linrec

// Storage types and their arithmetic types on the device: 16-bit floats are
// stored as they come and computed in float32; complex values (complex.cuh) are
// their own arithmetic type.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "complex.cuh"

namespace linrec {

// Mixed storage: 16-bit values (inputs, outputs, their gradients and the
// initial state) beside float32 coefficients (and their gradient). Rounded to
// 16 bits, decays near 1 become 1 (bfloat16 stores 0.999 as 1.0), so a model
// that keeps its decays in float32 needs them read as they are.
template <typename Values, typename Coeffs> struct Mixed {};

// A kernel's storage parameter S is a storage type (every tensor in it) or a
// Mixed pair: values_t<S> is the type of the scanned tensors, coeffs_t<S> that
// of the coefficients and their gradient.
template <typename S> struct StorageOf { using values = S; using coeffs = S; };
template <typename V, typename C> struct StorageOf<Mixed<V, C>> { using values = V; using coeffs = C; };
template <typename S> using values_t = typename StorageOf<S>::values;
template <typename S> using coeffs_t = typename StorageOf<S>::coeffs;
using MixedHalf = Mixed<__half, float>;
using MixedBFloat16 = Mixed<__nv_bfloat16, float>;
template <typename S> inline constexpr bool kIsMixed = !std::is_same_v<values_t<S>, coeffs_t<S>>;

template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<__half> { using type = float; };
template <> struct AccOf<__nv_bfloat16> { using type = float; };
template <typename V, typename C> struct AccOf<Mixed<V, C>> { using type = float; };
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

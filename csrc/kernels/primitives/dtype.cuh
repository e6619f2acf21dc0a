// Storage types and their arithmetic types on the device: 16-bit floats are
// stored as they come and computed in float32; complex values (complex.cuh) are
// their own arithmetic type.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../../params.h"
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

// Log-space coefficients: the tensor holds log c (logsigmoid gates, -softplus(.) * r), and a
// kernel takes c = exp(log c) as it loads each one (to_acc below), so no pass of torch.exp
// comes first. LogOf<R> is the element type of such a tensor, LogCoeffs<S> the storage type of
// a call whose other tensors are those of S. The gradient written for the coefficients is that
// of log c: c * d/dc (coeff_grad). Log storage counts as mixed: its two element types differ.
// LogOf is in params.h: the CPU kernel's storage switch names it too.
template <typename S> struct LogCoeffs {};
template <typename S> struct StorageOf<LogCoeffs<S>> {
  using values = values_t<S>;
  using coeffs = LogOf<coeffs_t<S>>;
};
template <typename T> inline constexpr bool kIsLog = false;
template <typename R> inline constexpr bool kIsLog<LogOf<R>> = true;

template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<__half> { using type = float; };
template <> struct AccOf<__nv_bfloat16> { using type = float; };
template <typename V, typename C> struct AccOf<Mixed<V, C>> { using type = float; };
template <typename R> struct AccOf<LogOf<R>> { using type = typename AccOf<R>::type; };
template <typename S> struct AccOf<LogCoeffs<S>> { using type = typename AccOf<S>::type; };
template <typename T> using acc_t = typename AccOf<T>::type;

template <typename Acc> __device__ __forceinline__ Acc to_acc(float v) { return v; }
template <typename Acc> __device__ __forceinline__ Acc to_acc(double v) { return v; }
template <typename Acc> __device__ __forceinline__ Acc to_acc(__half v) { return __half2float(v); }
template <typename Acc> __device__ __forceinline__ Acc to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename Acc, typename R> __device__ __forceinline__ Acc to_acc(Complex<R> v) { return v; }
// float32 log c: expf, not the fast __expf, whose error grows with |log c| (a long product of
// decays compounds it). 16-bit log c: __expf. Its error, about 2^-21 + |log c| 2^-24 relative, is
// thousands of times below that of rounding log c to 16 bits (|log c| 2^-9 for bfloat16), and
// expf's longer code cost the bfloat16 pipe backward (H200, 13200 x 4096 at 16x64: 161.7 us with
// expf, 155.2 with __expf, 146.5 for plain coefficients).
template <typename Acc, typename R> __device__ __forceinline__ Acc to_acc(LogOf<R> v) {
  if constexpr (sizeof(R) == 2) return __expf(to_acc<Acc>(v.log));
  else return expf(to_acc<Acc>(v.log));
}

template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
// A log-coefficient tensor's gradient (coeff_grad's value) is stored as it is.
template <> __device__ __forceinline__ LogOf<float> from_acc<LogOf<float>>(float v) { return {v}; }
template <> __device__ __forceinline__ LogOf<__half> from_acc<LogOf<__half>>(float v) { return {__float2half_rn(v)}; }
template <> __device__ __forceinline__ LogOf<__nv_bfloat16> from_acc<LogOf<__nv_bfloat16>>(float v) {
  return {__float2bfloat16_rn(v)};
}

// The stored value that loads (to_acc) as `v`: the fill of a tile held raw past a sequence's
// end. v itself, or log v for log storage (log 1 = 0, the identity step).
template <typename T, typename Acc>
__device__ __forceinline__ T stored_value(Acc v) {
  if constexpr (kIsLog<T>) return from_acc<T>(logf(v));
  else return from_acc<T>(v);
}

// The gradient a kernel writes for a coefficient of value c (as loaded) whose d/dc is `grad`:
// `grad` itself, or for log storage the gradient of log c, grad * c.
template <typename Tc, typename Acc>
__device__ __forceinline__ Acc coeff_grad(Acc grad, Acc c) {
  if constexpr (kIsLog<Tc>) return grad * c;
  else return grad;
}

}  // namespace linrec

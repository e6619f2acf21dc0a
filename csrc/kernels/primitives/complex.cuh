// Complex storage and arithmetic for the kernels that scan complex64 / complex128
// (every family but pipe): a pair (re, im) laid out as torch lays out its
// complex elements, with the operations the scans use, so that the templates
// written for real accumulators run unchanged. Complex<R> is both the storage
// type and its own accumulator (acc_t).
//
// The backward conjugates: PyTorch's gradient of a complex function is the
// conjugate Wirtinger derivative, so the backward scan runs over conj(c) and
// d_coeffs = d_inputs * conj(outputs one step earlier). `conj` of a real value is
// the value, so real instantiations compile as before.
#pragma once

namespace linrec {

template <typename R>
struct alignas(2 * sizeof(R)) Complex {
  R re, im;
  // Trivial: the kernels keep these in __shared__ arrays, which take no constructors.
  Complex() = default;
  __host__ __device__ constexpr Complex(R real) : re(real), im(0) {}
  __host__ __device__ constexpr Complex(R real, R imag) : re(real), im(imag) {}
};

using ComplexFloat = Complex<float>;
using ComplexDouble = Complex<double>;

template <typename T> inline constexpr bool kIsComplex = false;
template <typename R> inline constexpr bool kIsComplex<Complex<R>> = true;

template <typename R>
__device__ __forceinline__ Complex<R> operator*(Complex<R> a, Complex<R> b) {
  return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}
template <typename R>
__device__ __forceinline__ Complex<R> operator+(Complex<R> a, Complex<R> b) {
  return {a.re + b.re, a.im + b.im};
}
template <typename R>
__device__ __forceinline__ Complex<R>& operator*=(Complex<R>& a, Complex<R> b) {
  return a = a * b;
}

template <typename T>
__device__ __forceinline__ T conj(T v) {
  return v;
}
template <typename R>
__device__ __forceinline__ Complex<R> conj(Complex<R> v) {
  return {v.re, -v.im};
}

// A value read through a volatile reference (the look-back's wide statuses):
// a struct has no copy from volatile, so it is read field by field.
template <typename T>
__device__ __forceinline__ T load_volatile(const volatile T& v) {
  return v;
}
template <typename R>
__device__ __forceinline__ Complex<R> load_volatile(const volatile Complex<R>& v) {
  return {v.re, v.im};
}

// Warp shuffles of a complex value: one per part. The using-declarations keep
// CUDA's own overloads visible beside these in namespace linrec.
using ::__shfl_down_sync;
using ::__shfl_sync;
using ::__shfl_up_sync;
template <typename R>
__device__ __forceinline__ Complex<R> __shfl_sync(unsigned mask, Complex<R> v, int src, int width = 32) {
  return {::__shfl_sync(mask, v.re, src, width), ::__shfl_sync(mask, v.im, src, width)};
}
template <typename R>
__device__ __forceinline__ Complex<R> __shfl_up_sync(unsigned mask, Complex<R> v, unsigned delta, int width = 32) {
  return {::__shfl_up_sync(mask, v.re, delta, width), ::__shfl_up_sync(mask, v.im, delta, width)};
}
template <typename R>
__device__ __forceinline__ Complex<R> __shfl_down_sync(unsigned mask, Complex<R> v, unsigned delta,
                                                       int width = 32) {
  return {::__shfl_down_sync(mask, v.re, delta, width), ::__shfl_down_sync(mask, v.im, delta, width)};
}

}  // namespace linrec

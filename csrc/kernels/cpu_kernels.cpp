// CPU kernels: one sequential pass per sequence, sequences split over threads.
// 16-bit storage types are computed in float32, everything else in its own type.
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include "launch.h"

namespace linrec {
namespace {

template <typename T> struct AccType { using type = T; };
template <> struct AccType<c10::Half> { using type = float; };
template <> struct AccType<c10::BFloat16> { using type = float; };

// Grain: enough sequences per task that the parallel overhead stays small.
int64_t grain_size(int64_t seq_len) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(seq_len, 1)); }

template <typename T>
void fwd(const ForwardParams& p) {
  using Acc = typename AccType<T>::type;
  const auto* x = static_cast<const T*>(p.inputs);
  const auto* c = static_cast<const T*>(p.coeffs);
  const auto* h0 = static_cast<const T*>(p.initial);
  auto* y = static_cast<T*>(p.outputs);
  const int64_t L = p.seq_len;
  const int64_t sx = p.index.elem_strides[kFwdInputs], sc = p.index.elem_strides[kFwdCoeffs],
                sy = p.index.elem_strides[kFwdOutputs];
  torch::stable::parallel_for(0, p.num_seqs, grain_size(L), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      int64_t off[kNumFwdSlots];
      p.index.offsets(n, off);
      Acc state = h0 ? static_cast<Acc>(h0[off[kFwdInitial]]) : Acc(0);
      for (int64_t i = 0; i < L; ++i) {
        const int64_t l = p.reverse ? L - 1 - i : i;
        state = static_cast<Acc>(c[off[kFwdCoeffs] + l * sc]) * state +
                static_cast<Acc>(x[off[kFwdInputs] + l * sx]);
        y[off[kFwdOutputs] + l * sy] = static_cast<T>(state);
      }
    }
  });
}

// Walks each sequence against the forward direction:
//   d_inputs[l]  = coeffs[l+1] * d_inputs[l+1] + d_outputs[l]   (coeffs[L] := 0)
//   d_coeffs[l]  = d_inputs[l] * outputs[l-1]                   (outputs[-1] := initial)
//   d_initial    = d_inputs[0] * coeffs[0]
// with "+1" meaning one step later in the forward direction.
template <typename T>
void bwd(const BackwardParams& p) {
  using Acc = typename AccType<T>::type;
  const auto* dy = static_cast<const T*>(p.d_outputs);
  const auto* c = static_cast<const T*>(p.coeffs);
  const auto* y = static_cast<const T*>(p.outputs);
  const auto* h0 = static_cast<const T*>(p.initial);
  auto* dx = static_cast<T*>(p.d_inputs);
  auto* dc = static_cast<T*>(p.d_coeffs);
  auto* dh0 = static_cast<T*>(p.d_initial);
  const int64_t L = p.seq_len;
  const auto& es = p.index.elem_strides;
  torch::stable::parallel_for(0, p.num_seqs, grain_size(L), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      int64_t off[kNumBwdSlots];
      p.index.offsets(n, off);
      const Acc init = h0 ? static_cast<Acc>(h0[off[kBwdInitial]]) : Acc(0);
      Acc grad = 0;       // d_inputs at the step after this one
      Acc next_coeff = 0; // coeffs at the step after this one
      for (int64_t i = L - 1; i >= 0; --i) {
        const int64_t l = p.reverse ? L - 1 - i : i;
        const int64_t l_prev = p.reverse ? l + 1 : l - 1;
        grad = next_coeff * grad + static_cast<Acc>(dy[off[kBwdDOutputs] + l * es[kBwdDOutputs]]);
        const Acc prev_out = i == 0 ? init : static_cast<Acc>(y[off[kBwdOutputs] + l_prev * es[kBwdOutputs]]);
        dx[off[kBwdDInputs] + l * es[kBwdDInputs]] = static_cast<T>(grad);
        dc[off[kBwdDCoeffs] + l * es[kBwdDCoeffs]] = static_cast<T>(grad * prev_out);
        next_coeff = static_cast<Acc>(c[off[kBwdCoeffs] + l * es[kBwdCoeffs]]);
      }
      dh0[off[kBwdDInitial]] = static_cast<T>(grad * next_coeff);
    }
  });
}

template <template <typename> class Fn, typename P>
void by_dtype(DType dtype, const P& p) {
  switch (dtype) {
    case DType::kFloat32: return Fn<float>::run(p);
    case DType::kFloat64: return Fn<double>::run(p);
    case DType::kFloat16: return Fn<c10::Half>::run(p);
    case DType::kBFloat16: return Fn<c10::BFloat16>::run(p);
  }
}
template <typename T> struct Fwd { static void run(const ForwardParams& p) { fwd<T>(p); } };
template <typename T> struct Bwd { static void run(const BackwardParams& p) { bwd<T>(p); } };

}  // namespace

void cpu_fwd(const ForwardParams& p, DType dtype) { by_dtype<Fwd>(dtype, p); }
void cpu_bwd(const BackwardParams& p, DType dtype) { by_dtype<Bwd>(dtype, p); }

}  // namespace linrec

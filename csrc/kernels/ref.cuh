// The ref kernels: one thread per sequence, walking it step by step (complex
// storage too: the backward conjugates, see complex.cuh).
//
// The correctness baseline, and also the right shape for sequences strided
// along their length (channel-last data): neighbouring threads take
// neighbouring channels, so each step's loads are coalesced across the warp.
#pragma once
#include <optional>

#include "../memio.h"
#include "../params.h"
#include "instances/families.h"
#include "primitives/dtype.cuh"
#include "primitives/grid_launch.cuh"

namespace linrec {

constexpr int kRefThreadsPerBlock = 128;

// This thread's sequence: false past the last one; else, once the grid before has
// finished writing, its element offsets in each tensor of Params.
template <int kSlots, typename Params>
__device__ __forceinline__ bool this_thread_seq(const Params& p, int64_t (&off)[kSlots]) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= p.num_seqs) return false;
  wait_for_prior_grid();
  p.index.offsets(n, off);
  return true;
}

template <typename S>
__global__ void __launch_bounds__(kRefThreadsPerBlock) ref_fwd_kernel(const ForwardParams p) {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  int64_t off[kNumFwdSlots];
  if (!this_thread_seq(p, off)) return;
  const T* __restrict__ x = static_cast<const T*>(p.inputs) + off[kFwdInputs];
  const Tc* __restrict__ c = static_cast<const Tc*>(p.coeffs) + off[kFwdCoeffs];
  T* __restrict__ y = static_cast<T*>(p.outputs) + off[kFwdOutputs];
  const auto& es = p.index.elem_strides;
  const int64_t len = p.seq_len;
  Acc state = p.initial ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kFwdInitial]]) : Acc(0);
  const CutAt cut{p.cuts, len};
#pragma unroll 4
  for (int64_t i = 0; i < len; ++i) {
    const int64_t l = p.reverse ? len - 1 - i : i;
    const Acc coeff = cut(l) ? Acc(0) : to_acc<Acc>(c[l * es[kFwdCoeffs]]);
    state = coeff * state + to_acc<Acc>(x[l * es[kFwdInputs]]);
    y[l * es[kFwdOutputs]] = from_acc<T>(state);
  }
}

template <typename S>
__global__ void __launch_bounds__(kRefThreadsPerBlock) ref_bwd_kernel(const BackwardParams p) {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  int64_t off[kNumBwdSlots];
  if (!this_thread_seq(p, off)) return;
  const T* __restrict__ dy = static_cast<const T*>(p.d_outputs) + off[kBwdDOutputs];
  const Tc* __restrict__ c = static_cast<const Tc*>(p.coeffs) + off[kBwdCoeffs];
  const T* __restrict__ y = static_cast<const T*>(p.outputs) + off[kBwdOutputs];
  T* __restrict__ dx = static_cast<T*>(p.d_inputs) + off[kBwdDInputs];
  Tc* __restrict__ dc = static_cast<Tc*>(p.d_coeffs) + off[kBwdDCoeffs];
  const auto& es = p.index.elem_strides;
  const int64_t len = p.seq_len;
  const Acc initial = p.initial ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kBwdInitial]]) : Acc(0);
  Acc grad = Acc(0), next_coeff = Acc(0);  // d_inputs and conj(coeffs) one forward step later
  const CutAt cut{p.cuts, len};
#pragma unroll 4
  for (int64_t i = len - 1; i >= 0; --i) {
    const int64_t l = p.reverse ? len - 1 - i : i;
    const int64_t l_prev = p.reverse ? l + 1 : l - 1;
    grad = next_coeff * grad + to_acc<Acc>(dy[l * es[kBwdDOutputs]]);
    const Acc prev_out = i == 0 ? initial : to_acc<Acc>(y[l_prev * es[kBwdOutputs]]);
    const bool is_cut = cut(l);
    const Acc coeff = is_cut ? Acc(0) : to_acc<Acc>(c[l * es[kBwdCoeffs]]);
    dx[l * es[kBwdDInputs]] = from_acc<T>(grad);
    dc[l * es[kBwdDCoeffs]] = from_acc<Tc>(is_cut ? Acc(0) : coeff_grad<Tc>(grad * conj(prev_out), coeff));
    next_coeff = conj(coeff);
  }
  static_cast<T*>(p.d_initial)[off[kBwdDInitial]] = from_acc<T>(grad * next_coeff);
}

template <typename S, bool kBackward>
void Family<KernelKind::kRef>::launch(const ParamsOf<kBackward>& p, const TileConfig&, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((p.num_seqs + kRefThreadsPerBlock - 1) / kRefThreadsPerBlock);
  if constexpr (kBackward) launch_kernel<ref_bwd_kernel<S>>(blocks, kRefThreadsPerBlock, 0, stream, p);
  else launch_kernel<ref_fwd_kernel<S>>(blocks, kRefThreadsPerBlock, 0, stream, p);
  check_launch(kBackward ? "linrec_ref_bwd" : "linrec_ref_fwd");
}

template <typename S, bool kBackward>
std::optional<cudaFuncAttributes> Family<KernelKind::kRef>::attributes(const TileConfig&, KernelVariant variant) {
  if (variant != KernelVariant::kGeneral) return std::nullopt;
  if constexpr (kBackward) return kernel_attributes(ref_bwd_kernel<S>);
  else return kernel_attributes(ref_fwd_kernel<S>);
}

}  // namespace linrec

// The packed kernels: many short sequences, several to a warp.
//
// One block per sequence wastes a block on 16 elements: its threads idle and
// the GPU runs through thousands of tiny blocks, each a full chain of load,
// barrier and store latencies. Here a sequence of len <= 32 * E elements is
// held whole by a segment of `width` lanes (the power of two >= len / E), and
// a block of NT threads scans NT / width sequences at once: each thread scans
// its E elements (scan_thread), the segment combines them with shuffles of that
// width (scan_warp), and the state before the sequence enters at the segment's
// first lane. No shared memory and no block barrier. The backward is the fused
// one of tiled.cuh (conjugated for complex storage); its shifted windows never
// leave the segment (shift_segment).
//
// These kernels last a few µs, so what a warp does before its first load shows
// in their time. When every tensor holds its sequences as rows of whole,
// aligned vectors (the usual contiguous (..., L) tensor), the rows kernels run
// instead (rows.cuh): their arguments are a few pointers and strides
// (AlignedRows, two constant-cache lines rather than the index of every
// layout), the host picks the lanes a sequence, and the direction is a
// template argument. No element checks, no run-time direction, no
// element-by-element path: short straight code. (H100, ncu at 13200 x 64
// fp32: the general kernel's warps spent about a third of their samples
// before the first load, in constant-cache and instruction-cache misses and
// index arithmetic.)
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "../dispatch.h"
#include "../memio.h"
#include "../params.h"
#include "instances/families.h"
#include "primitives/grid_launch.cuh"
#include "primitives/rows.cuh"
#include "primitives/scan.cuh"
#include "tiled.cuh"

namespace linrec {

// Lanes per sequence: the power of two 2^shift that holds len elements at E
// per lane. Kernels split threads by shifts, not divisions: the address of a
// short sequence's first load waits on this arithmetic.
template <int E>
__host__ __device__ __forceinline__ int packed_width_shift(int64_t len) {
  int shift = 0;
  while ((static_cast<int64_t>(E) << shift) < len) ++shift;
  return shift;
}

template <int E>
__host__ __device__ __forceinline__ int packed_width(int64_t len) {
  return 1 << packed_width_shift<E>(len);
}

// Scans this thread's E elements of its segment's sequence; `initial` enters
// at the sequence's first step. On return y holds the outputs.
template <int E, typename Acc>
__device__ __forceinline__ void scan_segment(Acc (&y)[E], Acc (&c)[E], bool rev, int width, Acc initial) {
  Acc total_y, total_c, ex_y, ex_c;
  scan_thread(y, c, rev, total_y, total_c);
  scan_warp(total_y, total_c, rev, ex_y, ex_c, width);
  const Acc before_thread = ex_c * initial + ex_y;
#pragma unroll
  for (int i = 0; i < E; ++i) y[i] = c[i] * before_thread + y[i];
}

// A thread's place in the general packed kernels: 2^shift lanes a sequence. Every lane
// takes part in the shuffles; lanes past the last sequence see length 0 (and sequence 0's
// offsets, never read).
template <int E, int NT>
struct PackedLane {
  int width;
  bool active;
  int64_t seq, len, first;
  __device__ __forceinline__ PackedLane(int64_t seq_len, int64_t num_seqs) {
    const int shift = packed_width_shift<E>(seq_len);
    width = 1 << shift;
    const int64_t n = static_cast<int64_t>(blockIdx.x) * (NT >> shift) + (threadIdx.x >> shift);
    active = n < num_seqs;
    seq = active ? n : 0;
    len = active ? seq_len : 0;
    first = static_cast<int64_t>(threadIdx.x & (width - 1)) * E;
  }
};

template <typename S, int E, int NT>
__global__ void __launch_bounds__(NT) packed_fwd_kernel(const ForwardParams p) {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  const PackedLane<E, NT> lane(p.seq_len, p.num_seqs);
  const int64_t len = lane.len, first = lane.first;
  int64_t off[kNumFwdSlots];
  p.index.offsets(lane.seq, off);
  const auto& es = p.index.elem_strides;
  wait_for_prior_grid();
  Acc xs[E], cs[E];
  load_vector(xs, static_cast<const T*>(p.inputs) + off[kFwdInputs], es[kFwdInputs], first, len, Acc(0));
  load_vector(cs, static_cast<const Tc*>(p.coeffs) + off[kFwdCoeffs], es[kFwdCoeffs], first, len, Acc(1));
  zero_cut(cs, CutAt{p.cuts, len}, first);
  const Acc initial =
      p.initial && lane.active ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kFwdInitial]]) : Acc(0);
  scan_segment(xs, cs, p.reverse, lane.width, initial);
  store_vector(static_cast<T*>(p.outputs) + off[kFwdOutputs], es[kFwdOutputs], xs, first, len);
}

template <typename S, int E, int NT>
__global__ void __launch_bounds__(NT) packed_bwd_kernel(const BackwardParams p) {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  const PackedLane<E, NT> lane(p.seq_len, p.num_seqs);
  const int64_t len = lane.len, first = lane.first;
  int64_t off[kNumBwdSlots];
  p.index.offsets(lane.seq, off);
  const auto& es = p.index.elem_strides;
  const bool fwd_rev = p.reverse;
  const int64_t first_step = fwd_rev ? len - 1 : 0;  // the forward direction's first step
  wait_for_prior_grid();
  const Acc initial =
      p.initial && lane.active ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kBwdInitial]]) : Acc(0);

  Acc gs[E], cs[E];
  load_vector(gs, static_cast<const T*>(p.d_outputs) + off[kBwdDOutputs], es[kBwdDOutputs], first, len, Acc(0));
  load_vector(cs, static_cast<const Tc*>(p.coeffs) + off[kBwdCoeffs], es[kBwdCoeffs], first, len, Acc(1));
  Acc first_coeff = Acc(0);  // conj(coeffs[first_step]), if this thread holds it
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (first + i == first_step) first_coeff = conj(cs[i]);
  // d_inputs: the scan against the forward direction, conj(coeffs) one forward step later.
  const CutAt cut{p.cuts, len};
  shift_segment(cs, lane.width, len, Acc(0), /*from_next=*/!fwd_rev);
  zero_cut(cs, cut, first + (fwd_rev ? -1 : 1));  // cs[i] is now the coefficient at first + i +- 1
#pragma unroll
  for (int i = 0; i < E; ++i) cs[i] = conj(cs[i]);
  scan_segment(gs, cs, !fwd_rev, lane.width, Acc(0));
  store_vector(static_cast<T*>(p.d_inputs) + off[kBwdDInputs], es[kBwdDInputs], gs, first, len);
  // d_coeffs = d_inputs * conj(outputs one forward step earlier, the initial state before the first).
  Acc ys[E];
  load_vector(ys, static_cast<const T*>(p.outputs) + off[kBwdOutputs], es[kBwdOutputs], first, len, Acc(0));
  shift_segment(ys, lane.width, len, initial, /*from_next=*/fwd_rev);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if (lane.active && first + i == first_step)
      static_cast<T*>(p.d_initial)[off[kBwdDInitial]] = from_acc<T>(gs[i] * first_coeff);
    ys[i] = gs[i] * conj(ys[i]);
  }
  if constexpr (kIsLog<Tc>) {  // the gradient of log c: times c, read again (cs holds it shifted)
    load_vector(cs, static_cast<const Tc*>(p.coeffs) + off[kBwdCoeffs], es[kBwdCoeffs], first, len, Acc(1));
#pragma unroll
    for (int i = 0; i < E; ++i) ys[i] = coeff_grad<Tc>(ys[i], cs[i]);
  }
  zero_cut(ys, cut, first);
  store_vector(static_cast<Tc*>(p.d_coeffs) + off[kBwdDCoeffs], es[kBwdDCoeffs], ys, first, len);
}

// The forward over aligned rows. A lane past its sequence's end (len < width * E)
// holds identity steps (x = 0, c = 1), so the segment's scan passes through it.
template <typename S, int E, int NT, bool kRev>
__global__ void __launch_bounds__(NT) packed_rows_fwd_kernel(const AlignedRows<kNumFwdSlots> p) {
  using T = values_t<S>;
  using Acc = acc_t<S>;
  const int shift = p.width_shift, width = 1 << shift;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (NT >> shift) + (threadIdx.x >> shift);
  const int first = (threadIdx.x & (width - 1)) * E;
  const bool active = n < p.num_seqs;
  const bool holds = active && first < p.seq_len;  // seq_len is a multiple of E: whole vectors
  Acc xs[E], cs[E];
  load_fwd_row<S>(xs, cs, p, n, first, holds);
  const Acc initial =
      p.data[kFwdInitial] && active ? to_acc<Acc>(*row_of<const T>(p, kFwdInitial, n)) : Acc(0);
  scan_segment(xs, cs, kRev, width, initial);
  if (holds) store_aligned(row_of<T>(p, kFwdOutputs, n) + first, xs);
}

// The fused backward over aligned rows; the same steps as packed_bwd_kernel.
template <typename S, int E, int NT, bool kFwdRev>
__global__ void __launch_bounds__(NT) packed_rows_bwd_kernel(const AlignedRows<kNumBwdSlots> p) {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  const int shift = p.width_shift, width = 1 << shift;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (NT >> shift) + (threadIdx.x >> shift);
  const int first = (threadIdx.x & (width - 1)) * E;
  const bool active = n < p.num_seqs;
  const bool holds = active && first < p.seq_len;
  const int64_t len = active ? p.seq_len : 0;
  const int64_t first_step = kFwdRev ? len - 1 : 0;  // the forward direction's first step
  wait_for_prior_grid();
  const Acc initial =
      p.data[kBwdInitial] && active ? to_acc<Acc>(*row_of<const T>(p, kBwdInitial, n)) : Acc(0);

  Acc gs[E], cs[E], ys[E];
  fill(gs, Acc(0));
  fill(cs, Acc(1));
  fill(ys, Acc(0));
  if (holds) {
    load_aligned(gs, row_of<const T>(p, kBwdDOutputs, n) + first);
    load_aligned(cs, row_of<const Tc>(p, kBwdCoeffs, n) + first);
    load_aligned(ys, row_of<const T>(p, kBwdOutputs, n) + first);
  }
  Acc first_coeff = Acc(0);  // conj(coeffs[first_step]), if this thread holds it
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (first + i == first_step) first_coeff = conj(cs[i]);
  // d_inputs: the scan against the forward direction, conj(coeffs) one forward step later.
  shift_segment(cs, width, len, Acc(0), /*from_next=*/!kFwdRev);
#pragma unroll
  for (int i = 0; i < E; ++i) cs[i] = conj(cs[i]);
  scan_segment(gs, cs, !kFwdRev, width, Acc(0));
  if (holds) store_aligned(row_of<T>(p, kBwdDInputs, n) + first, gs);
  // d_coeffs = d_inputs * conj(outputs one forward step earlier, the initial state before the first).
  shift_segment(ys, width, len, initial, /*from_next=*/kFwdRev);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if (active && first + i == first_step) *row_of<T>(p, kBwdDInitial, n) = from_acc<T>(gs[i] * first_coeff);
    ys[i] = gs[i] * conj(ys[i]);
  }
  if constexpr (kIsLog<Tc>) {  // the gradient of log c: times c, read again (cs holds it shifted)
    if (holds) load_aligned(cs, row_of<const Tc>(p, kBwdCoeffs, n) + first);
#pragma unroll
    for (int i = 0; i < E; ++i) ys[i] = coeff_grad<Tc>(ys[i], cs[i]);
  }
  if (holds) store_aligned(row_of<Tc>(p, kBwdDCoeffs, n) + first, ys);
}

template <typename T, TileConfig C, bool kBackward>
constexpr auto packed_kernel() {
  if constexpr (kBackward) return packed_bwd_kernel<T, C.elems_per_thread, C.threads_per_block>;
  else return packed_fwd_kernel<T, C.elems_per_thread, C.threads_per_block>;
}

template <typename T, TileConfig C, bool kBackward, bool kRev>
constexpr auto packed_rows_kernel() {
  if constexpr (kBackward) return packed_rows_bwd_kernel<T, C.elems_per_thread, C.threads_per_block, kRev>;
  else return packed_rows_fwd_kernel<T, C.elems_per_thread, C.threads_per_block, kRev>;
}

template <typename T, bool kBackward>
void Family<KernelKind::kPacked>::launch(const ParamsOf<kBackward>& p, const TileConfig& config, cudaStream_t stream) {
  const char* name = kBackward ? "linrec_packed_bwd" : "linrec_packed_fwd";
  dispatch_config<configs<T>()>(config, [&]<TileConfig C>() {
    if (p.seq_len > static_cast<int64_t>(kWarpSize) * C.elems_per_thread)
      throw std::invalid_argument(std::string("linrec: ") + name + " holds at most 32 * elems_per_thread elements");
    const int64_t per_block = C.threads_per_block / packed_width<C.elems_per_thread>(p.seq_len);
    const int64_t blocks = (p.num_seqs + per_block - 1) / per_block;
    if (blocks > 0x7fffffff) throw std::runtime_error(std::string("linrec: ") + name + " needs more than 2^31-1 blocks");
    const unsigned grid = static_cast<unsigned>(blocks);
    AlignedRows<kBackward ? int{kNumBwdSlots} : int{kNumFwdSlots}> rows;
    rows.width_shift = packed_width_shift<C.elems_per_thread>(p.seq_len);
    if (!aligned_rows<T, C.elems_per_thread>(p, rows))
      launch_kernel<packed_kernel<T, C, kBackward>()>(grid, C.threads_per_block, 0, stream, p);
    else if (p.reverse)
      launch_kernel<packed_rows_kernel<T, C, kBackward, true>()>(grid, C.threads_per_block, 0, stream, rows);
    else
      launch_kernel<packed_rows_kernel<T, C, kBackward, false>()>(grid, C.threads_per_block, 0, stream, rows);
    check_launch(name);
  }, name);
}

// Attributes of the `variant` kernel for `config`.
template <typename T, bool kBackward>
std::optional<cudaFuncAttributes> Family<KernelKind::kPacked>::attributes(const TileConfig& config,
                                                                          KernelVariant variant) {
  std::optional<cudaFuncAttributes> attrs;
  dispatch_config<configs<T>()>(config, [&]<TileConfig C>() {
    switch (variant) {
      case KernelVariant::kGeneral: attrs = kernel_attributes(packed_kernel<T, C, kBackward>()); return;
      case KernelVariant::kRowsForward: attrs = kernel_attributes(packed_rows_kernel<T, C, kBackward, false>()); return;
      case KernelVariant::kRowsReverse: attrs = kernel_attributes(packed_rows_kernel<T, C, kBackward, true>()); return;
    }
  }, kBackward ? "linrec_packed_bwd" : "linrec_packed_fwd");
  return attrs;
}

}  // namespace linrec

// The aligned-rows fast path shared by the packed kernels and the one-tile
// forward. When every tensor of a call holds its sequences as rows of whole,
// aligned vectors (the usual contiguous (..., L) tensor, L a multiple of E),
// a kernel can take a few pointers and row strides (AlignedRows, params.h)
// instead of the index of every layout, and load each thread's E elements as
// vectors with no element checks and no element-by-element path. The kernels
// are shorter and use fewer registers than their general versions.
#pragma once
#include <array>
#include <cstdint>

#include "../../memio.h"
#include "../../params.h"
#include "grid_launch.cuh"

namespace linrec {

// The row of sequence n in slot t.
template <typename T, int K>
__device__ __forceinline__ T* row_of(const AlignedRows<K>& p, int t, int64_t n) {
  return static_cast<T*>(p.data[t]) + n * p.row_stride[t];
}

template <int E, typename Acc>
__device__ __forceinline__ void fill(Acc (&v)[E], Acc value) {
#pragma unroll
  for (int i = 0; i < E; ++i) v[i] = value;
}

// The forward's loads: this thread's E inputs and coefficients of sequence n from
// element `first`, or identity steps (x = 0, c = 1) where it holds none. Waits for
// the prior grid (grid_launch.cuh) before touching global memory.
template <typename S, int E, typename Acc>
__device__ __forceinline__ void load_fwd_row(Acc (&xs)[E], Acc (&cs)[E], const AlignedRows<kNumFwdSlots>& p,
                                             int64_t n, int first, bool holds) {
  fill(xs, Acc(0));
  fill(cs, Acc(1));
  wait_for_prior_grid();
  if (holds) {
    load_aligned(xs, row_of<const values_t<S>>(p, kFwdInputs, n) + first);
    load_aligned(cs, row_of<const coeffs_t<S>>(p, kFwdCoeffs, n) + first);
  }
}

// Each slot's pointer, whether it holds one state a sequence (no time axis),
// and whether it holds coefficients (coeffs_t of the storage; the rest values_t).
struct SlotData {
  const void* ptr;
  bool state;
  bool coeffs;
};
inline std::array<SlotData, kNumFwdSlots> slot_data(const ForwardParams& p) {
  return {{{p.inputs, false, false}, {p.coeffs, false, true}, {p.outputs, false, false}, {p.initial, true, false}}};
}
inline std::array<SlotData, kNumBwdSlots> slot_data(const BackwardParams& p) {
  return {{{p.d_outputs, false, false}, {p.coeffs, false, true}, {p.outputs, false, false}, {p.initial, true, false},
           {p.d_inputs, false, false}, {p.d_coeffs, false, true}, {p.d_initial, true, false}}};
}

// Fills `rows` (all but width_shift) and returns true when every sequence
// tensor of p holds its sequences as rows of whole vectors of E elements: one
// sequence dim at most, unit element stride, seq_len a multiple of E, rows and
// pointers aligned.
template <typename S, int E, int K, typename Params>
bool aligned_rows(const Params& p, AlignedRows<K>& rows) {
  if (p.index.num_dims > 1 || p.seq_len % E != 0 || p.cuts != nullptr) return false;  // rows kernels cut nothing
  const std::array<SlotData, K> slots = slot_data(p);
  for (int t = 0; t < K; ++t) {
    const int64_t row = p.index.num_dims == 1 ? p.index.seq_strides[t][0] : 0;
    const int64_t elem_bytes = slots[t].coeffs ? sizeof(coeffs_t<S>) : sizeof(values_t<S>);
    const int64_t vec = slots[t].coeffs ? vec_bytes<coeffs_t<S>, E>() : vec_bytes<values_t<S>, E>();
    if (!slots[t].state && (p.index.elem_strides[t] != 1 || row * elem_bytes % vec != 0 ||
                            reinterpret_cast<std::uintptr_t>(slots[t].ptr) % vec != 0))
      return false;
    rows.data[t] = const_cast<void*>(slots[t].ptr);
    rows.row_stride[t] = row;
  }
  rows.num_seqs = p.num_seqs;
  rows.seq_len = p.seq_len;
  return true;
}

}  // namespace linrec

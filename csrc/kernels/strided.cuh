// The strided kernels: sequences strided along their length, such as a
// channel-last (B, T, D) tensor scanned over T, without a transpose.
//
// Lanes run across sequences: the 32 lanes of a warp take 32 consecutive
// sequences (channels), so each time step of a warp is one 128-byte row when
// the channels are contiguous. Time is cut into chunks of W * E steps, and the
// W warps of a block split a chunk into slices of E steps, each thread walking
// its own channel through its slice:
//   1. every thread loads its E steps and folds them into one transform
//      s -> c * s + y (the slice's total);
//   2. warp 0 composes the W slices of each channel into the chunk's total and
//      finds the state before the chunk by a per-thread decoupled look-back
//      over the chunks before it (lookback.cuh), publishing its own;
//   3. it hands every slice its entering state through shared memory, and each
//      thread rescans its E steps (still in registers) and stores them.
// Chunks get their numbers in launch order, chunk-major, so a chunk's
// predecessor in time started before it. The backward is the same scan run
// against the forward direction, as in tiled.cuh: over d_outputs, with the
// coefficients one forward step later, then d_coeffs = d_inputs * outputs
// one forward step earlier (the initial state before the first).
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../dispatch.h"
#include "../params.h"
#include "dtype.cuh"
#include "lookback.cuh"

namespace linrec {

constexpr int kStridedMaxWarps = 32;

template <typename Acc>
struct StridedStorage {
  Acc slice_y[kStridedMaxWarps][kWarpSize];  // each slice's total transform, then its entering state
  Acc slice_c[kStridedMaxWarps][kWarpSize];
};

// Which chunk of which group of 32 sequences a block scans, and the layout of its statuses.
struct StridedWork {
  int64_t chunk, group, padded_seqs, num_chunks;
};

template <int64_t kChunkLen>
__host__ __device__ __forceinline__ StridedWork strided_shape(int64_t num_seqs, int64_t seq_len) {
  const int64_t groups = (num_seqs + kWarpSize - 1) / kWarpSize;
  return {0, 0, groups * kWarpSize, (seq_len + kChunkLen - 1) / kChunkLen};
}

// Steps 2 and 3 for warp 0: look back, then write every slice's entering state
// over its total. `initial` is the state before the sequence.
template <int W, typename Acc>
__device__ __forceinline__ void resolve_slices(StridedStorage<Acc>& st, TileStatus<Acc>* statuses,
                                               const StridedWork& work, Acc initial, bool active) {
  const int lane = threadIdx.x % kWarpSize;
  Acc total_y = Acc(0), total_c = Acc(1);
#pragma unroll
  for (int w = 0; w < W; ++w) {
    total_y = st.slice_c[w][lane] * total_y + st.slice_y[w][lane];
    total_c = st.slice_c[w][lane] * total_c;
  }
  if (!active) return;
  Acc state = look_back_thread(statuses, work.padded_seqs, work.chunk, total_y, total_c, initial);
#pragma unroll
  for (int w = 0; w < W; ++w) {
    const Acc y = st.slice_y[w][lane], c = st.slice_c[w][lane];
    st.slice_y[w][lane] = state;
    state = c * state + y;
  }
}

template <typename T, int E, int NT, bool kBackward, typename Params>
__global__ void __launch_bounds__(NT) strided_kernel(const Params p) {
  using Acc = acc_t<T>;
  constexpr int W = NT / kWarpSize;
  constexpr int64_t kChunkLen = static_cast<int64_t>(W) * E;
  __shared__ StridedStorage<Acc> st;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  StridedWork work = strided_shape<kChunkLen>(p.num_seqs, p.seq_len);
  const int64_t groups = work.padded_seqs / kWarpSize;
  const int64_t number = next_tile_number(p.chain_workspace);
  work.chunk = number / groups;
  work.group = number % groups;
  const int64_t n = work.group * kWarpSize + lane;
  const bool active = n < p.num_seqs;

  constexpr int kSlots = kBackward ? kNumBwdSlots : kNumFwdSlots;
  int64_t off[kSlots];
  p.index.offsets(active ? n : 0, off);
  const auto& es = p.index.elem_strides;
  const int64_t len = p.seq_len;
  // Scan order: step q is element pos(q); the backward runs against the forward direction.
  const bool rev = kBackward ? !p.reverse : p.reverse;
  const int64_t first_q = work.chunk * kChunkLen + static_cast<int64_t>(warp) * E;
  auto pos = [&](int64_t q) { return rev ? len - 1 - q : q; };

  // The scanned values: inputs, or for the backward d_outputs.
  constexpr int kV = kBackward ? int(kBwdDOutputs) : int(kFwdInputs);
  constexpr int kC = kBackward ? int(kBwdCoeffs) : int(kFwdCoeffs);
  const T* v_ptr;
  if constexpr (kBackward) v_ptr = static_cast<const T*>(p.d_outputs) + off[kV];
  else v_ptr = static_cast<const T*>(p.inputs) + off[kV];
  const T* c_ptr = static_cast<const T*>(p.coeffs) + off[kC];
  const int64_t sv = es[kV], sc = es[kC];

  // Step 1. The backward's coefficient at step q is coeffs one forward step
  // later, i.e. at scan step q - 1 (none before the first: its state is zero).
  Acc v[E], a[E];
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int64_t q = first_q + i;
    const int64_t cq = kBackward ? q - 1 : q;
    v[i] = active && q < len ? to_acc<Acc>(v_ptr[pos(q) * sv]) : Acc(0);
    a[i] = active && q < len && cq >= 0 ? to_acc<Acc>(c_ptr[pos(cq) * sc]) : Acc(1);
  }
  Acc slice_y = Acc(0), slice_c = Acc(1);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    slice_y = a[i] * slice_y + v[i];
    slice_c = a[i] * slice_c;
  }
  st.slice_y[warp][lane] = slice_y;
  st.slice_c[warp][lane] = slice_c;
  __syncthreads();

  // Step 2.
  constexpr int kInitial = kBackward ? int(kBwdInitial) : int(kFwdInitial);
  Acc initial = Acc(0);  // the state before the sequence, in the forward direction
  if (p.initial && active) initial = to_acc<Acc>(static_cast<const T*>(p.initial)[off[kInitial]]);
  if (warp == 0) {
    TileStatus<Acc>* statuses = ChainWorkspaceLayout::statuses<Acc>(p.chain_workspace) + n;
    resolve_slices<W>(st, statuses, work, kBackward ? Acc(0) : initial, active);
  }
  __syncthreads();

  // Step 3.
  Acc state = st.slice_y[warp][lane];
#pragma unroll
  for (int i = 0; i < E; ++i) {
    state = a[i] * state + v[i];
    v[i] = state;
  }
  if (!active) return;
  if constexpr (!kBackward) {
    T* y = static_cast<T*>(p.outputs) + off[kFwdOutputs];
#pragma unroll
    for (int i = 0; i < E; ++i)
      if (first_q + i < len) y[pos(first_q + i) * es[kFwdOutputs]] = from_acc<T>(v[i]);
  } else {
    const T* y = static_cast<const T*>(p.outputs) + off[kBwdOutputs];
    T* dx = static_cast<T*>(p.d_inputs) + off[kBwdDInputs];
    T* dc = static_cast<T*>(p.d_coeffs) + off[kBwdDCoeffs];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int64_t q = first_q + i;
      if (q >= len) continue;
      // The forward's previous output is at scan step q + 1; before the forward's first, the initial state.
      const Acc y_prev = q + 1 < len ? to_acc<Acc>(y[pos(q + 1) * es[kBwdOutputs]]) : initial;
      dx[pos(q) * es[kBwdDInputs]] = from_acc<T>(v[i]);
      dc[pos(q) * es[kBwdDCoeffs]] = from_acc<T>(v[i] * y_prev);
      if (q == len - 1)
        static_cast<T*>(p.d_initial)[off[kBwdDInitial]] = from_acc<T>(v[i] * to_acc<Acc>(c_ptr[pos(q) * sc]));
    }
  }
}

template <typename T, TileConfig C, bool kBackward>
constexpr auto strided_kernel_for() {
  if constexpr (kBackward) return strided_kernel<T, C.elems_per_thread, C.threads_per_block, true, BackwardParams>;
  else return strided_kernel<T, C.elems_per_thread, C.threads_per_block, false, ForwardParams>;
}

// Bytes of the strided kernels' zeroed workspace: a chunk counter and one status per (chunk, sequence).
template <typename T>
int64_t strided_workspace_bytes(int64_t num_seqs, int64_t seq_len, const TileConfig& config) {
  const int64_t chunk_len = config.tile_len() / kWarpSize;
  const int64_t groups = (num_seqs + kWarpSize - 1) / kWarpSize;
  return ChainWorkspaceLayout::bytes<acc_t<T>>(groups * kWarpSize * ((seq_len + chunk_len - 1) / chunk_len));
}

template <typename T, bool kBackward, typename Params>
void launch_strided(const Params& p, const TileConfig& config, cudaStream_t stream) {
  const char* name = kBackward ? "linrec_strided_bwd" : "linrec_strided_fwd";
  dispatch_config<STRIDED_CONFIG_LIST>(config, [&]<TileConfig C>() {
    constexpr int64_t kChunkLen = static_cast<int64_t>(C.threads_per_block / kWarpSize) * C.elems_per_thread;
    const StridedWork shape = strided_shape<kChunkLen>(p.num_seqs, p.seq_len);
    const int64_t blocks = shape.padded_seqs / kWarpSize * shape.num_chunks;
    if (blocks > 0x7fffffff) throw std::runtime_error(std::string("linrec: ") + name + " needs more than 2^31-1 blocks");
    if (p.chain_workspace == nullptr) throw std::runtime_error(std::string("linrec: ") + name + " needs a workspace");
    strided_kernel_for<T, C, kBackward>()<<<static_cast<unsigned>(blocks), C.threads_per_block, 0, stream>>>(p);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string("linrec: ") + name + " failed: " + cudaGetErrorString(err));
  }, name);
}

template <typename T, bool kBackward>
cudaFuncAttributes strided_func_attrs(const TileConfig& config) {
  cudaFuncAttributes attrs{};
  dispatch_config<STRIDED_CONFIG_LIST>(config, [&]<TileConfig C>() {
    const cudaError_t err = cudaFuncGetAttributes(&attrs, strided_kernel_for<T, C, kBackward>());
    if (err != cudaSuccess) throw std::runtime_error(std::string("linrec: cudaFuncGetAttributes: ") + cudaGetErrorString(err));
  }, kBackward ? "linrec_strided_bwd" : "linrec_strided_fwd");
  return attrs;
}

#define LINREC_INSTANTIATE_STRIDED(T)                                                                          \
  template void launch_strided<T, false, ForwardParams>(const ForwardParams&, const TileConfig&, cudaStream_t); \
  template void launch_strided<T, true, BackwardParams>(const BackwardParams&, const TileConfig&, cudaStream_t); \
  template cudaFuncAttributes strided_func_attrs<T, false>(const TileConfig&);                                   \
  template cudaFuncAttributes strided_func_attrs<T, true>(const TileConfig&);

}  // namespace linrec

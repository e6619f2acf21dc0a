// The strided kernels: sequences strided along their length, such as a
// channel-last (B, T, D) tensor scanned over T, without a transpose.
//
// Lanes run across sequences: the 32 lanes of a warp take 32 consecutive
// sequences (channels; two each for 16-bit storage), so each time step of a
// warp is one 128-byte row when the channels are contiguous. Time is cut into chunks of W * E steps, and the
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

#include <cstdint>
#include <stdexcept>
#include <string>

#include "../dispatch.h"
#include "../params.h"
#include "dtype.cuh"
#include "lookback.cuh"

namespace linrec {

// Channels per lane: two for 16-bit storage, read and written as one 4-byte
// word where the two channels are neighbours in memory, so a warp's access is a
// 128-byte row as for float32 (with one 2-byte channel a lane, a warp moved
// 64 bytes a request and bf16 ran at 0.36 of copy on an H100).
template <typename T>
constexpr int strided_channels_per_lane() {
  return sizeof(T) == 2 ? 2 : 1;
}

template <typename Acc, int W, int V>
struct StridedStorage {
  Acc slice_y[W][kWarpSize * V];  // each slice's total transform, then its entering state
  Acc slice_c[W][kWarpSize * V];
};

// Which chunk of which group of 32 * V sequences a block scans, and the layout of its statuses.
struct StridedWork {
  int64_t chunk, group, padded_seqs, num_chunks;
};

template <int64_t kChunkLen, int V>
__host__ __device__ __forceinline__ StridedWork strided_shape(int64_t num_seqs, int64_t seq_len) {
  constexpr int64_t kGroup = kWarpSize * V;
  const int64_t groups = (num_seqs + kGroup - 1) / kGroup;
  return {0, 0, groups * kGroup, (seq_len + kChunkLen - 1) / kChunkLen};
}

// Steps 2 and 3 for warp 0, channel j = lane * V + v of the group: look back,
// then write every slice's entering state over its total. `initial` is the
// state before the sequence.
template <int W, int V, typename Acc>
__device__ __forceinline__ void resolve_slices(StridedStorage<Acc, W, V>& st, TileStatus<Acc>* statuses,
                                               const StridedWork& work, int j, Acc initial) {
  Acc total_y = Acc(0), total_c = Acc(1);
#pragma unroll
  for (int w = 0; w < W; ++w) {
    total_y = st.slice_c[w][j] * total_y + st.slice_y[w][j];
    total_c = st.slice_c[w][j] * total_c;
  }
  Acc state = look_back_thread(statuses, work.padded_seqs, work.chunk, total_y, total_c, initial);
#pragma unroll
  for (int w = 0; w < W; ++w) {
    const Acc y = st.slice_y[w][j], c = st.slice_c[w][j];
    st.slice_y[w][j] = state;
    state = c * state + y;
  }
}

// One lane's V channels of one tensor: element `elem` (an offset along the
// sequence) of each is at base + offset[v] + elem. `paired`: the channels are
// neighbours and every such pair is 4-byte aligned, so one word moves both.
template <typename T, int V>
struct LaneChannels {
  int64_t offset[V];
  bool active[V];
  bool paired;

  __device__ __forceinline__ void load(acc_t<T> (&out)[V], const T* base, int64_t elem, bool in_range,
                                       acc_t<T> fill) const {
    if constexpr (V == 2) {
      if (paired && in_range) {
        const unsigned word = *reinterpret_cast<const unsigned*>(base + offset[0] + elem);
        const T* pair = reinterpret_cast<const T*>(&word);
        out[0] = to_acc<acc_t<T>>(pair[0]);
        out[1] = to_acc<acc_t<T>>(pair[1]);
        return;
      }
    }
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = active[v] && in_range ? to_acc<acc_t<T>>(base[offset[v] + elem]) : fill;
  }

  __device__ __forceinline__ void store(T* base, int64_t elem, const acc_t<T> (&vals)[V]) const {
    if constexpr (V == 2) {
      if (paired) {
        unsigned word;
        T* pair = reinterpret_cast<T*>(&word);
        pair[0] = from_acc<T>(vals[0]);
        pair[1] = from_acc<T>(vals[1]);
        *reinterpret_cast<unsigned*>(base + offset[0] + elem) = word;
        return;
      }
    }
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (active[v]) base[offset[v] + elem] = from_acc<T>(vals[v]);
  }
};

// The lane's channels n[v] of tensor `slot`, whose elements lie `elem_stride` apart.
template <typename T, int V, int kSlots>
__device__ __forceinline__ LaneChannels<T, V> lane_channels(const int64_t (&off)[V][kSlots], const bool (&active)[V],
                                                            int slot, const void* base, int64_t elem_stride) {
  LaneChannels<T, V> ch;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    ch.offset[v] = off[v][slot];
    ch.active[v] = active[v];
  }
  ch.paired = false;
  if constexpr (V == 2)
    ch.paired = active[1] && off[1][slot] == off[0][slot] + 1 && elem_stride % 2 == 0 &&
                reinterpret_cast<uintptr_t>(static_cast<const T*>(base) + off[0][slot]) % 4 == 0;
  return ch;
}

template <typename T, int E, int NT, bool kBackward, typename Params>
__global__ void __launch_bounds__(NT) strided_kernel(const Params p) {
  using Acc = acc_t<T>;
  constexpr int V = strided_channels_per_lane<T>();
  constexpr int W = NT / kWarpSize;
  constexpr int64_t kChunkLen = static_cast<int64_t>(W) * E;
  __shared__ StridedStorage<Acc, W, V> st;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  StridedWork work = strided_shape<kChunkLen, V>(p.num_seqs, p.seq_len);
  const int64_t groups = work.padded_seqs / (kWarpSize * V);
  const int64_t number = next_tile_number(p.chain_workspace);
  work.chunk = number / groups;
  work.group = number % groups;

  constexpr int kSlots = kBackward ? kNumBwdSlots : kNumFwdSlots;
  int64_t n[V], off[V][kSlots];
  bool active[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    n[v] = work.group * kWarpSize * V + lane * V + v;
    active[v] = n[v] < p.num_seqs;
    p.index.offsets(active[v] ? n[v] : 0, off[v]);
  }
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
  if constexpr (kBackward) v_ptr = static_cast<const T*>(p.d_outputs);
  else v_ptr = static_cast<const T*>(p.inputs);
  const T* c_ptr = static_cast<const T*>(p.coeffs);
  const LaneChannels<T, V> v_ch = lane_channels<T>(off, active, kV, v_ptr, es[kV]);
  const LaneChannels<T, V> c_ch = lane_channels<T>(off, active, kC, c_ptr, es[kC]);

  // Step 1. The backward's coefficient at step q is coeffs one forward step
  // later, i.e. at scan step q - 1 (none before the first: its state is zero).
  Acc v[E][V], a[E][V];
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int64_t q = first_q + i;
    const int64_t cq = kBackward ? q - 1 : q;
    v_ch.load(v[i], v_ptr, pos(q) * es[kV], q < len, Acc(0));
    c_ch.load(a[i], c_ptr, pos(cq) * es[kC], q < len && cq >= 0, Acc(1));
  }
#pragma unroll
  for (int ch = 0; ch < V; ++ch) {
    Acc slice_y = Acc(0), slice_c = Acc(1);
#pragma unroll
    for (int i = 0; i < E; ++i) {
      slice_y = a[i][ch] * slice_y + v[i][ch];
      slice_c = a[i][ch] * slice_c;
    }
    st.slice_y[warp][lane * V + ch] = slice_y;
    st.slice_c[warp][lane * V + ch] = slice_c;
  }
  __syncthreads();

  // Step 2.
  constexpr int kInitial = kBackward ? int(kBwdInitial) : int(kFwdInitial);
  Acc initial[V];  // the state before each sequence, in the forward direction
#pragma unroll
  for (int ch = 0; ch < V; ++ch)
    initial[ch] = p.initial && active[ch] ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[ch][kInitial]]) : Acc(0);
  if (warp == 0) {
#pragma unroll
    for (int ch = 0; ch < V; ++ch) {
      if (!active[ch]) continue;
      TileStatus<Acc>* statuses = ChainWorkspaceLayout::statuses<Acc>(p.chain_workspace) + n[ch];
      resolve_slices<W, V>(st, statuses, work, lane * V + ch, kBackward ? Acc(0) : initial[ch]);
    }
  }
  __syncthreads();

  // Step 3.
#pragma unroll
  for (int ch = 0; ch < V; ++ch) {
    Acc state = st.slice_y[warp][lane * V + ch];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      state = a[i][ch] * state + v[i][ch];
      v[i][ch] = state;
    }
  }
  if constexpr (!kBackward) {
    T* y = static_cast<T*>(p.outputs);
    const LaneChannels<T, V> y_ch = lane_channels<T>(off, active, kFwdOutputs, y, es[kFwdOutputs]);
#pragma unroll
    for (int i = 0; i < E; ++i)
      if (first_q + i < len) y_ch.store(y, pos(first_q + i) * es[kFwdOutputs], v[i]);
  } else {
    const T* y = static_cast<const T*>(p.outputs);
    T* dx = static_cast<T*>(p.d_inputs);
    T* dc = static_cast<T*>(p.d_coeffs);
    const LaneChannels<T, V> y_ch = lane_channels<T>(off, active, kBwdOutputs, y, es[kBwdOutputs]);
    const LaneChannels<T, V> dx_ch = lane_channels<T>(off, active, kBwdDInputs, dx, es[kBwdDInputs]);
    const LaneChannels<T, V> dc_ch = lane_channels<T>(off, active, kBwdDCoeffs, dc, es[kBwdDCoeffs]);
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int64_t q = first_q + i;
      if (q >= len) continue;
      // The forward's previous output is at scan step q + 1; before the forward's first, the initial state.
      Acc y_prev[V], d_coeffs[V];
      y_ch.load(y_prev, y, pos(q + 1) * es[kBwdOutputs], q + 1 < len, Acc(0));
#pragma unroll
      for (int ch = 0; ch < V; ++ch) d_coeffs[ch] = v[i][ch] * (q + 1 < len ? y_prev[ch] : initial[ch]);
      dx_ch.store(dx, pos(q) * es[kBwdDInputs], v[i]);
      dc_ch.store(dc, pos(q) * es[kBwdDCoeffs], d_coeffs);
      if (q == len - 1) {
#pragma unroll
        for (int ch = 0; ch < V; ++ch)
          if (active[ch])
            static_cast<T*>(p.d_initial)[off[ch][kBwdDInitial]] =
                from_acc<T>(v[i][ch] * to_acc<Acc>(c_ptr[off[ch][kC] + pos(q) * es[kC]]));
      }
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
  constexpr int64_t kGroup = kWarpSize * strided_channels_per_lane<T>();
  const int64_t chunk_len = config.tile_len() / kWarpSize;
  const int64_t groups = (num_seqs + kGroup - 1) / kGroup;
  return ChainWorkspaceLayout::bytes<acc_t<T>>(groups * kGroup * ((seq_len + chunk_len - 1) / chunk_len));
}

template <typename T, bool kBackward, typename Params>
void launch_strided(const Params& p, const TileConfig& config, cudaStream_t stream) {
  const char* name = kBackward ? "linrec_strided_bwd" : "linrec_strided_fwd";
  dispatch_config<STRIDED_CONFIG_LIST>(config, [&]<TileConfig C>() {
    constexpr int64_t kChunkLen = static_cast<int64_t>(C.threads_per_block / kWarpSize) * C.elems_per_thread;
    constexpr int V = strided_channels_per_lane<T>();
    const StridedWork shape = strided_shape<kChunkLen, V>(p.num_seqs, p.seq_len);
    const int64_t blocks = shape.padded_seqs / (kWarpSize * V) * shape.num_chunks;
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

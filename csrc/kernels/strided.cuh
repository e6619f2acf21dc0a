// The strided kernels: sequences strided along their length, such as a
// channel-last (B, T, D) tensor scanned over T, without a transpose.
//
// Lanes run across sequences: the 32 lanes of a warp take 32 consecutive
// sequences (channels), or 64 with two to a lane for 16-bit storage, so each
// time step of a warp is one 128-byte row when the channels are contiguous.
// With fewer sequences than that, G lanes (a power of two) cover them and the
// warp's 32 / G lane groups take consecutive slices of time instead
// (strided_layout), so no lane idles. Time is cut into chunks of W * S * E
// steps, and the W warps of a block, S lane groups each, split a chunk into
// slices of E steps, each thread walking its own channels through its slice:
//   1. every thread loads its E steps and folds them into one transform
//      s -> c * s + y (the slice's total); a warp composes its S slices;
//   2. warp 0 composes the W warps' totals of each channel into the chunk's
//      total and finds the state before the chunk by a per-thread decoupled
//      look-back over the chunks before it (lookback.cuh), publishing its own;
//   3. it hands every warp its entering state through shared memory, each
//      slice composes that with the slices before it in its warp, and each
//      thread rescans its E steps and stores them.
// A thread holds its E steps in registers (strided_kernel, MemCode::kDirect) or
// in shared memory (strided_staged_kernel, MemCode::kStaged), where they cost
// no registers while they load and while the block looks back. Dense rows of a
// few channels are staged a warp's range at a time (strided_flat.cuh);
// strided_launch.cuh picks the kernel for a layout.
// Blocks take chunks in index order, chunk-major, so a chunk's predecessor in
// time started before it. The backward is the same scan run against the
// forward direction, as in tiled.cuh: over d_outputs, with the coefficients one
// forward step later, then d_coeffs = d_inputs * outputs one forward step
// earlier (the initial state before the first); for complex storage over the
// conjugated coefficients, times the conjugated outputs (complex.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../dispatch.h"
#include "../params.h"
#include "primitives/dtype.cuh"
#include "primitives/lookback.cuh"
#include "tiled.cuh"

namespace linrec {

constexpr int kStridedMaxWarps = 32;

// Sequences a lane scans: two adjacent channels for 16-bit storage when the
// layout allows (strided_pairs_channels), so a warp's time step is one 128-byte
// L2 line. With one 2-byte channel a lane a step is 64 bytes, and the H100
// read about 1.5x the needed bytes from DRAM (ncu, (4096, 16384) bf16). Pairs
// alone measured only 1125 -> 1202 GB/s forward there, in registers: those cap
// the bytes in flight. Staged in shared memory, pairs reach 2686 GB/s.
constexpr int kStridedMaxChannelsPerLane = 2;

template <typename Acc, int V>
struct StridedStorage {
  Acc slice_y[kStridedMaxWarps][kWarpSize * V];  // each warp's total transform, then its entering state
  Acc slice_c[kStridedMaxWarps][kWarpSize * V];
};

// V adjacent channels of one time step, read or written as one access.
template <typename T, int V>
struct alignas(sizeof(T) * V) ChannelVec {
  T v[V];
};

template <int V, typename T, typename Acc>
__device__ __forceinline__ void load_channels(Acc (&dst)[V], const T* at) {
  const ChannelVec<T, V> w = *reinterpret_cast<const ChannelVec<T, V>*>(at);
#pragma unroll
  for (int j = 0; j < V; ++j) dst[j] = to_acc<Acc>(w.v[j]);
}

template <int V, typename T, typename Acc>
__device__ __forceinline__ void store_channels(T* at, const Acc (&src)[V]) {
  ChannelVec<T, V> w;
#pragma unroll
  for (int j = 0; j < V; ++j) w.v[j] = from_acc<T>(src[j]);
  *reinterpret_cast<ChannelVec<T, V>*>(at) = w;
}

// One step of a thread's V sequences, coefficients a and values v: folded into
// the slice's transform s -> slice_c * s + slice_y, or applied to the state.
template <int V, typename Acc>
__device__ __forceinline__ void fold_step(Acc (&slice_y)[V], Acc (&slice_c)[V], const Acc (&a)[V], const Acc (&v)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    slice_y[j] = a[j] * slice_y[j] + v[j];
    slice_c[j] = a[j] * slice_c[j];
  }
}

template <int V, typename Acc>
__device__ __forceinline__ void scan_step(Acc (&state)[V], const Acc (&a)[V], const Acc (&v)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) state[j] = a[j] * state[j] + v[j];
}

// The backward scans the conjugated coefficients (the identity for real storage).
template <bool kBackward, int V, typename Acc>
__device__ __forceinline__ void conj_in_backward(Acc (&a)[V]) {
  if constexpr (kBackward) {
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = conj(a[j]);
  }
}

// How a launch splits sequences and time. A warp's lanes take G = channel_lanes
// lanes of V channels across a time step, the fewest (a power of two) that
// cover the sequences, up to 32; its S = 32 / G lane groups take consecutive
// slices of E steps. With 16 bf16 channels and one batch, 8 lanes of channel
// pairs and 4 slices a warp, where one slice a warp left 24 lanes idle.
struct StridedLayout {
  int channel_lanes, slices_per_warp;
  int64_t group_seqs;  // G * V: the sequences a block scans
  int64_t chunk_len;   // W * S * E: the steps a block scans
  int64_t groups, num_chunks;
  // Statuses of consecutive chunks of one sequence lie this far apart.
  __host__ __device__ int64_t padded_seqs() const { return groups * group_seqs; }
};

// The fewest lanes (a power of two, up to 32) whose V channels each cover num_seqs.
__host__ __device__ __forceinline__ int strided_channel_lanes(int64_t num_seqs, int V) {
  int lanes = kWarpSize;
  while (lanes > 1 && static_cast<int64_t>(lanes / 2) * V >= num_seqs) lanes /= 2;
  return lanes;
}

// The layout with `channel_lanes` lanes across the channels: a kernel without
// lane groups passes the constant 32, so its arithmetic folds.
__host__ __device__ __forceinline__ StridedLayout strided_layout(int64_t num_seqs, int64_t seq_len, int warps,
                                                                 int elems_per_thread, int V, int channel_lanes) {
  StridedLayout l;
  l.channel_lanes = channel_lanes;
  l.slices_per_warp = kWarpSize / channel_lanes;
  l.group_seqs = static_cast<int64_t>(channel_lanes) * V;
  l.chunk_len = static_cast<int64_t>(warps) * l.slices_per_warp * elems_per_thread;
  l.groups = (num_seqs + l.group_seqs - 1) / l.group_seqs;
  l.num_chunks = (seq_len + l.chunk_len - 1) / l.chunk_len;
  return l;
}

__host__ __device__ __forceinline__ StridedLayout strided_layout(int64_t num_seqs, int64_t seq_len, int warps,
                                                                 int elems_per_thread, int V) {
  return strided_layout(num_seqs, seq_len, warps, elems_per_thread, V, strided_channel_lanes(num_seqs, V));
}

// One thread's place in a strided launch: its block's chunk, its V sequences and
// their offsets, and its slice of the chunk. Shared by both strided kernels.
template <int E, int NT, int V, bool kBackward, bool kLaneGroups>
struct StridedThread {  // kLaneGroups: strided_layout's slices_per_warp > 1
  static constexpr int W = NT / kWarpSize;
  static constexpr int kSlots = kBackward ? int(kNumBwdSlots) : int(kNumFwdSlots);
  // The scanned values (inputs, or for the backward d_outputs), the coefficients and the initial state.
  static constexpr int kV = kBackward ? int(kBwdDOutputs) : int(kFwdInputs);
  static constexpr int kC = kBackward ? int(kBwdCoeffs) : int(kFwdCoeffs);
  static constexpr int kInitial = kBackward ? int(kBwdInitial) : int(kFwdInitial);

  int64_t chunk;         // the block's chunk of time
  int64_t padded_seqs;   // StridedLayout::padded_seqs(): chunk statuses of a sequence lie this far apart
  int channel_lanes;     // StridedLayout::channel_lanes (32 without lane groups)
  int channel_lane;      // the lane's place across the channels, < channel_lanes
  int64_t n;  // the lane's first sequence; with V = 2 the host made sure num_seqs is even
  bool active;
  int64_t off[V][kSlots];  // the offsets of each of the lane's sequences
  int64_t len, first_q;    // the slice is scan steps first_q + [0, E)
  bool rev;                // scan step q is element len - 1 - q

  // Element of scan step q: the backward runs against the forward direction.
  __device__ __forceinline__ int64_t pos(int64_t q) const { return rev ? len - 1 - q : q; }
};

// Packed sequences: bit i set where the slice's scan step first_q + i - lag is cut. The
// slice's steps are E consecutive positions, read as one run of flags (CutFlags) in
// either direction; a flag a step made every step a load.
template <int E, typename Thread>
__device__ __forceinline__ typename CutFlags<E>::Bits slice_cuts(const Thread& t, CutAt cut, int lag) {
  CutFlags<E> run;
  if (!t.rev) {
    run.load(cut, t.first_q);
  } else {
    run.load(cut, t.len - t.first_q - E);
    run.reverse();
  }
  auto bits = run.bits;
  if (lag) {
    bits <<= 1;
    if (t.first_q >= 1 && cut(t.pos(t.first_q - 1))) bits |= 1u;
  }
  return bits;
}

template <int E, int NT, int V, bool kBackward, bool kLaneGroups, typename Params>
__device__ __forceinline__ StridedThread<E, NT, V, kBackward, kLaneGroups> strided_thread(const Params& p) {
  using Thread = StridedThread<E, NT, V, kBackward, kLaneGroups>;
  Thread t;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const StridedLayout layout = strided_layout(p.num_seqs, p.seq_len, Thread::W, E, V,
                                              kLaneGroups ? strided_channel_lanes(p.num_seqs, V) : kWarpSize);
  // The block index, as in chained_tile: an atomic ticket cost an L2 round trip
  // before a block's first load. H100, python -m tools shape-sweep, µs forward /
  // fwd+bwd: (8, 4096, 2048) bf16 149.9 / 391.0 -> 146.2 / 384.6, (32, 4096, 256)
  // bf16 85.3 / 218.3 -> 82.3 / 211.1, (1, 2^20, 16) fp32 96.5 / 240.2 -> 92.6 / 225.0.
  const int64_t number = blockIdx.x;
  t.chunk = number / layout.groups;
  const int64_t group = number % layout.groups;
  t.padded_seqs = layout.padded_seqs();
  t.channel_lanes = layout.channel_lanes;
  int slice = warp;
  t.channel_lane = lane;
  if constexpr (kLaneGroups) {
    t.channel_lane = lane % layout.channel_lanes;
    slice = warp * layout.slices_per_warp + lane / layout.channel_lanes;
  }
  t.n = group * layout.group_seqs + t.channel_lane * V;
  t.active = t.n < p.num_seqs;
#pragma unroll
  for (int j = 0; j < V; ++j) p.index.template offsets</*kOneDimFastPath=*/false>(t.active ? t.n + j : 0, t.off[j]);
  t.len = p.seq_len;
  t.first_q = t.chunk * layout.chunk_len + static_cast<int64_t>(slice) * E;
  t.rev = kBackward ? !p.reverse : p.reverse;
  return t;
}

// Step 2 for warp 0: the first `channel_lanes` lanes look back, each on its
// own V sequences (channel lane `channel_lane`, whose states before the
// sequences are `initial`), then write every warp's entering state over its
// total. The S lanes of a channel looking back together, each reading a window
// (S x 4 statuses a round trip), measured slower: H100, (1, 2^20, 16) over dim 1,
// forward µs fp32 96.0 -> 122.1, bf16 73.2 -> 83.0 (python -m tools shape-sweep); so
// did the warp's lanes as window slots, one status each (docs/design/0011-strided-few-channels.md).
template <int W, int V, typename Acc>
__device__ __forceinline__ void resolve_warps(StridedStorage<Acc, V>& st, TileStatus<Acc>* statuses,
                                              int64_t padded_seqs, int64_t chunk, int channel_lanes, int channel_lane,
                                              bool active, const Acc (&initial)[V]) {
  // Only the lanes that look back read the totals: a lane of a later lane
  // group reading its channel's totals would race with the write of the
  // entering states below (compute-sanitizer racecheck).
  const int lane = threadIdx.x % kWarpSize;
  if (!active || lane >= channel_lanes) return;
  Acc total_y[V], total_c[V], state[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int ch = channel_lane * V + j;
    total_y[j] = Acc(0);
    total_c[j] = Acc(1);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      total_y[j] = st.slice_c[w][ch] * total_y[j] + st.slice_y[w][ch];
      total_c[j] = st.slice_c[w][ch] * total_c[j];
    }
  }
  look_back_thread<V>(statuses, padded_seqs, chunk, total_y, total_c, initial, state);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int ch = channel_lane * V + j;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const Acc y = st.slice_y[w][ch], c = st.slice_c[w][ch];
      st.slice_y[w][ch] = state[j];
      state[j] = c * state[j] + y;
    }
  }
}

// Steps 1 (its end) and 2 for the whole block: composes each warp's slices,
// lets warp 0 look back, and returns in `state` the state entering the thread's
// slice and in `initial` the state before each of the lane's sequences, in the
// forward direction.
template <typename T, int E, int NT, int V, bool kBackward, bool kLaneGroups, typename Params, typename Acc>
__device__ __forceinline__ void resolve_chunk(StridedStorage<Acc, V>& st, const Params& p,
                                              const StridedThread<E, NT, V, kBackward, kLaneGroups>& t,
                                              const Acc (&slice_y)[V], const Acc (&slice_c)[V], Acc (&initial)[V],
                                              Acc (&state)[V]) {
  using Thread = StridedThread<E, NT, V, kBackward, kLaneGroups>;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int lanes = t.channel_lanes;
  // The warp's S slices of a channel lie `lanes` lanes apart, in time order: an
  // inclusive scan over them leaves the warp's total in its last lane group,
  // and the slices before each lane's (ex_y, ex_c) one group down.
  Acc in_y[V], in_c[V], ex_y[V], ex_c[V];
#pragma unroll
  for (int j = 0; j < V; ++j) in_y[j] = slice_y[j], in_c[j] = slice_c[j], ex_y[j] = Acc(0), ex_c[j] = Acc(1);
  if constexpr (kLaneGroups) {
    for (int delta = lanes; delta < kWarpSize; delta *= 2) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const Acc prev_y = __shfl_up_sync(kFullMask, in_y[j], delta);
        const Acc prev_c = __shfl_up_sync(kFullMask, in_c[j], delta);
        if (lane >= delta) in_y[j] = in_c[j] * prev_y + in_y[j], in_c[j] = in_c[j] * prev_c;
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const Acc prev_y = __shfl_up_sync(kFullMask, in_y[j], lanes);
      const Acc prev_c = __shfl_up_sync(kFullMask, in_c[j], lanes);
      if (lane >= lanes) ex_y[j] = prev_y, ex_c[j] = prev_c;
    }
  }
  if (lane >= kWarpSize - lanes) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      st.slice_y[warp][t.channel_lane * V + j] = in_y[j];
      st.slice_c[warp][t.channel_lane * V + j] = in_c[j];
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < V; ++j)
    initial[j] = p.initial && t.active
                     ? to_acc<Acc>(static_cast<const T*>(p.initial)[t.off[j][Thread::kInitial]])
                     : Acc(0);
  if (warp == 0) {
    TileStatus<Acc>* statuses = ChainWorkspaceLayout::statuses<Acc>(p.chain_workspace) + t.n;
    Acc scan_initial[V];
#pragma unroll
    for (int j = 0; j < V; ++j) scan_initial[j] = kBackward ? Acc(0) : initial[j];
    resolve_warps<Thread::W>(st, statuses, t.padded_seqs, t.chunk, t.channel_lanes, t.channel_lane, t.active,
                             scan_initial);
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < V; ++j) state[j] = ex_c[j] * st.slice_y[warp][t.channel_lane * V + j] + ex_y[j];
}

// The slice held in registers (MemCode::kDirect).
template <typename S, int E, int NT, int V, bool kBackward, bool kLaneGroups, typename Params>
__global__ void __launch_bounds__(NT) strided_kernel(const Params p) {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  using Thread = StridedThread<E, NT, V, kBackward, kLaneGroups>;
  __shared__ StridedStorage<Acc, V> st;
  wait_for_prior_grid();
  const Thread t = strided_thread<E, NT, V, kBackward, kLaneGroups>(p);
  const auto& es = p.index.elem_strides;
  const T* v_ptr;
  if constexpr (kBackward) v_ptr = static_cast<const T*>(p.d_outputs) + t.off[0][Thread::kV];
  else v_ptr = static_cast<const T*>(p.inputs) + t.off[0][Thread::kV];
  const Tc* c_ptr = static_cast<const Tc*>(p.coeffs) + t.off[0][Thread::kC];
  const int64_t sv = es[Thread::kV], sc = es[Thread::kC];
  const CutAt cut{p.cuts, t.len};

  // Step 1. The backward's coefficient at step q is coeffs one forward step
  // later, i.e. at scan step q - 1 (none before the first: its state is zero).
  auto load_slice = [&](Acc (&v)[E][V], Acc (&a)[E][V]) {
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int64_t q = t.first_q + i;
      const int64_t cq = kBackward ? q - 1 : q;
      const bool in = t.active && q < t.len;
#pragma unroll
      for (int j = 0; j < V; ++j) v[i][j] = Acc(0), a[i][j] = Acc(1);
      if (in) load_channels<V>(v[i], v_ptr + t.pos(q) * sv);
      if (in && cq >= 0) load_channels<V>(a[i], c_ptr + t.pos(cq) * sc);
      conj_in_backward<kBackward>(a[i]);
    }
    // Packed sequences: cut steps' coefficients read as 0. A test inside the loop above
    // slowed the loads of every call, cut or not.
    if (p.cuts != nullptr) {
      const auto cuts = slice_cuts<E>(t, cut, kBackward ? 1 : 0);
#pragma unroll
      for (int i = 0; i < E; ++i) {
        if (t.first_q + i < t.len && ((cuts >> i) & 1u)) {
#pragma unroll
          for (int j = 0; j < V; ++j) a[i][j] = Acc(0);
        }
      }
    }
  };
  Acc v[E][V], a[E][V];
  load_slice(v, a);
  Acc slice_y[V], slice_c[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    slice_y[j] = Acc(0), slice_c[j] = Acc(1);
#pragma unroll
    for (int i = 0; i < E; ++i) {
      slice_y[j] = a[i][j] * slice_y[j] + v[i][j];
      slice_c[j] = a[i][j] * slice_c[j];
    }
  }

  // Step 2.
  Acc initial[V], state[V];
  resolve_chunk<T>(st, p, t, slice_y, slice_c, initial, state);

  // Step 3. With 16-bit storage the slice is loaded again (an L2 hit: it was
  // loaded microseconds before) rather than held through the look-back. H100,
  // (4096, 16384) bf16 8x128: 1202 -> 1320 GB/s forward, 1397 -> 1722 backward;
  // float32 loses (16x128: 2818 -> 1803 forward), so it keeps its registers.
  if constexpr (sizeof(T) == 2) load_slice(v, a);
#pragma unroll
  for (int i = 0; i < E; ++i) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      state[j] = a[i][j] * state[j] + v[i][j];
      v[i][j] = state[j];
    }
  }
  if (!t.active) return;
  if constexpr (!kBackward) {
    T* y = static_cast<T*>(p.outputs) + t.off[0][kFwdOutputs];
#pragma unroll
    for (int i = 0; i < E; ++i)
      if (t.first_q + i < t.len) store_channels<V>(y + t.pos(t.first_q + i) * es[kFwdOutputs], v[i]);
  } else {
    // d_coeffs = d_inputs * the forward's previous output: at scan step q + 1,
    // before the forward's first the initial state. Multiplied into `a` (whose
    // coefficients are no longer needed), all loaded before the first store:
    // the compiler may not move a load past a store, and one load a store would
    // wait out the memory latency E times.
    const T* y = static_cast<const T*>(p.outputs) + t.off[0][kBwdOutputs];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int64_t q = t.first_q + i;
      if (q + 1 < t.len) load_channels<V>(a[i], y + t.pos(q + 1) * es[kBwdOutputs]);
#pragma unroll
      for (int j = 0; j < V; ++j) a[i][j] = conj(q + 1 >= t.len ? initial[j] : a[i][j]) * v[i][j];
      if constexpr (kIsLog<Tc>) {  // the gradient of log c: times c at the step itself, read again
        Acc c_here[V];
        if (q < t.len) load_channels<V>(c_here, c_ptr + t.pos(q) * sc);
#pragma unroll
        for (int j = 0; j < V; ++j) a[i][j] = q < t.len ? coeff_grad<Tc>(a[i][j], c_here[j]) : a[i][j];
      }
    }
    if (p.cuts != nullptr) {  // a cut step's coefficient is not used: its gradient is 0
      const auto cuts = slice_cuts<E>(t, cut, 0);
#pragma unroll
      for (int i = 0; i < E; ++i) {
        if (t.first_q + i < t.len && ((cuts >> i) & 1u)) {
#pragma unroll
          for (int j = 0; j < V; ++j) a[i][j] = Acc(0);
        }
      }
    }
    Acc last_coeff[V];
    const bool has_last = t.first_q <= t.len - 1 && t.len - 1 < t.first_q + E;
    if (has_last) load_channels<V>(last_coeff, c_ptr + t.pos(t.len - 1) * sc);
    T* dx = static_cast<T*>(p.d_inputs) + t.off[0][kBwdDInputs];
    Tc* dc = static_cast<Tc*>(p.d_coeffs) + t.off[0][kBwdDCoeffs];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int64_t q = t.first_q + i;
      if (q >= t.len) break;
      store_channels<V>(dx + t.pos(q) * es[kBwdDInputs], v[i]);
      store_channels<V>(dc + t.pos(q) * es[kBwdDCoeffs], a[i]);
      if (q == t.len - 1) {
#pragma unroll
        for (int j = 0; j < V; ++j)
          static_cast<T*>(p.d_initial)[t.off[j][kBwdDInitial]] = from_acc<T>(v[i][j] * conj(last_coeff[j]));
      }
    }
  }
}

// The slice staged in shared memory (MemCode::kStaged). Registers cap the
// register kernel's chunks in flight (bf16 8x128: 76 registers a thread for
// 4 KB a tensor a chunk), and a chunk's life is mostly waiting: its loads,
// then its look-back. Here each thread copies its own steps into its own
// shared-memory slots with cp.async (nothing in registers while they load or
// while the block looks back), folds and rescans from there, and stores each
// step as it is rescanned. Only the thread that wrote a slot reads it, so
// waiting for its own copies is enough: no block barrier for the staging.
// The backward also stages the forward's outputs, in a second group that is
// still in flight while the slice folds and the block looks back.
template <typename T, int V>
struct StagedChannels {
  static constexpr int kBytes = static_cast<int>(sizeof(ChannelVec<T, V>));
  // A tensor's slots take E * NT * kBytes bytes (its region). The slot of step
  // i, thread x: a warp's 32 slots of a step are contiguous.
  template <int E, int NT>
  static constexpr int region_bytes() {
    return E * NT * kBytes;
  }
  template <int E, int NT>
  static __device__ __forceinline__ ChannelVec<T, V>* slot(unsigned char* region, int i) {
    return reinterpret_cast<ChannelVec<T, V>*>(region) + i * NT + threadIdx.x;
  }
  // Copies the V channels at `src` into `dst`, or writes `fill` when !in. Two
  // bytes (one 16-bit channel) are below cp.async's minimum: copied directly.
  static __device__ __forceinline__ void stage(ChannelVec<T, V>* dst, const T* src, bool in, T fill) {
    if (!in) {
#pragma unroll
      for (int j = 0; j < V; ++j) dst->v[j] = fill;
    } else if constexpr (kBytes >= 4) {
      cp_async<kBytes>(dst, src);
    } else {
      *dst = *reinterpret_cast<const ChannelVec<T, V>*>(src);
    }
  }
  template <typename Acc>
  static __device__ __forceinline__ void read(Acc (&dst)[V], const ChannelVec<T, V>* at) {
    const ChannelVec<T, V> w = *at;
#pragma unroll
    for (int j = 0; j < V; ++j) dst[j] = to_acc<Acc>(w.v[j]);
  }
};

// The staged strided kernels' shared memory: regions of the values, the
// coefficients and (backward) the forward's outputs, in that order.
template <typename S, int E, int NT, int V, bool kBackward>
constexpr int strided_staged_smem_bytes() {
  constexpr int values = StagedChannels<values_t<S>, V>::template region_bytes<E, NT>();
  return (kBackward ? 2 : 1) * values + StagedChannels<coeffs_t<S>, V>::template region_bytes<E, NT>();
}

template <typename S, int E, int NT, int V, bool kBackward, bool kLaneGroups, typename Params>
__global__ void __launch_bounds__(NT) strided_staged_kernel(const Params p) {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  using Thread = StridedThread<E, NT, V, kBackward, kLaneGroups>;
  using Staged = StagedChannels<T, V>;
  using StagedC = StagedChannels<Tc, V>;
  __shared__ StridedStorage<Acc, V> st;
  extern __shared__ __align__(16) unsigned char staged[];
  wait_for_prior_grid();
  const Thread t = strided_thread<E, NT, V, kBackward, kLaneGroups>(p);
  const auto& es = p.index.elem_strides;
  unsigned char* const region_c = staged + Staged::template region_bytes<E, NT>();
  unsigned char* const region_y = region_c + StagedC::template region_bytes<E, NT>();
  auto slot_v = [&](int i) { return Staged::template slot<E, NT>(staged, i); };
  auto slot_c = [&](int i) { return StagedC::template slot<E, NT>(region_c, i); };
  auto slot_y = [&](int i) { return Staged::template slot<E, NT>(region_y, i); };
  // Pointers walk the slice one scan step at a time (fully unrolled, 64-bit
  // addresses for every step cost the backward up to 150 registers a thread).
  const int64_t dir = t.rev ? -1 : 1;
  const int64_t sv = dir * es[Thread::kV], sc = dir * es[Thread::kC];
  const T* v_ptr;
  if constexpr (kBackward) v_ptr = static_cast<const T*>(p.d_outputs) + t.off[0][Thread::kV];
  else v_ptr = static_cast<const T*>(p.inputs) + t.off[0][Thread::kV];
  const Tc* c_ptr = static_cast<const Tc*>(p.coeffs) + t.off[0][Thread::kC];
  const CutAt cut{p.cuts, t.len};
  constexpr int kCoeffLag = kBackward ? 1 : 0;
  // Packed sequences: a cut step reads as 0 from its slot, written over the staged value once
  // the copies have landed (each thread its own slots: no barrier), so that the loops below
  // test nothing. `zero` is the coefficient, or (backward) the previous output, read as 0.
  auto cut_slots = [&](auto slot, int lag, auto zero) {
    if (p.cuts == nullptr) return;
    const auto cuts = slice_cuts<E>(t, cut, lag);
    for (int i = 0; i < E; ++i) {
      if (t.first_q + i < t.len && ((cuts >> i) & 1u)) {
#pragma unroll
        for (int j = 0; j < V; ++j) slot(i)->v[j] = zero;
      }
    }
  };

  // Step 1: stage, then fold. The backward's coefficient at step q is at scan
  // step q - 1 (as in strided_kernel), its forward output at q + 1.
  {
    const T* v_at = v_ptr + t.pos(t.first_q) * es[Thread::kV];
    const Tc* c_at = c_ptr + t.pos(t.first_q - kCoeffLag) * es[Thread::kC];
#pragma unroll 4
    for (int i = 0; i < E; ++i, v_at += sv, c_at += sc) {
      const int64_t q = t.first_q + i;
      const bool in = t.active && q < t.len;
      Staged::stage(slot_v(i), v_at, in, from_acc<T>(Acc(0)));
      StagedC::stage(slot_c(i), c_at, in && q >= kCoeffLag, stored_value<Tc>(Acc(1)));
    }
    cp_async_commit();
  }
  if constexpr (kBackward) {
    const int64_t sy = dir * es[kBwdOutputs];
    const T* y_at = static_cast<const T*>(p.outputs) + t.off[0][kBwdOutputs] + t.pos(t.first_q + 1) * es[kBwdOutputs];
#pragma unroll 4
    for (int i = 0; i < E; ++i, y_at += sy)
      Staged::stage(slot_y(i), y_at, t.active && t.first_q + i + 1 < t.len, from_acc<T>(Acc(0)));
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  Acc slice_y[V], slice_c[V];
#pragma unroll
  for (int j = 0; j < V; ++j) slice_y[j] = Acc(0), slice_c[j] = Acc(1);
  cut_slots(slot_c, kCoeffLag, stored_value<Tc>(Acc(0)));
#pragma unroll 4
  for (int i = 0; i < E; ++i) {
    Acc v[V], a[V];
    Staged::read(v, slot_v(i));
    StagedC::read(a, slot_c(i));
    conj_in_backward<kBackward>(a);
    fold_step(slice_y, slice_c, a, v);
  }

  // Step 2.
  Acc initial[V], state[V];
  resolve_chunk<T>(st, p, t, slice_y, slice_c, initial, state);

  // Step 3: rescan, storing each step as it comes.
  if (!t.active) return;
  // The slice's steps inside the sequence (none for a slice past its end).
  const int steps = static_cast<int>(t.len - t.first_q < E ? t.len - t.first_q : E);
  if constexpr (!kBackward) {
    const int64_t so = dir * es[kFwdOutputs];
    T* y_at = static_cast<T*>(p.outputs) + t.off[0][kFwdOutputs] + t.pos(t.first_q) * es[kFwdOutputs];
#pragma unroll 4
    for (int i = 0; i < steps; ++i, y_at += so) {
      Acc v[V], a[V];
      Staged::read(v, slot_v(i));
      StagedC::read(a, slot_c(i));
      scan_step(state, a, v);
      store_channels<V>(y_at, state);
    }
  } else {
    // d_coeffs = d_inputs * the forward's previous output (before the forward's
    // first, the initial state); d_initial = d_inputs * the first coefficient.
    const bool has_last = t.first_q <= t.len - 1 && t.len - 1 < t.first_q + E;
    Acc last_coeff[V];
    if (has_last) load_channels<V>(last_coeff, c_ptr + t.pos(t.len - 1) * es[Thread::kC]);
    const int64_t sx = dir * es[kBwdDInputs], sdc = dir * es[kBwdDCoeffs];
    T* dx_at = static_cast<T*>(p.d_inputs) + t.off[0][kBwdDInputs] + t.pos(t.first_q) * es[kBwdDInputs];
    Tc* dc_at = static_cast<Tc*>(p.d_coeffs) + t.off[0][kBwdDCoeffs] + t.pos(t.first_q) * es[kBwdDCoeffs];
    const Tc* c_here = c_ptr + t.pos(t.first_q) * es[Thread::kC];  // log storage: c at the step itself
    cp_async_wait<0>();
    cut_slots(slot_y, 0, from_acc<T>(Acc(0)));
#pragma unroll 4
    for (int i = 0; i < steps; ++i, dx_at += sx, dc_at += sdc, c_here += sc) {
      Acc v[V], a[V], y_prev[V];
      Staged::read(v, slot_v(i));
      StagedC::read(a, slot_c(i));
      Staged::read(y_prev, slot_y(i));
      const bool last = t.first_q + i == t.len - 1;
      conj_in_backward<kBackward>(a);
      scan_step(state, a, v);
#pragma unroll
      for (int j = 0; j < V; ++j) y_prev[j] = conj(last ? initial[j] : y_prev[j]) * state[j];
      if constexpr (kIsLog<Tc>) {  // the gradient of log c: times c, read again (the slot holds the step before)
        Acc c_now[V];
        load_channels<V>(c_now, c_here);
#pragma unroll
        for (int j = 0; j < V; ++j) y_prev[j] = coeff_grad<Tc>(y_prev[j], c_now[j]);
      }
      store_channels<V>(dx_at, state);
      store_channels<V>(dc_at, y_prev);
    }
    if (has_last) {
      // The last step's d_inputs is the state after the loop.
#pragma unroll
      for (int j = 0; j < V; ++j)
        static_cast<T*>(p.d_initial)[t.off[j][kBwdDInitial]] = from_acc<T>(state[j] * conj(last_coeff[j]));
    }
  }
}

template <typename T, TileConfig C, int V, bool kBackward, bool kLaneGroups>
constexpr auto strided_kernel_for() {
  using Params = std::conditional_t<kBackward, BackwardParams, ForwardParams>;
  if constexpr (C.memcode == MemCode::kStaged)
    return strided_staged_kernel<T, C.elems_per_thread, C.threads_per_block, V, kBackward, kLaneGroups, Params>;
  else
    return strided_kernel<T, C.elems_per_thread, C.threads_per_block, V, kBackward, kLaneGroups, Params>;
}

template <typename T, TileConfig C, int V, bool kBackward>
constexpr int strided_dynamic_smem_bytes() {
  if constexpr (C.memcode == MemCode::kStaged)
    return strided_staged_smem_bytes<T, C.elems_per_thread, C.threads_per_block, V, kBackward>();
  else
    return 0;
}

}  // namespace linrec

// What the selective scan's forward and backward kernels share: the decay exp(dt * A), the
// activations, the warp scan of affine maps, a warp's channel and a lane's dt.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../primitives/grid_launch.cuh"
#include "memory.cuh"

namespace linrec::selective {

constexpr unsigned kFullMask = 0xffffffffu;

constexpr size_t round_up_16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// exp(dt * A) as exp2(dt * A'), A' = A * log2(e) taken once per state: one MUFU.EX2 a step
// and state, the unit the scan is bound by (float64 takes exp).
template <typename Acc> struct Decay;
template <> struct Decay<float> {
  static constexpr float kScale = 1.4426950408889634f;
  __device__ static __forceinline__ float of(float dt, float scaled_A) {
    float out;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(dt * scaled_A));
    return out;
  }
};
template <> struct Decay<double> {
  static constexpr double kScale = 1.0;
  __device__ static __forceinline__ double of(double dt, double A) { return exp(dt * A); }
};

template <typename Acc> __device__ __forceinline__ Acc sigmoid(Acc x) { return Acc(1) / (Acc(1) + exp(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }
// torch's softplus (beta 1, threshold 20).
template <typename Acc> __device__ __forceinline__ Acc softplus(Acc x) { return x > Acc(20) ? x : log1p(exp(x)); }
template <typename Acc> __device__ __forceinline__ Acc silu(Acc z) { return z * sigmoid(z); }

// Keeps v computed once: an empty asm that "changes" it cannot be recomputed.
__device__ __forceinline__ void keep_in_register(float& v) { asm volatile("" : "+f"(v)); }
__device__ __forceinline__ void keep_in_register(double& v) { asm volatile("" : "+d"(v)); }

template <typename Acc> __device__ __forceinline__ Acc warp_sum(Acc x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

// Composes each lane's affine map h -> pa * h + pb with those of the lanes before it (the
// lanes after it, for kBackward): on return pb is the map of lanes 0..lane applied to what
// enters lane 0 (lanes lane..31 to what enters lane 31). pa is clobbered.
template <bool kBackward, typename Acc>
__device__ __forceinline__ void scan_maps(Acc& pa, Acc& pb, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const Acc a_other = kBackward ? __shfl_down_sync(kFullMask, pa, o) : __shfl_up_sync(kFullMask, pa, o);
    const Acc b_other = kBackward ? __shfl_down_sync(kFullMask, pb, o) : __shfl_up_sync(kFullMask, pb, o);
    if (kBackward ? lane + o < 32 : lane >= o) {
      pb = pa * b_other + pb;
      pa = pa * a_other;
    }
  }
}

// The value entering each lane of a warp's chain of maps h -> pa * h + pb, where `carry` enters
// the chain's first lane (lane 0; lane 31 for kBackward) and need only be read there. On return
// pb is the value leaving the lane, as after scan_maps; pa is clobbered.
template <bool kBackward, typename Acc>
__device__ __forceinline__ Acc value_entering_lane(Acc& pa, Acc& pb, Acc carry, int lane) {
  constexpr int kFirst = kBackward ? 31 : 0;
  if (lane == kFirst) pb += pa * carry;
  scan_maps<kBackward>(pa, pb, lane);
  const Acc from_neighbour = kBackward ? __shfl_down_sync(kFullMask, pb, 1) : __shfl_up_sync(kFullMask, pb, 1);
  return lane == kFirst ? carry : from_neighbour;
}

// A warp's channel: the block's kWarps warps take consecutive channels of one batch element.
template <int kWarps>
struct Channel {
  int64_t b, d, row, group;  // row: b * dim + d, the channel's row in the (batch, dim, ...) tensors
  bool active;               // d < dim

  __device__ Channel(const SelectiveParams& p) {
    const int64_t blocks_per_batch = (p.dim + kWarps - 1) / kWarps;
    b = blockIdx.x / blocks_per_batch;
    d = (blockIdx.x % blocks_per_batch) * kWarps + threadIdx.x / 32;
    row = b * p.dim + d;
    active = d < p.dim;
    group = active ? d / (p.dim / p.groups) : 0;
  }
};

// State n's B or C at a lane's steps t0 .. t0+K-1: from the block's tile at `at` where tiled.
template <bool kReverse, bool kTiled, typename T, typename Acc, int K, int kWarps>
__device__ __forceinline__ void load_state(const BCRows<T, Acc>& rows, const T* at, const Channel<kWarps>& ch, int n,
                                           int64_t L, int64_t t0, Acc (&out)[K]) {
  if constexpr (kTiled) BCSource<T, Acc, K, kWarps>::template read_tile<kReverse>(at, out);
  else rows.template load<kReverse>(ch.b, ch.d, ch.group, n, L, t0, out);
}

// Steps t0 .. t0+K-1 of channel d of batch b of a (batch, dim, L) input.
template <bool kReverse, int K, typename V, typename Acc>
__device__ __forceinline__ void load_channel(const void* data, const Strides3& s, int64_t b, int64_t d, int64_t L,
                                             int64_t t0, bool vector, Acc (&out)[K]) {
  load_steps<kReverse>(static_cast<const V*>(data) + b * s.batch + d * s.channel, s.step, L, t0, vector, out);
}

// A lane's dt, dt * u and their sum over its steps. Only these stay in registers across the
// states: the other step inputs load again at the chunk's end, from the cache.
template <typename V, typename Acc, int K>
struct LaneSteps {
  Acc dt[K], dtu[K], dt_sum;

  template <bool kReverse>
  __device__ __forceinline__ void load(const SelectiveParams& p, const VectorRows& vec, int64_t b, int64_t d,
                                       int64_t t0, Acc bias) {
    const int64_t L = p.seq_len;
    Acc u[K];
    load_channel<kReverse, K, V>(p.u, p.u_strides, b, d, L, t0, vec.u, u);
    load_channel<kReverse, K, V>(p.delta, p.delta_strides, b, d, L, t0, vec.delta, dt);
    dt_sum = 0;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const Acc raw = dt[i] + bias;
      // Past the end dt = 0: the state passes through unchanged.
      dt[i] = t0 + i < L ? (p.delta_softplus ? softplus(raw) : raw) : Acc(0);
      dtu[i] = dt[i] * u[i];
      dt_sum += dt[i];
    }
    keep_in_register(dt_sum);  // left to itself, the compiler sums the steps again for every state
  }
};

// Packed sequences (p.cuts): which of a lane's K steps begin a segment in scan order (the
// state entering them is the segment's initial state, or 0) and which end one (the last step,
// or the one before a cut), as bit masks in one register (the backward has none to spare).
// With a state a segment (p.segments), each such step's segment goes in the lane's K slots of
// shared memory: looked up once a chunk, read once a state.
template <int K>
struct LaneCuts {
  static_assert(K <= 16, "two masks of K bits in 32");
  uint32_t marks = 0;  // bit i: step i begins a segment; bit 16 + i: it ends one

  template <bool kReverse>
  __device__ __forceinline__ void load(const SelectiveParams& p, int64_t t0, int32_t* slots) {
    if (!p.cuts) return;
    const int64_t L = p.seq_len;
    const auto cut = [&](int64_t t) { return t < L && p.cuts[position<kReverse>(L, t)] != 0; };
    bool next = cut(t0);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      if (next) marks |= 1u << i;
      next = cut(t0 + i + 1);
      if (t0 + i < L && (next || t0 + i + 1 == L)) marks |= 1u << (16 + i);
    }
    if (!p.segments) return;
#pragma unroll
    for (int i = 0; i < K; ++i)
      if (begins_at(i) || ends_at(i)) slots[i] = segment_at(p, position<kReverse>(L, t0 + i));
  }

  __device__ __forceinline__ bool any_begins() const { return marks & 0xffffu; }
  __device__ __forceinline__ bool begins_at(int i) const { return marks >> i & 1; }
  __device__ __forceinline__ bool ends_at(int i) const { return marks >> (16 + i) & 1; }

  // The segment holding position l: the last k < segments with cu_seqlens[k] <= l (an empty
  // segment starts where the next one does, so the search passes it).
  __device__ static int32_t segment_at(const SelectiveParams& p, int64_t l) {
    int64_t lo = 0, hi = p.segments - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (p.cu_seqlens[mid] <= l) lo = mid;
      else hi = mid - 1;
    }
    return int32_t(lo);
  }
};

// Shared memory for LaneCuts' slots: a warp's, where the call has a state a segment.
template <int K> __host__ __device__ inline size_t segment_slot_bytes(const SelectiveParams& p) {
  return p.segments ? 32 * K * sizeof(int32_t) : 0;
}

// Where a channel's state n of segment k is in initial, last_state and their gradients.
__device__ __forceinline__ int64_t segment_state(const SelectiveParams& p, int64_t row, int32_t k, int n) {
  return (row * p.segments + k) * p.states + n;
}

}  // namespace linrec::selective

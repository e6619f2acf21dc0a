// The fused selective scan (Mamba's S6), forward and backward; the math is in
// csrc/selective_params.h, the design in docs/design/0023-fused-selective-scan.md.
//
// Work plan. A warp owns one channel (b, d) and walks its sequence in chunks of 32 * K
// steps; lane l holds the chunk's steps l*K .. l*K+K-1 in registers (u, dt, dt*u, ...),
// loaded as 16-byte vectors where the rows allow. For each state n in turn:
//   1. each lane turns its K steps into one affine map h -> pa * h + pb
//      (a = exp(dt * A[n]), b = dt * u * B[n]): K exponentials, the unit the scan is bound by;
//   2. the state entering the chunk (shared memory, per state) folds into lane 0's map, and
//      a warp scan of the maps (log2(32) shuffle rounds) gives each lane its entering state;
//   3. each lane replays its K steps from that state and adds C[n] * h into its outputs.
// The chunk's outputs then store as vectors. Nothing of size (batch, dim, N, L) exists: the
// forward keeps only each chunk's state, and saves every kCheckpointSteps-th as a checkpoint.
//
// The backward takes the chunks last to first. For each state it replays the chunk from the
// checkpoint at its start (steps 1-3), then runs the state gradient dh[t] = C[t] * g[t] +
// a[t+1] * dh[t+1] the same way in reverse: lane maps, a reverse warp scan seeded with the
// gradient flowing in from the chunk after, a replay. d_B and d_C of per-step B and C sum
// over channels: the block's warps (channels of one group) add in shared memory, then one
// atomic per step and state goes to the float accumulators; otherwise each warp adds its own.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "../config.h"
#include "../dispatch.h"
#include "../selective_params.h"
#include "primitives/dtype.cuh"
#include "primitives/grid_launch.cuh"

namespace linrec::selective {

constexpr unsigned kFullMask = 0xffffffffu;

// exp(dt * A) as exp2(dt * A'), A' = A * log2(e) taken once per state: one MUFU.EX2 a step
// and state (float64 takes exp).
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

// Steps t0 .. t0+kN-1 of a row along the sequence: position t or L-1-t of `row` (element
// stride `stride`); zero past the end. `vector`: unit stride, and every kN-step run of
// either direction starts 16-byte aligned (the host checked), so whole runs load as vectors.
template <int kN, typename T, typename Acc>
__device__ __forceinline__ void load_steps(const T* row, int64_t stride, int64_t L, int64_t t0, bool reverse,
                                           bool vector, Acc (&out)[kN]) {
  static_assert(kN * sizeof(T) % 16 == 0, "a run is whole 16-byte vectors");
  if (vector && t0 + kN <= L) {
    const int64_t lo = reverse ? L - t0 - kN : t0;
    uint4 raw[kN * sizeof(T) / 16];
    const uint4* src = reinterpret_cast<const uint4*>(row + lo);
#pragma unroll
    for (int i = 0; i < int(kN * sizeof(T) / 16); ++i) raw[i] = __ldg(src + i);
    const T* v = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int s = 0; s < kN; ++s) out[s] = to_acc<Acc>(v[reverse ? kN - 1 - s : s]);
    return;
  }
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    const int64_t t = t0 + s;
    out[s] = t < L ? to_acc<Acc>(row[(reverse ? L - 1 - t : t) * stride]) : Acc(0);
  }
}

// The inverse of load_steps for a contiguous output row; steps past the end are not stored.
template <int kN, typename T, typename Acc>
__device__ __forceinline__ void store_steps(T* row, int64_t L, int64_t t0, bool reverse, bool vector,
                                            const Acc (&in)[kN]) {
  if (vector && t0 + kN <= L) {
    uint4 raw[kN * sizeof(T) / 16];
    T* v = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int s = 0; s < kN; ++s) v[reverse ? kN - 1 - s : s] = from_acc<T>(in[s]);
    uint4* dst = reinterpret_cast<uint4*>(row + (reverse ? L - t0 - kN : t0));
#pragma unroll
    for (int i = 0; i < int(kN * sizeof(T) / 16); ++i) dst[i] = raw[i];
    return;
  }
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    const int64_t t = t0 + s;
    if (t < L) row[reverse ? L - 1 - t : t] = from_acc<T>(in[s]);
  }
}

// Adds in[s] into the float accumulator `row` at step t0 + s, for the steps before the end;
// `vector`: L is a multiple of 4 and t0 of kN, so float runs add as float4 atomics (sm_90).
template <int kN, typename Acc>
__device__ __forceinline__ void add_steps(Acc* row, int64_t L, int64_t t0, bool reverse, bool vector,
                                          const Acc (&in)[kN]) {
  if constexpr (std::is_same_v<Acc, float> && kN % 4 == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (vector && t0 + kN <= L) {
#pragma unroll
      for (int q = 0; q < kN / 4; ++q) {
        const int s = 4 * q;
        const float4 v = reverse ? make_float4(in[s + 3], in[s + 2], in[s + 1], in[s])
                                 : make_float4(in[s], in[s + 1], in[s + 2], in[s + 3]);
        atomicAdd(reinterpret_cast<float4*>(row + (reverse ? L - t0 - s - 4 : t0 + s)), v);
      }
      return;
    }
#endif
  }
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    const int64_t t = t0 + s;
    if (t < L) atomicAdd(row + (reverse ? L - 1 - t : t), in[s]);
  }
}

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

// B or C for one call: per step (batch, groups, N, L) in T, or per channel (dim, N) in Acc.
template <typename T, typename Acc>
struct BCRows {
  const void* data;
  StridesBC strides;
  bool per_step, vector;

  // State n's values at steps t0 .. t0+kN-1 for channel d (group g) of batch b.
  template <int kN>
  __device__ __forceinline__ void load(int64_t b, int64_t d, int64_t g, int64_t n, int64_t L, int64_t t0,
                                       bool reverse, Acc (&out)[kN]) const {
    if (!per_step) {
      const Acc value = static_cast<const Acc*>(data)[d * strides.group + n * strides.state];
#pragma unroll
      for (int s = 0; s < kN; ++s) out[s] = value;  // past the end dt * u = 0 and d_y = 0: no effect
      return;
    }
    const T* row = static_cast<const T*>(data) + b * strides.batch + g * strides.group + n * strides.state;
    load_steps<kN>(row, strides.step, L, t0, reverse, vector, out);
  }
};

// Which rows load and store as 16-byte vectors (the host's checks: bc_rows_vector, steps_vector).
struct VectorRows {
  bool u = false, delta = false, z = false, d_y = false, bc = false;
  bool out = false;  // the contiguous (batch, dim, L) outputs
};

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

// Steps t0 .. t0+K-1 of channel d of batch b of a (batch, dim, L) input.
template <int K, typename V, typename Acc>
__device__ __forceinline__ void load_channel(const void* data, const Strides3& s, int64_t b, int64_t d, int64_t L,
                                             int64_t t0, bool reverse, bool vector, Acc (&out)[K]) {
  load_steps<K>(static_cast<const V*>(data) + b * s.batch + d * s.channel, s.step, L, t0, reverse, vector, out);
}

// A lane's dt and dt * u. Only these stay in registers across the states: the other step
// inputs load again at the chunk's end, from the cache.
template <typename V, typename Acc, int K>
struct LaneSteps {
  Acc dt[K], dtu[K];

  __device__ __forceinline__ void load(const SelectiveParams& p, const VectorRows& vec, int64_t b, int64_t d,
                                       int64_t t0, Acc bias) {
    const int64_t L = p.seq_len;
    Acc u[K];
    load_channel<K, V>(p.u, p.u_strides, b, d, L, t0, p.reverse, vec.u, u);
    load_channel<K, V>(p.delta, p.delta_strides, b, d, L, t0, p.reverse, vec.delta, dt);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const Acc raw = dt[i] + bias;
      // Past the end dt = 0: the state passes through unchanged.
      dt[i] = t0 + i < L ? (p.delta_softplus ? softplus(raw) : raw) : Acc(0);
      dtu[i] = dt[i] * u[i];
    }
  }
};

// ------------------------------------------------------------------------------------------
// Forward

// The forward's register budget: at least this many threads resident on a multiprocessor
// (95 registers at 8 steps a thread, without spills; measured with ptxas -v).
constexpr int kFwdThreadsPerSM = 640;

// Shared memory of a warp: per state, A * log2(e) and the state entering the chunk.
template <typename Acc> constexpr size_t fwd_shared_per_warp(int64_t states) { return 2 * states * sizeof(Acc); }

template <typename V, typename BCT, int K, int kWarps>
__global__ void __launch_bounds__(32 * kWarps, kFwdThreadsPerSM / (32 * kWarps)) selective_fwd_kernel(const SelectiveParams p, VectorRows vec) {
  using Acc = acc_t<V>;
  constexpr int kChunk = 32 * K;
  static_assert(kChunk % kCheckpointSteps == 0, "a chunk starts at a checkpoint");
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  const int64_t N = p.states, L = p.seq_len;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Acc* scaled_A = reinterpret_cast<Acc*>(dynamic_shared) + warp * 2 * N;
  Acc* carry = scaled_A + N;  // the state entering the chunk, read and written by lane 0 alone
  wait_for_prior_grid();
  const Channel<kWarps> ch(p);
  if (!ch.active) return;
  const BCRows<BCT, Acc> Brows{p.B, p.b_strides, p.b_per_step, vec.bc}, Crows{p.C, p.c_strides, p.c_per_step, vec.bc};
  for (int64_t n = lane; n < N; n += 32) {
    scaled_A[n] = static_cast<const Acc*>(p.A)[ch.d * N + n] * Decay<Acc>::kScale;
    carry[n] = p.initial ? static_cast<const Acc*>(p.initial)[ch.row * N + n] : Acc(0);
  }
  __syncwarp();
  const Acc bias = p.delta_bias ? static_cast<const Acc*>(p.delta_bias)[ch.d] : Acc(0);
  const Acc D = p.D ? static_cast<const Acc*>(p.D)[ch.d] : Acc(0);
  Acc* checkpoints = static_cast<Acc*>(p.checkpoints);
  const int64_t num_ckpt = num_checkpoints(L);

  for (int64_t chunk_t0 = 0; chunk_t0 < L; chunk_t0 += kChunk) {
    const int64_t t0 = chunk_t0 + lane * K;  // this lane's first step
    const bool saves_checkpoint = t0 % kCheckpointSteps == 0 && t0 < L;
    LaneSteps<V, Acc, K> s;
    s.load(p, vec, ch.b, ch.d, t0, bias);
    Acc y[K];
#pragma unroll
    for (int i = 0; i < K; ++i) y[i] = 0;
    for (int64_t n = 0; n < N; ++n) {
      Acc Bn[K], Cn[K], a[K], bu[K];
      Brows.template load<K>(ch.b, ch.d, ch.group, n, L, t0, p.reverse, Bn);
      Crows.template load<K>(ch.b, ch.d, ch.group, n, L, t0, p.reverse, Cn);
      const Acc sA = scaled_A[n];
      Acc pa = 1, pb = 0;
#pragma unroll
      for (int i = 0; i < K; ++i) {
        a[i] = Decay<Acc>::of(s.dt[i], sA);
        bu[i] = s.dtu[i] * Bn[i];
        pb = a[i] * pb + bu[i];
        pa *= a[i];
      }
      const Acc entering_chunk = lane == 0 ? carry[n] : Acc(0);
      if (lane == 0) pb += pa * entering_chunk;
      scan_maps<false>(pa, pb, lane);
      Acc h = __shfl_up_sync(kFullMask, pb, 1);
      if (lane == 0) h = entering_chunk;
      if (saves_checkpoint) checkpoints[(ch.row * num_ckpt + t0 / kCheckpointSteps) * N + n] = h;
#pragma unroll
      for (int i = 0; i < K; ++i) {
        h = a[i] * h + bu[i];
        y[i] += Cn[i] * h;
      }
      const Acc leaving_chunk = __shfl_sync(kFullMask, pb, 31);
      if (lane == 0) carry[n] = leaving_chunk;
    }
    Acc u[K], z[K];
    load_channel<K, V>(p.u, p.u_strides, ch.b, ch.d, L, t0, p.reverse, vec.u, u);
    if (p.z) load_channel<K, V>(p.z, p.z_strides, ch.b, ch.d, L, t0, p.reverse, vec.z, z);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      y[i] += D * u[i];
      if (p.z) y[i] *= silu(z[i]);
    }
    store_steps<K>(static_cast<V*>(p.y) + ch.row * L, L, t0, p.reverse, vec.out, y);
  }
  __syncwarp();
  for (int64_t n = lane; n < N; n += 32) static_cast<Acc*>(p.last_state)[ch.row * N + n] = carry[n];
}

// ------------------------------------------------------------------------------------------
// Backward

// Shared memory of the backward: per warp and state, A * log2(e), A, the gradient flowing
// into the chunk from the one after, the chunk's first state, and the sums over steps of the
// gradients of A and of per-channel B and C; then, where the block's warps add their d_B and
// d_C (block_sums), two turns of a [kWarps][2][chunk] tile.
template <typename Acc> constexpr size_t bwd_shared_per_warp(int64_t states) { return 7 * states * sizeof(Acc); }
template <typename Acc, int K, int kWarps> constexpr size_t bwd_tile_bytes() {
  return 2 * kWarps * 2 * 32 * K * sizeof(Acc);
}

template <typename V, typename BCT, int K, int kWarps>
__global__ void __launch_bounds__(32 * kWarps) selective_bwd_kernel(const SelectiveGradParams p, VectorRows vec,
                                                                    bool block_sums) {
  using Acc = acc_t<V>;
  constexpr int kChunk = 32 * K;
  static_assert(kChunk % kCheckpointSteps == 0, "a chunk starts at a checkpoint");
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  const int64_t N = p.states, L = p.seq_len;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Acc* const shared = reinterpret_cast<Acc*>(dynamic_shared);
  Acc* scaled_A = shared + warp * 7 * N;
  Acc* A_raw = scaled_A + N;
  Acc* dh_carry = A_raw + N;     // lane 31 alone
  Acc* chunk_start = dh_carry + N;
  Acc* dA_sum = chunk_start + N;  // lane 0 alone, as the two below
  Acc* dB_sum = dA_sum + N;
  Acc* dC_sum = dB_sum + N;
  Acc* tile = shared + kWarps * 7 * N;  // [turn][warp][B, C][step in chunk]
  wait_for_prior_grid();
  const Channel<kWarps> ch(p);
  if (!ch.active) return;  // block_sums holds only where every warp of a block has a channel
  const BCRows<BCT, Acc> Brows{p.B, p.b_strides, p.b_per_step, vec.bc}, Crows{p.C, p.c_strides, p.c_per_step, vec.bc};
  for (int64_t n = lane; n < N; n += 32) {
    A_raw[n] = static_cast<const Acc*>(p.A)[ch.d * N + n];
    scaled_A[n] = A_raw[n] * Decay<Acc>::kScale;
    dh_carry[n] = p.d_last_state ? static_cast<const Acc*>(p.d_last_state)[ch.row * N + n] : Acc(0);
    dA_sum[n] = dB_sum[n] = dC_sum[n] = 0;
  }
  const Acc bias = p.delta_bias ? static_cast<const Acc*>(p.delta_bias)[ch.d] : Acc(0);
  const Acc D = p.D ? static_cast<const Acc*>(p.D)[ch.d] : Acc(0);
  const Acc* checkpoints = static_cast<const Acc*>(p.checkpoints);
  const int64_t num_ckpt = num_checkpoints(L);
  const int64_t bc_row0 = (ch.b * p.groups + ch.group) * N;  // d_B's, d_C's row of state 0
  Acc dD_part = 0, dbias_part = 0;
  int turn = 0;

  for (int64_t chunk_t0 = (L - 1) / kChunk * kChunk; chunk_t0 >= 0; chunk_t0 -= kChunk) {
    const int64_t t0 = chunk_t0 + lane * K;
    LaneSteps<V, Acc, K> s;
    s.load(p, vec, ch.b, ch.d, t0, bias);
    Acc g[K];  // the gradient of the output before the gate, d_y * silu(z)
    {
      Acc z[K];
      load_channel<K, V>(p.d_y, p.d_y_strides, ch.b, ch.d, L, t0, p.reverse, vec.d_y, g);
      if (p.z) load_channel<K, V>(p.z, p.z_strides, ch.b, ch.d, L, t0, p.reverse, vec.z, z);
#pragma unroll
      for (int i = 0; i < K; ++i) g[i] = p.z ? g[i] * silu(z[i]) : g[i];
    }
    __syncwarp();  // the chunk after has read its first states
    for (int64_t n = lane; n < N; n += 32)
      chunk_start[n] = checkpoints[(ch.row * num_ckpt + chunk_t0 / kCheckpointSteps) * N + n];
    __syncwarp();
    Acc q[K], r[K], y_states[K];  // per step: sum_n dh B, sum_n dh h[t-1] a A, sum_n C h
#pragma unroll
    for (int i = 0; i < K; ++i) q[i] = r[i] = y_states[i] = 0;

    for (int64_t n = 0; n < N; ++n) {
      Acc Bn[K], Cn[K], a[K], h[K];
      Brows.template load<K>(ch.b, ch.d, ch.group, n, L, t0, p.reverse, Bn);
      Crows.template load<K>(ch.b, ch.d, ch.group, n, L, t0, p.reverse, Cn);
      const Acc sA = scaled_A[n], An = A_raw[n];
      // The states, replayed from the chunk's first.
      Acc pa = 1, pb = 0;
#pragma unroll
      for (int i = 0; i < K; ++i) {
        a[i] = Decay<Acc>::of(s.dt[i], sA);
        pb = a[i] * pb + s.dtu[i] * Bn[i];
        pa *= a[i];
      }
      const Acc decay_all = pa;  // this lane's product of a, for the reverse maps
      const Acc first = lane == 0 ? chunk_start[n] : Acc(0);
      if (lane == 0) pb += pa * first;
      scan_maps<false>(pa, pb, lane);
      Acc h_before = __shfl_up_sync(kFullMask, pb, 1);
      if (lane == 0) h_before = first;
      {
        Acc state = h_before;
#pragma unroll
        for (int i = 0; i < K; ++i) h[i] = state = a[i] * state + s.dtu[i] * Bn[i];
      }
      // The state gradients: lane maps cin -> a[0] * dh[0] = decay_all * cin + qb, where cin
      // = a[t+1] * dh[t+1] of the step after the lane's last.
      Acc qb = 0;
#pragma unroll
      for (int i = K - 1; i >= 0; --i) qb = a[i] * (Cn[i] * g[i] + qb);
      Acc qa = decay_all;
      const Acc after = lane == 31 ? dh_carry[n] : Acc(0);
      if (lane == 31) qb += qa * after;
      scan_maps<true>(qa, qb, lane);
      Acc cin = __shfl_down_sync(kFullMask, qb, 1);
      if (lane == 31) cin = after;
      const Acc leaving = __shfl_sync(kFullMask, qb, 0);  // into the chunk before
      if (lane == 31) dh_carry[n] = leaving;

      Acc dA_part = 0, dB_part = 0, dC_part = 0, dB[K], dC[K];
#pragma unroll
      for (int i = K - 1; i >= 0; --i) {
        const Acc dh = Cn[i] * g[i] + cin;
        cin = a[i] * dh;
        q[i] += dh * Bn[i];
        const Acc w = dh * (i > 0 ? h[i - 1] : h_before) * a[i];  // d / d(dt * A) of the decay
        r[i] += w * An;
        dA_part += w * s.dt[i];
        dB[i] = dh * s.dtu[i];
        dC[i] = g[i] * h[i];
        dB_part += dB[i];
        dC_part += dC[i];
        y_states[i] += Cn[i] * h[i];
      }
      dA_part = warp_sum(dA_part);
      if (!p.b_per_step) dB_part = warp_sum(dB_part);
      if (!p.c_per_step) dC_part = warp_sum(dC_part);
      if (lane == 0) {
        dA_sum[n] += dA_part;
        if (!p.b_per_step) dB_sum[n] += dB_part;
        if (!p.c_per_step) dC_sum[n] += dC_part;
      }
      if (!(p.b_per_step || p.c_per_step)) continue;
      Acc* const dB_row = static_cast<Acc*>(p.d_B) + (bc_row0 + n) * L;
      Acc* const dC_row = static_cast<Acc*>(p.d_C) + (bc_row0 + n) * L;
      if (!block_sums) {
        if (p.b_per_step) add_steps<K>(dB_row, L, t0, p.reverse, vec.out, dB);
        if (p.c_per_step) add_steps<K>(dC_row, L, t0, p.reverse, vec.out, dC);
        continue;
      }
      // The block's warps are channels of one group: add their tiles, then once to global memory.
      Acc* const mine = tile + (turn * kWarps + warp) * 2 * kChunk;
#pragma unroll
      for (int i = 0; i < K; ++i) mine[lane * K + i] = dB[i], mine[kChunk + lane * K + i] = dC[i];
      __syncthreads();
      constexpr int kRun = 4;  // steps a thread adds per pass
      for (int run = threadIdx.x; run < 2 * kChunk / kRun; run += 32 * kWarps) {
        const int first_step = run * kRun % kChunk;
        const bool is_C = run * kRun >= kChunk;
        if (is_C ? !p.c_per_step : !p.b_per_step) continue;
        Acc sum[kRun] = {};
        for (int w = 0; w < kWarps; ++w) {
          const Acc* theirs = tile + (turn * kWarps + w) * 2 * kChunk + run * kRun;
#pragma unroll
          for (int k = 0; k < kRun; ++k) sum[k] += theirs[k];
        }
        add_steps<kRun>(is_C ? dC_row : dB_row, L, chunk_t0 + first_step, p.reverse, vec.out, sum);
      }
      turn ^= 1;  // the next state writes the other turn: one barrier a state suffices
    }

    Acc u[K], raw_delta[K], d_y[K], z[K], d_u[K], d_delta[K], d_z[K];
    load_channel<K, V>(p.u, p.u_strides, ch.b, ch.d, L, t0, p.reverse, vec.u, u);
    if (p.delta_softplus) load_channel<K, V>(p.delta, p.delta_strides, ch.b, ch.d, L, t0, p.reverse, vec.delta, raw_delta);
    if (p.z) {
      load_channel<K, V>(p.d_y, p.d_y_strides, ch.b, ch.d, L, t0, p.reverse, vec.d_y, d_y);
      load_channel<K, V>(p.z, p.z_strides, ch.b, ch.d, L, t0, p.reverse, vec.z, z);
    }
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const Acc d_dt = u[i] * q[i] + r[i];
      d_u[i] = D * g[i] + s.dt[i] * q[i];
      d_delta[i] = p.delta_softplus ? d_dt * sigmoid(raw_delta[i] + bias) : d_dt;
      if (p.z) {
        const Acc sz = sigmoid(z[i]);
        d_z[i] = d_y[i] * (y_states[i] + D * u[i]) * sz * (Acc(1) + z[i] * (Acc(1) - sz));
      }
      dD_part += g[i] * u[i];
      if (t0 + i < L) dbias_part += d_delta[i];
    }
    store_steps<K>(static_cast<V*>(p.d_u) + ch.row * L, L, t0, p.reverse, vec.out, d_u);
    store_steps<K>(static_cast<V*>(p.d_delta) + ch.row * L, L, t0, p.reverse, vec.out, d_delta);
    if (p.z) store_steps<K>(static_cast<V*>(p.d_z) + ch.row * L, L, t0, p.reverse, vec.out, d_z);
  }
  // Per channel: the gradient entering the scan, and the sums over the steps.
  __syncwarp();
  for (int64_t n = lane; n < N; n += 32) {
    static_cast<Acc*>(p.d_initial)[ch.row * N + n] = dh_carry[n];
    atomicAdd(static_cast<Acc*>(p.d_A) + ch.d * N + n, dA_sum[n]);
    if (!p.b_per_step) atomicAdd(static_cast<Acc*>(p.d_B) + ch.d * N + n, dB_sum[n]);
    if (!p.c_per_step) atomicAdd(static_cast<Acc*>(p.d_C) + ch.d * N + n, dC_sum[n]);
  }
  dD_part = warp_sum(dD_part);
  dbias_part = warp_sum(dbias_part);
  if (lane == 0) {
    if (p.d_D) atomicAdd(static_cast<Acc*>(p.d_D) + ch.d, dD_part);
    if (p.d_delta_bias) atomicAdd(static_cast<Acc*>(p.d_delta_bias) + ch.d, dbias_part);
  }
}

// ------------------------------------------------------------------------------------------
// Launch

// Whether the rows of a (batch, dim, L) tensor load as 16-byte vectors of K steps: unit
// stride along the sequence, and every run of either direction 16-byte aligned.
inline bool steps_vector(const void* data, const Strides3& s, int64_t L, size_t bytes) {
  return data && s.step == 1 && reinterpret_cast<uintptr_t>(data) % 16 == 0 && (s.batch * bytes) % 16 == 0 &&
         (s.channel * bytes) % 16 == 0 && (L * bytes) % 16 == 0;
}

template <typename V, typename BCT>
VectorRows vector_rows(const SelectiveParams& p) {
  using Acc = acc_t<V>;
  const auto bc_aligned = [&](const void* data, const StridesBC& s, bool per_step) {
    if (!per_step) return true;
    const int64_t bytes = sizeof(BCT);
    return s.step == 1 && reinterpret_cast<uintptr_t>(data) % 16 == 0 && (s.batch * bytes) % 16 == 0 &&
           (s.group * bytes) % 16 == 0 && (s.state * bytes) % 16 == 0 && (p.seq_len * bytes) % 16 == 0;
  };
  VectorRows v;
  v.u = steps_vector(p.u, p.u_strides, p.seq_len, sizeof(V));
  v.delta = steps_vector(p.delta, p.delta_strides, p.seq_len, sizeof(V));
  v.z = steps_vector(p.z, p.z_strides, p.seq_len, sizeof(V));
  v.bc = bc_aligned(p.B, p.b_strides, p.b_per_step) && bc_aligned(p.C, p.c_strides, p.c_per_step);
  // The outputs are contiguous and freshly allocated; the float accumulators need L % 4 == 0.
  v.out = (p.seq_len * sizeof(V)) % 16 == 0 && (p.seq_len * sizeof(Acc)) % 16 == 0;
  return v;
}

// The shared memory a block of the current device may opt in to (0 if the query fails).
inline size_t max_shared_bytes() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();  // answered with 0, not left for the launch check to report
    return 0;
  }
  return size_t(bytes);
}

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* op, int64_t states) {
  if (bytes <= 48 * 1024) return;
  if (bytes > max_shared_bytes() ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) != cudaSuccess) {
    cudaGetLastError();
    throw std::invalid_argument(std::string("linrec: ") + op + " with A's N=" + std::to_string(states) +
                                " states needs " + std::to_string(bytes) +
                                " bytes of shared memory a block, more than this GPU has; use fewer states");
  }
}

template <int kWarps>
int64_t num_blocks(const SelectiveParams& p) {
  return p.batch * ((p.dim + kWarps - 1) / kWarps);
}

template <typename V, typename BCT, SelectiveConfig kConfig>
void launch_fwd(const SelectiveParams& p, cudaStream_t stream) {
  constexpr int K = kConfig.steps_per_thread, kWarps = kConfig.warps;
  const auto kernel = selective_fwd_kernel<V, BCT, K, kWarps>;
  const size_t bytes = kWarps * fwd_shared_per_warp<acc_t<V>>(p.states);
  allow_shared(kernel, bytes, "selective_scan_fwd", p.states);
  kernel<<<num_blocks<kWarps>(p), 32 * kWarps, bytes, stream>>>(p, vector_rows<V, BCT>(p));
  check_launch("selective_scan_fwd");
}

template <typename V, typename BCT, SelectiveConfig kConfig>
void launch_bwd(const SelectiveGradParams& p, cudaStream_t stream) {
  using Acc = acc_t<V>;
  constexpr int K = kConfig.steps_per_thread, kWarps = kConfig.warps;
  const auto kernel = selective_bwd_kernel<V, BCT, K, kWarps>;
  // The block's warps add their d_B and d_C first where they are channels of one group.
  const bool block_sums = (p.b_per_step || p.c_per_step) && (p.dim / p.groups) % kWarps == 0;
  const size_t bytes = kWarps * bwd_shared_per_warp<Acc>(p.states) + (block_sums ? bwd_tile_bytes<Acc, K, kWarps>() : 0);
  allow_shared(kernel, bytes, "selective_scan_bwd", p.states);
  VectorRows vec = vector_rows<V, BCT>(p);
  vec.d_y = steps_vector(p.d_y, p.d_y_strides, p.seq_len, sizeof(V));
  kernel<<<num_blocks<kWarps>(p), 32 * kWarps, bytes, stream>>>(p, vec, block_sums);
  check_launch("selective_scan_bwd");
}

template <bool kBackward>
using SelectiveParamsOf = std::conditional_t<kBackward, SelectiveGradParams, SelectiveParams>;

// The kernels of storage (V, BCT) at the compiled config equal to `config`.
template <typename V, typename BCT, bool kBackward>
void launch(const SelectiveParamsOf<kBackward>& p, const SelectiveConfig& config, cudaStream_t stream) {
  dispatch_config<SELECTIVE_CONFIG_LIST>(
      config,
      [&]<SelectiveConfig kConfig>() {
        if constexpr (kBackward) launch_bwd<V, BCT, kConfig>(p, stream);
        else launch_fwd<V, BCT, kConfig>(p, stream);
      },
      "selective_scan");
}

}  // namespace linrec::selective

// The fused selective scan (Mamba's S6), forward and backward; the math is in
// csrc/selective_params.h, the design in docs/design/0023-fused-selective-scan.md.
//
// Work plan. A thread owns kStates states of one channel (state n = j * kLanes + lane for
// j < kStates) and walks the sequence in scan order; kLanes consecutive lanes share a
// channel, so a warp holds 32 / kLanes channels and a block kWarps times that. Nothing
// waits on another thread for the recurrence: the exponential unit sets the pace.
// The sequence goes in chunks of kLanes steps:
//   1. lane s of a channel loads step s's u and delta (z, d_y), computes dt and dt * u once,
//      and leaves them in its warp's shared memory for the channel's other lanes;
//   2. each lane loads its states' B and C for the chunk (16-byte vectors where rows allow);
//   3. each lane advances its states over the chunk, keeping per step its share of
//      sum_n C * h; one butterfly of log2(kLanes) shuffle rounds leaves lane s with step s's sum;
//   4. lane s finishes step s (D, the gate) and stores it: a channel's lanes store
//      consecutive positions.
// The backward takes the 128-step spans between checkpoints last to first. For a span it
// rescans from the checkpoint to find each chunk's first state (kept in shared memory), then
// takes the chunks last to first: rescans the chunk keeping its states and decays in
// registers, and walks it backward with the state gradient dh. d_B and d_C sum over
// channels: the warp's channels add with shuffles, the warps in a shared-memory tile, and
// the block into the float accumulators in global memory.
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

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFullMask = 0xffffffffu;

// exp(dt * A) as exp2(dt * A'), A' = A * log2(e) taken once per state: one MUFU.EX2 a step
// and state, the operation the forward is bound by (float64 takes exp).
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

// The element of step t0 + s (s < kN) of a row along the sequence, for each s: at position
// t or L-1-t of `row` (element stride `stride`); zero past the end. `vector`: the row is
// unit-stride and 16-byte aligned at every chunk (the host checked), so whole chunks load
// as 16-byte vectors.
template <int kN, typename T, typename Acc>
__device__ __forceinline__ void load_steps(const T* row, int64_t stride, int64_t L, int64_t t0, bool reverse,
                                           bool vector, Acc (&out)[kN]) {
  static_assert(kN * sizeof(T) % 16 == 0, "a chunk is whole 16-byte vectors");
  if (vector && t0 + kN <= L) {
    const int64_t lo = reverse ? L - t0 - kN : t0;
    uint4 raw[kN * sizeof(T) / 16];
    const uint4* src = reinterpret_cast<const uint4*>(row + lo);
#pragma unroll
    for (int i = 0; i < int(kN * sizeof(T) / 16); ++i) raw[i] = __ldg(src + i);
    const T* v = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int s = 0; s < kN; ++s) {
      const Acc fwd = to_acc<Acc>(v[s]), rev = to_acc<Acc>(v[kN - 1 - s]);
      out[s] = reverse ? rev : fwd;
    }
    return;
  }
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    const int64_t t = t0 + s;
    out[s] = t < L ? to_acc<Acc>(row[(reverse ? L - 1 - t : t) * stride]) : Acc(0);
  }
}

// Sums v[s] over the kN lanes of a channel; returns, in lane c of the channel, the sum for
// step c. Each round halves the steps a lane holds: it keeps one half, sends the other.
template <int kN, typename Acc>
__device__ __forceinline__ Acc sum_over_lanes(Acc (&v)[kN], int lane) {
  static_assert(kN >= 2 && kN <= 32 && (kN & (kN - 1)) == 0, "lanes a channel: a power of two");
  constexpr int kRounds = __builtin_ctz(kN);
#pragma unroll
  for (int round = 1; round <= kRounds; ++round) {
    const int half = kN >> round;  // a count the unroller sees, so that v stays in registers
    const bool upper = lane & half;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const Acc send = upper ? v[i] : v[i + half];
      const Acc keep = upper ? v[i + half] : v[i];
      v[i] = keep + __shfl_xor_sync(kFullMask, send, half);
    }
  }
  return v[0];
}

// Sums x over the channels of a warp (lanes lane, lane + kLanes, ...).
template <int kLanes, typename Acc>
__device__ __forceinline__ Acc sum_over_channels(Acc x) {
#pragma unroll
  for (int o = kLanes; o < 32; o *= 2) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

// B or C for one call: per step (batch, groups, N, L) in T, or per channel (dim, N) in Acc.
template <typename T, typename Acc>
struct BCRows {
  const void* data;
  StridesBC strides;
  bool per_step, vector;

  // Step values of state n of channel d (group g) of batch b, for the chunk at t0.
  template <int kN>
  __device__ __forceinline__ void load(int64_t b, int64_t g, int n, int64_t L, int64_t t0, bool reverse,
                                       Acc constant, Acc (&out)[kN]) const {
    if (!per_step) {
#pragma unroll
      for (int s = 0; s < kN; ++s) out[s] = t0 + s < L ? constant : Acc(0);
      return;
    }
    const T* row = static_cast<const T*>(data) + b * strides.batch + g * strides.group + n * strides.state;
    load_steps<kN>(row, strides.step, L, t0, reverse, vector, out);
  }
  __device__ __forceinline__ Acc per_channel(int64_t d, int n) const {
    return per_step ? Acc(0) : static_cast<const Acc*>(data)[d * strides.group + n * strides.state];
  }
};

// What a channel's threads read once: B's and C's rows, A, delta_bias and D.
template <typename BCT, typename Acc>
struct ChannelInputs {
  BCRows<BCT, Acc> B, C;
  const Acc* A;
  Acc bias, D;

  __device__ ChannelInputs(const SelectiveParams& p, int64_t d, bool active, bool bc_vector)
      : B{p.B, p.b_strides, p.b_per_step, bc_vector},
        C{p.C, p.c_strides, p.c_per_step, bc_vector},
        A(static_cast<const Acc*>(p.A)),
        bias(active && p.delta_bias ? static_cast<const Acc*>(p.delta_bias)[d] : Acc(0)),
        D(active && p.D ? static_cast<const Acc*>(p.D)[d] : Acc(0)) {}
};

// Where a thread sits: its batch, channel, lane in the channel and states.
template <int kLanes>
struct Place {
  static constexpr int kChannelsPerWarp = 32 / kLanes;
  static constexpr int kChannelsPerBlock = kChannelsPerWarp * kWarps;
  int64_t b, d, d0, group;
  int64_t row;  // b * dim + d: the channel's row in the (batch, dim, ...) tensors
  int lane, channel_in_warp, warp;
  bool active;  // d < dim: the others run along for the shuffles and barriers, loading and storing nothing

  __device__ Place(const SelectiveParams& p) {
    const int64_t blocks_per_batch = (p.dim + kChannelsPerBlock - 1) / kChannelsPerBlock;
    b = blockIdx.x / blocks_per_batch;
    d0 = (blockIdx.x % blocks_per_batch) * kChannelsPerBlock;
    warp = threadIdx.x / 32;
    channel_in_warp = (threadIdx.x % 32) / kLanes;
    lane = threadIdx.x % kLanes;
    d = d0 + warp * kChannelsPerWarp + channel_in_warp;
    row = b * p.dim + d;
    active = d < p.dim;
    group = active ? d / (p.dim / p.groups) : 0;
  }
};

// One step's per-channel values, loaded by the lane that owns the step. load() only issues
// the loads, so that a chunk's can be in flight while the chunk before computes; prepare()
// then derives dt.
template <typename V, typename Acc>
struct StepValues {
  Acc u = 0, raw_delta = 0, z = 0, dt = 0, dt_grad_scale = 1;
  bool valid = false;
  int64_t pos = 0;

  __device__ __forceinline__ void load(const SelectiveParams& p, int64_t b, int64_t d, bool active, int64_t t) {
    valid = active && t < p.seq_len;
    u = raw_delta = z = 0;  // past the end: zeros, not the values of a step loaded before
    if (!valid) return;
    pos = p.reverse ? p.seq_len - 1 - t : t;
    const auto at = [&](const Strides3& s) { return b * s.batch + d * s.channel + pos * s.step; };
    u = to_acc<Acc>(static_cast<const V*>(p.u)[at(p.u_strides)]);
    raw_delta = to_acc<Acc>(static_cast<const V*>(p.delta)[at(p.delta_strides)]);
    if (p.z) z = to_acc<Acc>(static_cast<const V*>(p.z)[at(p.z_strides)]);
  }
  __device__ __forceinline__ void prepare(bool delta_softplus, Acc bias) {
    if (!valid) return;  // dt = 0: the state passes through unchanged, and adds nothing
    const Acc raw = raw_delta + bias;
    dt = delta_softplus ? softplus(raw) : raw;
    if (delta_softplus) dt_grad_scale = sigmoid(raw);
  }
};

// The backward's: the step's values and its output gradient.
template <typename V, typename Acc>
struct GradStepValues : StepValues<V, Acc> {
  Acc d_y = 0;

  __device__ __forceinline__ void load(const SelectiveGradParams& p, int64_t b, int64_t d, bool active, int64_t t) {
    StepValues<V, Acc>::load(p, b, d, active, t);
    d_y = 0;
    if (!this->valid) return;
    const Strides3& s = p.d_y_strides;
    d_y = to_acc<Acc>(static_cast<const V*>(p.d_y)[b * s.batch + d * s.channel + this->pos * s.step]);
  }
};

template <typename Acc> __device__ __forceinline__ Acc silu(Acc z) { return z * sigmoid(z); }

// ------------------------------------------------------------------------------------------
// Forward
template <typename V, typename BCT, int kLanes, int kStates>
__global__ void __launch_bounds__(kThreads) selective_fwd_kernel(const SelectiveParams p, bool bc_vector) {
  using Acc = acc_t<V>;
  using P = Place<kLanes>;
  __shared__ __align__(16) Acc shared_dt[kWarps][P::kChannelsPerWarp][kLanes];
  __shared__ __align__(16) Acc shared_dtu[kWarps][P::kChannelsPerWarp][kLanes];
  wait_for_prior_grid();
  const P at(p);
  const int64_t L = p.seq_len, N = p.states;
  const ChannelInputs<BCT, Acc> in(p, at.d, at.active, bc_vector);
  const auto& [Brows, Crows, A, bias, Dd] = in;

  Acc h[kStates], scaled_A[kStates], B_const[kStates], C_const[kStates];
#pragma unroll
  for (int j = 0; j < kStates; ++j) {
    const int n = j * kLanes + at.lane;
    const bool real = at.active && n < N;
    scaled_A[j] = real ? A[at.d * N + n] * Decay<Acc>::kScale : Acc(0);
    h[j] = real && p.initial ? static_cast<const Acc*>(p.initial)[at.row * N + n] : Acc(0);
    B_const[j] = real ? Brows.per_channel(at.d, n) : Acc(0);
    C_const[j] = real ? Crows.per_channel(at.d, n) : Acc(0);
  }
  Acc* checkpoints = static_cast<Acc*>(p.checkpoints);
  const int64_t num_ckpt = num_checkpoints(L);
  // Where a lane's B and C of a chunk fit in a few registers, the next chunk's load while this
  // one computes, as do the per-step values; otherwise B and C load at the start of their state.
  constexpr bool kPrefetchBC = kStates * kLanes <= 16;
  const auto load_bc = [&](int j, int64_t t0, Acc (&Bs)[kLanes], Acc (&Cs)[kLanes]) {
    const int n = min(j * kLanes + at.lane, int(N) - 1);  // past N: any real row; B = C = 0 below
    Brows.template load<kLanes>(at.b, at.group, n, L, t0, p.reverse, B_const[j], Bs);
    Crows.template load<kLanes>(at.b, at.group, n, L, t0, p.reverse, C_const[j], Cs);
    if (j * kLanes + at.lane >= N) {
#pragma unroll
      for (int s = 0; s < kLanes; ++s) Bs[s] = Cs[s] = 0;
    }
  };
  StepValues<V, Acc> next;
  Acc next_B[kPrefetchBC ? kStates : 1][kLanes], next_C[kPrefetchBC ? kStates : 1][kLanes];
  next.load(p, at.b, at.d, at.active, at.lane);
  if constexpr (kPrefetchBC) {
#pragma unroll
    for (int j = 0; j < kStates; ++j) load_bc(j, 0, next_B[j], next_C[j]);
  }

  for (int64_t t0 = 0; t0 < L; t0 += kLanes) {
    StepValues<V, Acc> step = next;
    Acc chunk_B[kPrefetchBC ? kStates : 1][kLanes], chunk_C[kPrefetchBC ? kStates : 1][kLanes];
    if constexpr (kPrefetchBC) {
#pragma unroll
      for (int j = 0; j < kStates; ++j)
#pragma unroll
        for (int s = 0; s < kLanes; ++s) chunk_B[j][s] = next_B[j][s], chunk_C[j][s] = next_C[j][s];
    }
    if (t0 + kLanes < L) {
      next.load(p, at.b, at.d, at.active, t0 + kLanes + at.lane);
      if constexpr (kPrefetchBC) {
#pragma unroll
        for (int j = 0; j < kStates; ++j) load_bc(j, t0 + kLanes, next_B[j], next_C[j]);
      }
    }
    step.prepare(p.delta_softplus, bias);
    __syncwarp();  // the chunk before has read the shared steps
    shared_dt[at.warp][at.channel_in_warp][at.lane] = step.dt;
    shared_dtu[at.warp][at.channel_in_warp][at.lane] = step.dt * step.u;
    __syncwarp();
    Acc dt[kLanes], dtu[kLanes];
#pragma unroll
    for (int s = 0; s < kLanes; ++s) {
      dt[s] = shared_dt[at.warp][at.channel_in_warp][s];
      dtu[s] = shared_dtu[at.warp][at.channel_in_warp][s];
    }
    if (t0 % kCheckpointSteps == 0 && at.active) {
#pragma unroll
      for (int j = 0; j < kStates; ++j) {
        const int n = j * kLanes + at.lane;
        if (n < N) checkpoints[(at.row * num_ckpt + t0 / kCheckpointSteps) * N + n] = h[j];
      }
    }
    Acc y[kLanes];
#pragma unroll
    for (int s = 0; s < kLanes; ++s) y[s] = 0;
#pragma unroll
    for (int j = 0; j < kStates; ++j) {
      Acc Bs[kLanes], Cs[kLanes];
      if constexpr (kPrefetchBC) {
#pragma unroll
        for (int s = 0; s < kLanes; ++s) Bs[s] = chunk_B[j][s], Cs[s] = chunk_C[j][s];
      } else {
        load_bc(j, t0, Bs, Cs);
      }
#pragma unroll
      for (int s = 0; s < kLanes; ++s) {
        const Acc a = Decay<Acc>::of(dt[s], scaled_A[j]);
        h[j] = a * h[j] + dtu[s] * Bs[s];
        y[s] += Cs[s] * h[j];
      }
    }
    const Acc sum = sum_over_lanes<kLanes>(y, at.lane);
    if (step.valid) {
      Acc out = sum + Dd * step.u;
      if (p.z) out *= silu(step.z);
      static_cast<V*>(p.y)[at.row * L + step.pos] = from_acc<V>(out);
    }
  }
  if (at.active) {
#pragma unroll
    for (int j = 0; j < kStates; ++j) {
      const int n = j * kLanes + at.lane;
      if (n < N) static_cast<Acc*>(p.last_state)[at.row * N + n] = h[j];
    }
  }
}

// ------------------------------------------------------------------------------------------
// Backward
template <int kLanes, int kStates>
struct BwdShared {
  static constexpr int kChunksPerSpan = kCheckpointSteps / kLanes;
  static constexpr int kMaxStates = kLanes * kStates;
  static constexpr int kTileSlots = 2;  // a block's channels lie in at most 2 groups where groups hold >= its channels
};

template <typename V, typename BCT, int kLanes, int kStates>
__global__ void __launch_bounds__(kThreads) selective_bwd_kernel(const SelectiveGradParams p, bool bc_vector,
                                                                 bool use_tile) {
  using Acc = acc_t<V>;
  using P = Place<kLanes>;
  using S = BwdShared<kLanes, kStates>;
  __shared__ __align__(16) Acc shared_dt[kWarps][P::kChannelsPerWarp][kLanes];
  __shared__ __align__(16) Acc shared_dtu[kWarps][P::kChannelsPerWarp][kLanes];
  __shared__ __align__(16) Acc shared_g[kWarps][P::kChannelsPerWarp][kLanes];
  // Dynamic: each chunk's first states in the span [chunk][j][thread], then the d_B and d_C
  // tiles [slot][n][step] (only where use_tile).
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  Acc* chunk_starts = reinterpret_cast<Acc*>(dynamic_shared);
  Acc* tile_B = chunk_starts + S::kChunksPerSpan * kStates * kThreads;
  Acc* tile_C = tile_B + S::kTileSlots * S::kMaxStates * kLanes;
  constexpr int kTileSize = S::kTileSlots * S::kMaxStates * kLanes;

  wait_for_prior_grid();
  const P at(p);
  const int64_t L = p.seq_len, N = p.states;
  const ChannelInputs<BCT, Acc> in(p, at.d, at.active, bc_vector);
  const auto& [Brows, Crows, A, bias, Dd] = in;
  const int64_t channels_per_group = p.dim / p.groups;
  const int64_t first_group = at.d0 / channels_per_group;
  // Whether the warp's channels share a group, so that their d_B, d_C add before the atomics.
  // (Lane 0's group read by every lane first: a shuffle inside the || would leave out the lanes
  // past dim, and the warp would wait for them forever.)
  const int64_t lane0_group = __shfl_sync(kFullMask, at.group, 0);
  const bool warp_one_group = __all_sync(kFullMask, !at.active || at.group == lane0_group);

  Acc scaled_A[kStates], A_raw[kStates], B_const[kStates], C_const[kStates];
  Acc dh_carry[kStates], dA_sum[kStates], dB_sum[kStates], dC_sum[kStates];
#pragma unroll
  for (int j = 0; j < kStates; ++j) {
    const int n = j * kLanes + at.lane;
    const bool real = at.active && n < N;
    A_raw[j] = real ? A[at.d * N + n] : Acc(0);
    scaled_A[j] = A_raw[j] * Decay<Acc>::kScale;
    B_const[j] = real ? Brows.per_channel(at.d, n) : Acc(0);
    C_const[j] = real ? Crows.per_channel(at.d, n) : Acc(0);
    dh_carry[j] = real && p.d_last_state ? static_cast<const Acc*>(p.d_last_state)[at.row * N + n] : Acc(0);
    dA_sum[j] = dB_sum[j] = dC_sum[j] = 0;
  }
  if (use_tile) {
    for (int i = threadIdx.x; i < 2 * kTileSize; i += kThreads) tile_B[i] = 0;  // tile_C follows tile_B
    __syncthreads();
  }
  Acc dD_sum = 0, dbias_sum = 0;
  const Acc* checkpoints = static_cast<const Acc*>(p.checkpoints);
  const int64_t num_ckpt = num_checkpoints(L);
  const auto chunk_start = [&](int c, int j) -> Acc& { return chunk_starts[(c * kStates + j) * kThreads + threadIdx.x]; };

  for (int64_t span = num_ckpt - 1; span >= 0; --span) {
    const int64_t span_t0 = span * kCheckpointSteps;
    const int chunks = int((min(L - span_t0, kCheckpointSteps) + kLanes - 1) / kLanes);
    // Each chunk's first state, rescanned from the checkpoint.
    {
      Acc h[kStates];
#pragma unroll
      for (int j = 0; j < kStates; ++j) {
        const int n = j * kLanes + at.lane;
        h[j] = at.active && n < N ? checkpoints[(at.row * num_ckpt + span) * N + n] : Acc(0);
      }
      StepValues<V, Acc> next;  // the next chunk's, in flight while one computes
      next.load(p, at.b, at.d, at.active, span_t0 + at.lane);
      for (int c = 0; c < chunks; ++c) {
#pragma unroll
        for (int j = 0; j < kStates; ++j) chunk_start(c, j) = h[j];
        if (c == chunks - 1) break;
        const int64_t t0 = span_t0 + c * kLanes;
        StepValues<V, Acc> step = next;
        if (c + 2 < chunks) next.load(p, at.b, at.d, at.active, t0 + kLanes + at.lane);
        step.prepare(p.delta_softplus, bias);
        __syncwarp();
        shared_dt[at.warp][at.channel_in_warp][at.lane] = step.dt;
        shared_dtu[at.warp][at.channel_in_warp][at.lane] = step.dt * step.u;
        __syncwarp();
#pragma unroll
        for (int j = 0; j < kStates; ++j) {
          const int n = min(j * kLanes + at.lane, int(N) - 1);
          const bool real = j * kLanes + at.lane < N;
          Acc Bs[kLanes];
          Brows.template load<kLanes>(at.b, at.group, n, L, t0, p.reverse, B_const[j], Bs);
#pragma unroll
          for (int s = 0; s < kLanes; ++s) {
            const Acc dt = shared_dt[at.warp][at.channel_in_warp][s];
            const Acc dtu = shared_dtu[at.warp][at.channel_in_warp][s];
            h[j] = Decay<Acc>::of(dt, scaled_A[j]) * h[j] + dtu * (real ? Bs[s] : Acc(0));
          }
        }
      }
    }
    // The chunks, last to first.
    GradStepValues<V, Acc> next;
    next.load(p, at.b, at.d, at.active, span_t0 + (chunks - 1) * kLanes + at.lane);
    for (int c = chunks - 1; c >= 0; --c) {
      const int64_t t0 = span_t0 + c * kLanes;
      GradStepValues<V, Acc> step = next;
      if (c > 0) next.load(p, at.b, at.d, at.active, t0 - kLanes + at.lane);
      const Acc dy = step.d_y;
      step.prepare(p.delta_softplus, bias);
      const Acc g = p.z ? dy * silu(step.z) : dy;
      __syncwarp();
      shared_dt[at.warp][at.channel_in_warp][at.lane] = step.dt;
      shared_dtu[at.warp][at.channel_in_warp][at.lane] = step.dt * step.u;
      shared_g[at.warp][at.channel_in_warp][at.lane] = g;
      __syncwarp();
      Acc dt[kLanes], dtu[kLanes], gs[kLanes];
#pragma unroll
      for (int s = 0; s < kLanes; ++s) {
        dt[s] = shared_dt[at.warp][at.channel_in_warp][s];
        dtu[s] = shared_dtu[at.warp][at.channel_in_warp][s];
        gs[s] = shared_g[at.warp][at.channel_in_warp][s];
      }
      Acc dBC_q[kLanes], dt_r[kLanes], y[kLanes];  // sum_n dh B, sum_n dh h[t-1] a A, sum_n C h
#pragma unroll
      for (int s = 0; s < kLanes; ++s) dBC_q[s] = dt_r[s] = y[s] = 0;
#pragma unroll
      for (int j = 0; j < kStates; ++j) {
        const int n = min(j * kLanes + at.lane, int(N) - 1);
        const bool real = j * kLanes + at.lane < N;
        Acc Bs[kLanes], Cs[kLanes], hs[kLanes], as[kLanes];
        Brows.template load<kLanes>(at.b, at.group, n, L, t0, p.reverse, B_const[j], Bs);
        Crows.template load<kLanes>(at.b, at.group, n, L, t0, p.reverse, C_const[j], Cs);
        const Acc h0 = chunk_start(c, j);
        Acc h = h0;
#pragma unroll
        for (int s = 0; s < kLanes; ++s) {
          if (!real) Bs[s] = Cs[s] = 0;
          as[s] = Decay<Acc>::of(dt[s], scaled_A[j]);
          h = as[s] * h + dtu[s] * Bs[s];
          hs[s] = h;
          y[s] += Cs[s] * h;
        }
        Acc carry = dh_carry[j];
#pragma unroll
        for (int s = kLanes - 1; s >= 0; --s) {
          const Acc dh = Cs[s] * gs[s] + carry;
          dBC_q[s] += dh * Bs[s];
          const Acc w = dh * (s > 0 ? hs[s - 1] : h0) * as[s];
          dt_r[s] += w * A_raw[j];
          dA_sum[j] += w * dt[s];
          const Acc dB = dh * dtu[s], dC = gs[s] * hs[s];
          if (p.b_per_step || p.c_per_step) {
            const int64_t slot = at.group - first_group;
            const Acc dB_add = warp_one_group ? sum_over_channels<kLanes>(dB) : dB;
            const Acc dC_add = warp_one_group ? sum_over_channels<kLanes>(dC) : dC;
            if (real && at.active && (!warp_one_group || at.channel_in_warp == 0)) {
              const int64_t t = t0 + s;
              if (t < L) {
                const int64_t pos = p.reverse ? L - 1 - t : t;
                const int64_t row = (at.b * p.groups + at.group) * N + n;
                if (p.b_per_step) {
                  if (use_tile) atomicAdd(&tile_B[(slot * S::kMaxStates + n) * kLanes + s], dB_add);
                  else atomicAdd(static_cast<Acc*>(p.d_B) + row * L + pos, dB_add);
                }
                if (p.c_per_step) {
                  if (use_tile) atomicAdd(&tile_C[(slot * S::kMaxStates + n) * kLanes + s], dC_add);
                  else atomicAdd(static_cast<Acc*>(p.d_C) + row * L + pos, dC_add);
                }
              }
            }
          }
          if (!p.b_per_step) dB_sum[j] += dB;
          if (!p.c_per_step) dC_sum[j] += dC;
          carry = as[s] * dh;
        }
        dh_carry[j] = carry;
      }
      const Acc q = sum_over_lanes<kLanes>(dBC_q, at.lane);
      const Acc r = sum_over_lanes<kLanes>(dt_r, at.lane);
      const Acc y_states = sum_over_lanes<kLanes>(y, at.lane);
      if (step.valid) {
        const int64_t out = at.row * L + step.pos;
        const Acc d_dt = step.u * q + r;
        const Acc d_delta = d_dt * step.dt_grad_scale;
        static_cast<V*>(p.d_u)[out] = from_acc<V>(Dd * g + step.dt * q);
        static_cast<V*>(p.d_delta)[out] = from_acc<V>(d_delta);
        if (p.z) {
          const Acc sz = sigmoid(step.z);
          const Acc y_pre = y_states + Dd * step.u;
          static_cast<V*>(p.d_z)[out] = from_acc<V>(dy * y_pre * sz * (Acc(1) + step.z * (Acc(1) - sz)));
        }
        dD_sum += g * step.u;
        dbias_sum += d_delta;
      }
      if (use_tile) {
        __syncthreads();
        const int64_t groups_here = min(int64_t(S::kTileSlots), p.groups - first_group);
        for (int i = threadIdx.x; i < kTileSize; i += kThreads) {
          const int s = i % kLanes, n = (i / kLanes) % S::kMaxStates, slot = i / (kLanes * S::kMaxStates);
          const int64_t t = t0 + s;
          if (slot < groups_here && n < N && t < L) {
            const int64_t pos = p.reverse ? L - 1 - t : t;
            const int64_t row = (at.b * p.groups + first_group + slot) * N + n;
            if (p.b_per_step) atomicAdd(static_cast<Acc*>(p.d_B) + row * L + pos, tile_B[i]);
            if (p.c_per_step) atomicAdd(static_cast<Acc*>(p.d_C) + row * L + pos, tile_C[i]);
          }
          tile_B[i] = tile_C[i] = 0;
        }
        __syncthreads();
      }
    }
  }
  // Per (b, d, n) and per channel: the state gradient entering the scan, and the sums over the steps.
#pragma unroll
  for (int j = 0; j < kStates; ++j) {
    const int n = j * kLanes + at.lane;
    if (!(at.active && n < N)) continue;
    static_cast<Acc*>(p.d_initial)[at.row * N + n] = dh_carry[j];
    atomicAdd(static_cast<Acc*>(p.d_A) + at.d * N + n, dA_sum[j]);
    if (!p.b_per_step) atomicAdd(static_cast<Acc*>(p.d_B) + at.d * N + n, dB_sum[j]);
    if (!p.c_per_step) atomicAdd(static_cast<Acc*>(p.d_C) + at.d * N + n, dC_sum[j]);
  }
#pragma unroll
  for (int o = 1; o < kLanes; o *= 2) {
    dD_sum += __shfl_xor_sync(kFullMask, dD_sum, o);
    dbias_sum += __shfl_xor_sync(kFullMask, dbias_sum, o);
  }
  if (at.active && at.lane == 0) {
    if (p.d_D) atomicAdd(static_cast<Acc*>(p.d_D) + at.d, dD_sum);
    if (p.d_delta_bias) atomicAdd(static_cast<Acc*>(p.d_delta_bias) + at.d, dbias_sum);
  }
}

// ------------------------------------------------------------------------------------------
// Launch

// Whether per-step B and C rows load as 16-byte vectors: unit stride along the sequence, and
// every chunk of either scan direction starts 16-byte aligned.
template <typename BCT>
bool bc_rows_vector(const SelectiveParams& p) {
  const auto aligned = [&](const void* data, const StridesBC& s, bool per_step) {
    if (!per_step) return true;
    const int64_t bytes = sizeof(BCT);
    return s.step == 1 && reinterpret_cast<uintptr_t>(data) % 16 == 0 && (s.batch * bytes) % 16 == 0 &&
           (s.group * bytes) % 16 == 0 && (s.state * bytes) % 16 == 0 && (p.seq_len * bytes) % 16 == 0;
  };
  return aligned(p.B, p.b_strides, p.b_per_step) && aligned(p.C, p.c_strides, p.c_per_step);
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

template <int kLanes>
int64_t num_blocks(const SelectiveParams& p) {
  constexpr int64_t per_block = Place<kLanes>::kChannelsPerBlock;
  return p.batch * ((p.dim + per_block - 1) / per_block);
}

template <typename V, typename BCT, SelectiveConfig kConfig>
void launch_fwd(const SelectiveParams& p, cudaStream_t stream) {
  const auto kernel = selective_fwd_kernel<V, BCT, kConfig.lanes, kConfig.states_per_lane>;
  kernel<<<num_blocks<kConfig.lanes>(p), kThreads, 0, stream>>>(p, bc_rows_vector<BCT>(p));
  check_launch("selective_scan_fwd");
}

template <typename V, typename BCT, SelectiveConfig kConfig>
void launch_bwd(const SelectiveGradParams& p, cudaStream_t stream) {
  using Acc = acc_t<V>;
  using S = BwdShared<kConfig.lanes, kConfig.states_per_lane>;
  const auto kernel = selective_bwd_kernel<V, BCT, kConfig.lanes, kConfig.states_per_lane>;
  // The shared tile adds a block's channels before the atomics; it needs them in at most
  // kTileSlots groups, which holds where a group has at least a block's channels.
  const int64_t per_block = Place<kConfig.lanes>::kChannelsPerBlock;
  // Where the tiles would not fit beside the chunk starts (float64 at the widest config), the
  // warps add into global memory directly.
  const size_t starts = sizeof(Acc) * S::kChunksPerSpan * kConfig.states_per_lane * kThreads;
  const size_t tile_bytes = sizeof(Acc) * 2 * S::kTileSlots * S::kMaxStates * kConfig.lanes;
  const bool use_tile = (p.b_per_step || p.c_per_step) && p.dim / p.groups >= per_block &&
                        starts + tile_bytes <= max_shared_bytes();
  const size_t tiles = use_tile ? tile_bytes : 0;
  const size_t bytes = starts + tiles;
  if (bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (err != cudaSuccess)
      throw std::runtime_error(std::string("linrec: selective_scan_bwd needs ") + std::to_string(bytes) +
                               " bytes of shared memory: " + cudaGetErrorString(err));
  }
  kernel<<<num_blocks<kConfig.lanes>(p), kThreads, bytes, stream>>>(p, bc_rows_vector<BCT>(p), use_tile);
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

// The selective scan's forward kernel (the plan: selective_scan.cuh).
#pragma once
#include "common.cuh"

namespace linrec::selective {

// The forward's register budget: at least this many threads resident on a multiprocessor
// (128 registers at 8 steps a thread; ptxas -v).
constexpr int kFwdThreadsPerSM = 512;

// Shared memory of the forward's warps: per warp and state, A * log2(e) and the state entering
// the chunk; then per warp its lanes' segment slots (LaneCuts).
template <typename Acc, int K, int kWarps> __host__ __device__ size_t fwd_shared_bytes(const SelectiveParams& p) {
  return kWarps * (2 * p.states * sizeof(Acc) + segment_slot_bytes<K>(p));
}

// What a warp of the forward reads once.
template <typename V, typename BCT, int K, int kWarps>
struct FwdWarp {
  using Acc = acc_t<V>;
  const SelectiveParams& p;
  const VectorRows& vec;
  const Channel<kWarps>& ch;
  const BCSource<BCT, Acc, K, kWarps>& bc;
  const Acc* scaled_A;
  Acc* carry;  // per state, the state entering the chunk: lane 0 alone reads and writes it
  int32_t* segment_slots;  // the lane's LaneCuts slots, where the call has a state a segment
  Acc bias, D;
  int lane;
};

// The chunks of one channel, first to last.
template <bool kReverse, bool kTiled, bool kCuts, typename V, typename BCT, int K, int kWarps>
__device__ __forceinline__ void forward_chunks(const FwdWarp<V, BCT, K, kWarps>& w) {
  using Acc = acc_t<V>;
  constexpr int kChunk = 32 * K;
  const SelectiveParams& p = w.p;
  const auto& ch = w.ch;
  const int N = int(p.states), lane = w.lane;
  const int64_t L = p.seq_len, num_ckpt = num_checkpoints(L);
  for (int64_t chunk_t0 = 0; chunk_t0 < L; chunk_t0 += kChunk) {
    const int64_t t0 = chunk_t0 + lane * K;  // this lane's first step
    if constexpr (kTiled) {
      if (chunk_t0 > 0) __syncthreads();  // the block is done with the chunk before's tiles
      w.bc.template start_chunk<kReverse>(ch.b, ch.group, N, L, chunk_t0);
    }
    LaneSteps<V, Acc, K> s;
    s.template load<kReverse>(p, w.vec, ch.b, ch.d, t0, w.bias);
    LaneCuts<K> cuts;  // no marks without cuts: their code folds away
    if constexpr (kCuts) cuts.template load<kReverse>(p, t0, w.segment_slots);
    if constexpr (kTiled) w.bc.finish_chunk();
    // A lane whose first step starts a checkpoint span saves the states entering it.
    Acc* checkpoint = t0 % kCheckpointSteps == 0 && t0 < L
                          ? static_cast<Acc*>(p.checkpoints) + (ch.row * num_ckpt + t0 / kCheckpointSteps) * N
                          : nullptr;
    Acc y[K];
#pragma unroll
    for (int i = 0; i < K; ++i) y[i] = 0;
    const BCT* at_B = w.bc.template lane_tile<kReverse>(false, lane);  // walk the tiles' states
    const BCT* at_C = w.bc.template lane_tile<kReverse>(true, lane);
    // The states, one after another. A warp with no segment edge in this chunk (nearly all of
    // them) takes the loop without the cut code, its marks a constant 0.
    const auto states = [&]<bool kMarked>() {
      LaneCuts<K> m;
      if constexpr (kMarked) m = cuts;
      for (int n = 0; n < N; ++n, at_B += kChunk, at_C += kChunk) {
        const Acc sA = w.scaled_A[n];
        Acc Bn[K], a[K], bu[K], pb = 0;
        load_state<kReverse, kTiled>(w.bc.B, at_B, ch, n, L, t0, Bn);
#pragma unroll
        for (int i = 0; i < K; ++i) {
          a[i] = Decay<Acc>::of(s.dt[i], sA);
          bu[i] = s.dtu[i] * Bn[i];
        }
        // A step that begins a segment maps any state to a * (its initial state) + b.
        if (m.any_begins()) {
#pragma unroll
          for (int i = 0; i < K; ++i) {
            if (!m.begins_at(i)) continue;
            if (p.segments && p.initial)
              bu[i] += a[i] * static_cast<const Acc*>(p.initial)[segment_state(p, ch.row, w.segment_slots[i], n)];
            a[i] = 0;
          }
        }
#pragma unroll
        for (int i = 0; i < K; ++i) pb = a[i] * pb + bu[i];
        // The product of the lane's a: one exponential, not K products.
        Acc pa = m.any_begins() ? Acc(0) : Decay<Acc>::of(s.dt_sum, sA);
        Acc h = value_entering_lane<false>(pa, pb, lane == 0 ? w.carry[n] : Acc(0), lane);
        if (checkpoint) checkpoint[n] = h;
        Acc Cn[K];  // loaded after the scan: fewer live registers
        load_state<kReverse, kTiled>(w.bc.C, at_C, ch, n, L, t0, Cn);
#pragma unroll
        for (int i = 0; i < K; ++i) {
          h = a[i] * h + bu[i];
          y[i] += Cn[i] * h;
          if (p.segments && m.ends_at(i))
            static_cast<Acc*>(p.last_state)[segment_state(p, ch.row, w.segment_slots[i], n)] = h;
        }
        const Acc leaving_chunk = __shfl_sync(kFullMask, pb, 31);
        if (lane == 0) w.carry[n] = leaving_chunk;
      }
    };
    if constexpr (kCuts) {
      if (__any_sync(kFullMask, cuts.marks != 0)) states.template operator()<true>();
      else states.template operator()<false>();
    } else {
      states.template operator()<false>();
    }
    Acc u[K], z[K];
    load_channel<kReverse, K, V>(again(p.u), p.u_strides, ch.b, ch.d, L, t0, w.vec.u, u);
    if (p.z) load_channel<kReverse, K, V>(again(p.z), p.z_strides, ch.b, ch.d, L, t0, w.vec.z, z);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      y[i] += w.D * u[i];
      if (p.z) y[i] *= silu(z[i]);
    }
    store_steps<kReverse>(static_cast<V*>(p.y) + ch.row * L, L, t0, w.vec.out, y);
  }
}

// kCuts: packed sequences (p.cuts), a kernel of their own, so that the one without keeps its
// registers (those with spill a few bytes at most).
template <typename V, typename BCT, int K, int kWarps, bool kCuts>
__global__ void __launch_bounds__(32 * kWarps, kFwdThreadsPerSM / (32 * kWarps))
    selective_fwd_kernel(const SelectiveParams p, VectorRows vec, bool tiled) {
  using Acc = acc_t<V>;
  constexpr int kChunk = 32 * K;
  static_assert(kChunk % kCheckpointSteps == 0, "a chunk starts at a checkpoint");
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  const int N = int(p.states);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Acc* scaled_A = reinterpret_cast<Acc*>(dynamic_shared) + warp * 2 * N;
  Acc* carry = scaled_A + N;
  int32_t* segment_slots = reinterpret_cast<int32_t*>(dynamic_shared + kWarps * 2 * N * sizeof(Acc)) +
                           (warp * 32 + lane) * K;
  BCT* tile = reinterpret_cast<BCT*>(dynamic_shared + round_up_16(fwd_shared_bytes<Acc, K, kWarps>(p)));
  wait_for_prior_grid();
  const Channel<kWarps> ch(p);
  if (!ch.active) return;  // tiled holds only where every warp of a block has a channel
  const BCSource<BCT, Acc, K, kWarps> bc{{p.B, p.b_strides, p.b_per_step, vec.bc},
                                         {p.C, p.c_strides, p.c_per_step, vec.bc},
                                         tile, tile + N * kChunk};
  for (int n = lane; n < N; n += 32) {
    scaled_A[n] = static_cast<const Acc*>(p.A)[ch.d * N + n] * Decay<Acc>::kScale;
    // With a state a segment, the first step begins one and reads its own.
    carry[n] = p.initial && !p.segments ? static_cast<const Acc*>(p.initial)[ch.row * N + n] : Acc(0);
  }
  __syncwarp();
  const FwdWarp<V, BCT, K, kWarps> w{p, vec, ch, bc, scaled_A, carry, segment_slots,
                                     p.delta_bias ? static_cast<const Acc*>(p.delta_bias)[ch.d] : Acc(0),
                                     p.D ? static_cast<const Acc*>(p.D)[ch.d] : Acc(0), lane};
  if (p.reverse) {
    if (tiled) forward_chunks<true, true, kCuts>(w);
    else forward_chunks<true, false, kCuts>(w);
  } else {
    if (tiled) forward_chunks<false, true, kCuts>(w);
    else forward_chunks<false, false, kCuts>(w);
  }
  if (p.segments) return;  // each segment's last state is written at its last step
  __syncwarp();
  for (int n = lane; n < N; n += 32) static_cast<Acc*>(p.last_state)[ch.row * N + n] = carry[n];
}

}  // namespace linrec::selective

// The selective scan's backward kernel (the plan: selective_scan.cuh).
#pragma once
#include "common.cuh"

namespace linrec::selective {

// The backward's register budget: at least this many threads resident on a multiprocessor
// (ptxas -v: at 4 steps a thread, 168 registers without spills; at 8, about 240).
constexpr int bwd_threads_per_sm(int steps_per_thread) { return steps_per_thread <= 4 ? 384 : 256; }

// Shared memory of the backward: per warp and state, A * log2(e), A, the gradient flowing
// into the chunk from the one after, the chunk's first state, and the sums over steps of the
// gradients of A and of per-channel B and C; then, where the block's warps add their d_B and
// d_C (block_sums), two turns of a [kWarps][B, C][chunk] tile; then per warp its lanes' segment
// slots (LaneCuts).
template <typename Acc> constexpr size_t bwd_shared_per_warp(int64_t states) { return 7 * states * sizeof(Acc); }
template <typename Acc, int K, int kWarps> constexpr size_t bwd_sums_bytes() {
  return 2 * kWarps * 2 * 32 * K * sizeof(Acc);
}
template <typename Acc, int K, int kWarps>
__host__ __device__ size_t bwd_shared_bytes(const SelectiveParams& p, bool block_sums) {
  return kWarps * bwd_shared_per_warp<Acc>(p.states) + (block_sums ? bwd_sums_bytes<Acc, K, kWarps>() : 0) +
         kWarps * segment_slot_bytes<K>(p);
}

// What a warp of the backward reads once, and its shared memory.
template <typename V, typename BCT, int K, int kWarps>
struct BwdWarp {
  using Acc = acc_t<V>;
  const SelectiveGradParams& p;
  const VectorRows& vec;
  const Channel<kWarps>& ch;
  const BCSource<BCT, Acc, K, kWarps>& bc;
  const Acc* scaled_A;
  const Acc* A;
  Acc* dh_carry;     // per state, the gradient flowing in from the chunk after: lane 31 alone
  Acc* chunk_start;  // per state, the chunk's first state (from its checkpoint)
  Acc* dA_sum;       // per state, sums over the steps: lane 0 alone, as the two below
  Acc* dB_sum;
  Acc* dC_sum;
  Acc* sums;         // the block's [turn][warp][B, C][chunk] tile, where block_sums
  int32_t* segment_slots;  // the lane's LaneCuts slots, where the call has a state a segment
  Acc bias, D;
  int lane, warp;
  bool block_sums;
};

// The chunks of one channel, last to first; returns the channel's sums of d_D and d_delta_bias
// (this lane's part).
template <bool kReverse, bool kTiled, bool kCuts, typename V, typename BCT, int K, int kWarps>
__device__ __forceinline__ void backward_chunks(const BwdWarp<V, BCT, K, kWarps>& w, acc_t<V>& dD_part,
                                                acc_t<V>& dbias_part) {
  using Acc = acc_t<V>;
  constexpr int kChunk = 32 * K;
  const SelectiveGradParams& p = w.p;
  const auto& ch = w.ch;
  const int N = int(p.states), lane = w.lane;
  const int64_t L = p.seq_len, num_ckpt = num_checkpoints(L);
  const int64_t bc_row0 = (ch.b * p.groups + ch.group) * N;  // d_B's, d_C's row of state 0
  int turn = 0;
  for (int64_t chunk_t0 = (L - 1) / kChunk * kChunk; chunk_t0 >= 0; chunk_t0 -= kChunk) {
    const int64_t t0 = chunk_t0 + lane * K;
    if constexpr (kTiled) {
      __syncthreads();  // the block is done with the chunk after's tiles
      w.bc.template start_chunk<kReverse>(ch.b, ch.group, N, L, chunk_t0);
    }
    LaneSteps<V, Acc, K> s;
    s.template load<kReverse>(p, w.vec, ch.b, ch.d, t0, w.bias);
    LaneCuts<K> cuts;  // no marks without cuts: their code folds away
    if constexpr (kCuts) cuts.template load<kReverse>(p, t0, w.segment_slots);
    Acc g[K];  // the gradient of the output before the gate, d_y * silu(z)
    {
      Acc z[K];
      load_channel<kReverse, K, V>(p.d_y, p.d_y_strides, ch.b, ch.d, L, t0, w.vec.d_y, g);
      if (p.z) load_channel<kReverse, K, V>(p.z, p.z_strides, ch.b, ch.d, L, t0, w.vec.z, z);
#pragma unroll
      for (int i = 0; i < K; ++i) g[i] = p.z ? g[i] * silu(z[i]) : g[i];
    }
    __syncwarp();  // the chunk after has read its first states
    for (int n = lane; n < N; n += 32)
      w.chunk_start[n] = static_cast<const Acc*>(p.checkpoints)[(ch.row * num_ckpt + chunk_t0 / kCheckpointSteps) * N + n];
    __syncwarp();
    if constexpr (kTiled) w.bc.finish_chunk();
    Acc q[K], r[K], y_states[K];  // per step: sum_n dh B, sum_n dh h[t-1] a A, sum_n C h
#pragma unroll
    for (int i = 0; i < K; ++i) q[i] = r[i] = y_states[i] = 0;

    const BCT* at_B = w.bc.template lane_tile<kReverse>(false, lane);  // walk the tiles' states
    const BCT* at_C = w.bc.template lane_tile<kReverse>(true, lane);
    // The states, one after another. A warp with no segment edge in this chunk (nearly all of
    // them) takes the loop without the cut code, its marks a constant 0; where the block's
    // warps add their d_B and d_C (a barrier a state), the whole block takes one loop.
    const auto states = [&]<bool kMarked>() {
      LaneCuts<K> m;
      if constexpr (kMarked) m = cuts;
      for (int n = 0; n < N; ++n, at_B += kChunk, at_C += kChunk) {
        const Acc sA = w.scaled_A[n], An = w.A[n];
        Acc Bn[K], Cn[K], a[K], h[K];
        load_state<kReverse, kTiled>(w.bc.B, at_B, ch, n, L, t0, Bn);
        // A step that begins a segment: a * (the segment's initial state), the state it adds in
        // place of a * h[t-1] (its a then reads as 0: no state nor gradient passes it).
        const auto entering = [&](int i) {
          return p.segments && p.initial
                     ? Decay<Acc>::of(s.dt[i], sA) *
                           static_cast<const Acc*>(p.initial)[segment_state(p, ch.row, w.segment_slots[i], n)]
                     : Acc(0);
        };
        // The states, replayed from the chunk's first.
        Acc pb = 0;
#pragma unroll
        for (int i = 0; i < K; ++i) {
          a[i] = m.begins_at(i) ? Acc(0) : Decay<Acc>::of(s.dt[i], sA);
          pb = a[i] * pb + s.dtu[i] * Bn[i];
          if (m.begins_at(i)) pb += entering(i);
        }
        // The product of the lane's a.
        const Acc decay_all = m.any_begins() ? Acc(0) : Decay<Acc>::of(s.dt_sum, sA);
        Acc pa = decay_all;
        const Acc h_before = value_entering_lane<false>(pa, pb, lane == 0 ? w.chunk_start[n] : Acc(0), lane);
        {
          Acc state = h_before;
#pragma unroll
          for (int i = 0; i < K; ++i) {
            h[i] = state = a[i] * state + s.dtu[i] * Bn[i];
            if (m.begins_at(i)) h[i] = state = state + entering(i);
          }
        }
        // A step that ends a segment adds the gradient of its last state to its own.
        const auto d_last = [&](int i) {
          return p.segments && m.ends_at(i) && p.d_last_state
                     ? static_cast<const Acc*>(p.d_last_state)[segment_state(p, ch.row, w.segment_slots[i], n)]
                     : Acc(0);
        };
        // The state gradients dh[t] = C[t] g[t] + a[t+1] dh[t+1]: each lane maps cin (a[t+1] dh[t+1]
        // of the step after its last) to a[0] dh[0] = decay_all * cin + qb.
        load_state<kReverse, kTiled>(w.bc.C, at_C, ch, n, L, t0, Cn);
        Acc qb = 0;
#pragma unroll
        for (int i = K - 1; i >= 0; --i) qb = a[i] * (Cn[i] * g[i] + qb + d_last(i));
        Acc qa = decay_all;
        Acc cin = value_entering_lane<true>(qa, qb, lane == 31 ? w.dh_carry[n] : Acc(0), lane);
        const Acc leaving = __shfl_sync(kFullMask, qb, 0);  // into the chunk before
        if (lane == 31) w.dh_carry[n] = leaving;

        Acc dA_part = 0, dB_part = 0, dC_part = 0, dB[K], dC[K];
#pragma unroll
        for (int i = K - 1; i >= 0; --i) {
          const Acc dh = Cn[i] * g[i] + cin + d_last(i);
          cin = a[i] * dh;
          q[i] += dh * Bn[i];
          // d / d(dt * A) of the step: dh * a * (the state entering it); where a segment begins
          // that is its initial state, and a * it is what h[t] adds to dt * u * B.
          const Acc dw = dh * (m.begins_at(i) ? h[i] - s.dtu[i] * Bn[i] : (i > 0 ? h[i - 1] : h_before) * a[i]);
          if (p.segments && m.begins_at(i))
            static_cast<Acc*>(p.d_initial)[segment_state(p, ch.row, w.segment_slots[i], n)] =
                dh * Decay<Acc>::of(s.dt[i], sA);
          r[i] += dw * An;
          dA_part += dw * s.dt[i];
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
          w.dA_sum[n] += dA_part;
          if (!p.b_per_step) w.dB_sum[n] += dB_part;
          if (!p.c_per_step) w.dC_sum[n] += dC_part;
        }
        if (!(p.b_per_step || p.c_per_step)) continue;
        Acc* const dB_row = static_cast<Acc*>(p.d_B) + (bc_row0 + n) * L;
        Acc* const dC_row = static_cast<Acc*>(p.d_C) + (bc_row0 + n) * L;
        if (!w.block_sums) {
          if (p.b_per_step) add_steps<kReverse>(dB_row, L, t0, w.vec.out, dB);
          if (p.c_per_step) add_steps<kReverse>(dC_row, L, t0, w.vec.out, dC);
          continue;
        }
        // The block's warps are channels of one group: add their parts, then once to global memory.
        Acc* const mine = w.sums + (turn * kWarps + w.warp) * 2 * kChunk;
#pragma unroll
        for (int i = 0; i < K; ++i) mine[lane * K + i] = dB[i], mine[kChunk + lane * K + i] = dC[i];
        __syncthreads();
        constexpr int kRun = 4;  // steps a thread adds per pass
        for (int run = threadIdx.x; run < 2 * kChunk / kRun; run += 32 * kWarps) {
          const bool is_C = run * kRun >= kChunk;
          if (is_C ? !p.c_per_step : !p.b_per_step) continue;
          Acc sum[kRun] = {};
          for (int k = 0; k < kWarps; ++k) {
            const Acc* theirs = w.sums + (turn * kWarps + k) * 2 * kChunk + run * kRun;
#pragma unroll
            for (int j = 0; j < kRun; ++j) sum[j] += theirs[j];
          }
          add_steps<kReverse>(is_C ? dC_row : dB_row, L, chunk_t0 + run * kRun % kChunk, w.vec.out, sum);
        }
        turn ^= 1;  // the next state writes the other turn: one barrier a state suffices
      }
    };
    if constexpr (kCuts) {
      const bool marked =
          w.block_sums ? __syncthreads_or(cuts.marks != 0) : __any_sync(kFullMask, cuts.marks != 0);
      if (marked) states.template operator()<true>();
      else states.template operator()<false>();
    } else {
      states.template operator()<false>();
    }

    Acc u[K], raw_delta[K], d_y[K], z[K], d_u[K], d_delta[K], d_z[K];
    load_channel<kReverse, K, V>(again(p.u), p.u_strides, ch.b, ch.d, L, t0, w.vec.u, u);
    if (p.delta_softplus) load_channel<kReverse, K, V>(again(p.delta), p.delta_strides, ch.b, ch.d, L, t0, w.vec.delta, raw_delta);
    if (p.z) {
      load_channel<kReverse, K, V>(again(p.d_y), p.d_y_strides, ch.b, ch.d, L, t0, w.vec.d_y, d_y);
      load_channel<kReverse, K, V>(again(p.z), p.z_strides, ch.b, ch.d, L, t0, w.vec.z, z);
    }
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const Acc d_dt = u[i] * q[i] + r[i];
      d_u[i] = w.D * g[i] + s.dt[i] * q[i];
      d_delta[i] = p.delta_softplus ? d_dt * sigmoid(raw_delta[i] + w.bias) : d_dt;
      if (p.z) {
        const Acc sz = sigmoid(z[i]);
        d_z[i] = d_y[i] * (y_states[i] + w.D * u[i]) * sz * (Acc(1) + z[i] * (Acc(1) - sz));
      }
      dD_part += g[i] * u[i];
      if (t0 + i < L) dbias_part += d_delta[i];
    }
    store_steps<kReverse>(static_cast<V*>(p.d_u) + ch.row * L, L, t0, w.vec.out, d_u);
    store_steps<kReverse>(static_cast<V*>(p.d_delta) + ch.row * L, L, t0, w.vec.out, d_delta);
    if (p.z) store_steps<kReverse>(static_cast<V*>(p.d_z) + ch.row * L, L, t0, w.vec.out, d_z);
  }
}

// kCuts: packed sequences (p.cuts), a kernel of their own, as the forward's.
template <typename V, typename BCT, int K, int kWarps, bool kCuts>
__global__ void __launch_bounds__(32 * kWarps, bwd_threads_per_sm(K) / (32 * kWarps))
    selective_bwd_kernel(const SelectiveGradParams p, VectorRows vec, bool block_sums, bool tiled) {
  using Acc = acc_t<V>;
  constexpr int kChunk = 32 * K;
  static_assert(kChunk % kCheckpointSteps == 0, "a chunk starts at a checkpoint");
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  const int N = int(p.states);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Acc* const shared = reinterpret_cast<Acc*>(dynamic_shared);
  Acc* const mine = shared + warp * 7 * N;
  Acc* const sums = shared + kWarps * 7 * N;
  int32_t* const segment_slots =
      reinterpret_cast<int32_t*>(dynamic_shared + kWarps * bwd_shared_per_warp<Acc>(N) +
                                 (block_sums ? bwd_sums_bytes<Acc, K, kWarps>() : 0)) +
      (warp * 32 + lane) * K;
  BCT* bc_tile = reinterpret_cast<BCT*>(dynamic_shared + round_up_16(bwd_shared_bytes<Acc, K, kWarps>(p, block_sums)));
  wait_for_prior_grid();
  const Channel<kWarps> ch(p);
  if (!ch.active) return;  // block_sums and tiled hold only where every warp of a block has a channel
  const BCSource<BCT, Acc, K, kWarps> bc{{p.B, p.b_strides, p.b_per_step, vec.bc},
                                         {p.C, p.c_strides, p.c_per_step, vec.bc},
                                         bc_tile, bc_tile + N * kChunk};
  const BwdWarp<V, BCT, K, kWarps> w{p, vec, ch, bc, mine, mine + N, mine + 2 * N, mine + 3 * N, mine + 4 * N,
                                     mine + 5 * N, mine + 6 * N, sums, segment_slots,
                                     p.delta_bias ? static_cast<const Acc*>(p.delta_bias)[ch.d] : Acc(0),
                                     p.D ? static_cast<const Acc*>(p.D)[ch.d] : Acc(0), lane, warp, block_sums};
  for (int n = lane; n < N; n += 32) {
    const Acc A = static_cast<const Acc*>(p.A)[ch.d * N + n];
    mine[n] = A * Decay<Acc>::kScale;
    mine[N + n] = A;
    // With a state a segment, the last step ends one and adds its own.
    w.dh_carry[n] =
        p.d_last_state && !p.segments ? static_cast<const Acc*>(p.d_last_state)[ch.row * N + n] : Acc(0);
    w.dA_sum[n] = w.dB_sum[n] = w.dC_sum[n] = 0;
  }
  __syncwarp();
  Acc dD_part = 0, dbias_part = 0;
  if (p.reverse) {
    if (tiled) backward_chunks<true, true, kCuts>(w, dD_part, dbias_part);
    else backward_chunks<true, false, kCuts>(w, dD_part, dbias_part);
  } else {
    if (tiled) backward_chunks<false, true, kCuts>(w, dD_part, dbias_part);
    else backward_chunks<false, false, kCuts>(w, dD_part, dbias_part);
  }
  // Per channel: the gradient entering the scan, and the sums over the steps.
  __syncwarp();
  for (int n = lane; n < N; n += 32) {
    // With a state a segment, each segment's first step wrote its own.
    if (!p.segments) static_cast<Acc*>(p.d_initial)[ch.row * N + n] = w.dh_carry[n];
    atomicAdd(static_cast<Acc*>(p.d_A) + ch.d * N + n, w.dA_sum[n]);
    if (!p.b_per_step) atomicAdd(static_cast<Acc*>(p.d_B) + ch.d * N + n, w.dB_sum[n]);
    if (!p.c_per_step) atomicAdd(static_cast<Acc*>(p.d_C) + ch.d * N + n, w.dC_sum[n]);
  }
  dD_part = warp_sum(dD_part);
  dbias_part = warp_sum(dbias_part);
  if (lane == 0) {
    if (p.d_D) atomicAdd(static_cast<Acc*>(p.d_D) + ch.d, dD_part);
    if (p.d_delta_bias) atomicAdd(static_cast<Acc*>(p.d_delta_bias) + ch.d, dbias_part);
  }
}

}  // namespace linrec::selective

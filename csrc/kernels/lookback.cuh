// Single-pass chained scan across blocks: decoupled look-back (Merrill & Garland,
// "Single-pass Parallel Prefix Scan with Decoupled Look-back", 2016), over the
// recurrence's transforms s -> c * s + y.
//
// Each block scans one tile of a sequence. As soon as it knows its tile's total
// transform it publishes it (kAggregate); once it knows the state before the
// tile it publishes the state after it (kInclusive). To find its entering state,
// warp 0 reads the statuses of the 32 * kLookBackPerLane nearest predecessors at
// once, composes the transforms up to the nearest inclusive one, and moves on by
// that window if none is inclusive yet. Tile numbers come from an atomic counter in launch order, so a
// block waits only on blocks that already started: no deadlock.
#pragma once
#include <cstdint>

#include "../memio.h"

namespace linrec {

enum TileFlag : int { kNotReady = 0, kAggregate = 1, kInclusive = 2 };

// One per tile, zeroed before the launch. The aggregate and the inclusive value
// have their own fields, so a reader that saw kAggregate never reads a value
// that was overwritten after it.
template <typename Acc>
struct TileStatus {
  int flag;
  Acc aggregate_y, aggregate_c, inclusive;
};

// The workspace: a tile counter, then the statuses of all tiles.
struct ChainWorkspaceLayout {
  static constexpr int64_t kCounterBytes = 16;
  template <typename Acc>
  static int64_t bytes(int64_t num_tiles) {
    return kCounterBytes + num_tiles * static_cast<int64_t>(sizeof(TileStatus<Acc>));
  }
  static __device__ __forceinline__ unsigned long long* counter(void* base) {
    return static_cast<unsigned long long*>(base);
  }
  template <typename Acc>
  static __device__ __forceinline__ TileStatus<Acc>* statuses(void* base) {
    return reinterpret_cast<TileStatus<Acc>*>(static_cast<char*>(base) + kCounterBytes);
  }
};

// This block's tile number, in launch order (one atomic per block).
__device__ __forceinline__ int64_t next_tile_number(void* workspace) {
  __shared__ unsigned long long number;
  if (threadIdx.x == 0) number = atomicAdd(ChainWorkspaceLayout::counter(workspace), 1ull);
  __syncthreads();
  return static_cast<int64_t>(number);
}

template <typename Acc>
__device__ __forceinline__ void publish(TileStatus<Acc>* status, TileFlag flag, Acc y, Acc c) {
  if (flag == kAggregate) {
    status->aggregate_y = y;
    status->aggregate_c = c;
  } else {
    status->inclusive = y;
  }
  __threadfence();  // the values become visible before the flag
  atomicExch(&status->flag, static_cast<int>(flag));
}

// Predecessors each lane reads per look-back step: the warp covers a window of
// 32 * kLookBackPerLane tiles per round trip to L2. Wider windows reach the
// last finished tile in fewer round trips, but every waiting warp then polls
// that many more flags: on an H100 (1 x 2^24, fp32, 16x256 tiles) 8 per lane
// ran the forward at 626-808 GB/s against 1554 GB/s at 1.
constexpr int kLookBackPerLane = 1;

__device__ __forceinline__ int load_flag(const void* status) {
  return *static_cast<const volatile int*>(status);
}

// The flag of a status once it is ready. Waiting readers back off (sleeping
// 32 ns, doubling up to 1 us) so their polling leaves L2 to the tiles' loads.
__device__ __forceinline__ int wait_flag(const void* status) {
  int flag = load_flag(status);
  for (unsigned ns = 32; flag == kNotReady; ns = ns < 1024 ? 2 * ns : ns) {
    __nanosleep(ns);
    flag = load_flag(status);
  }
  return flag;
}

// The state before tile k of a sequence whose tiles' statuses are `statuses`,
// given this tile's total transform (total_y, total_c) and the state before the
// sequence. Called by all 32 lanes of one warp; publishes this tile's statuses.
template <typename Acc>
__device__ __forceinline__ Acc look_back(TileStatus<Acc>* statuses, int64_t k, Acc total_y, Acc total_c,
                                         Acc initial) {
  constexpr int P = kLookBackPerLane;
  const int lane = threadIdx.x % kWarpSize;
  if (k == 0) {
    if (lane == 0) publish(&statuses[0], kInclusive, total_c * initial + total_y, Acc(0));
    return initial;
  }
  if (lane == 0) publish(&statuses[k], kAggregate, total_y, total_c);
  // Transform of the tiles between the current window and k: s -> known_c * s + known_y.
  Acc known_y = Acc(0), known_c = Acc(1);
  for (int64_t end = k - 1;; end -= kWarpSize * P) {
    // Lane L reads predecessors end - L*P - j, j = 0 .. P-1, nearest first; all loads in flight at once.
    int flags[P];
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t p = end - lane * P - j;
      flags[j] = p >= 0 ? load_flag(&statuses[p]) : int(kInclusive);
    }
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t p = end - lane * P - j;
      if (flags[j] == kNotReady) flags[j] = wait_flag(&statuses[p]);
    }
    __threadfence();
    // All fields of all P statuses are read before any is used, so the loads overlap.
    Acc inclusive_y[P], aggregate_y[P], aggregate_c[P];
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t p = end - lane * P - j;
      const volatile TileStatus<Acc>* s = &statuses[p >= 0 ? p : 0];
      inclusive_y[j] = s->inclusive;
      aggregate_y[j] = s->aggregate_y;
      aggregate_c[j] = s->aggregate_c;
    }
    // This lane's transform, its statuses composed nearest (outer) to farthest, up to an inclusive one.
    // Before tile 0 lies nothing; tile 0 is always inclusive, so the walk stops there.
    Acc y = Acc(0), c = Acc(1);
    bool reached_inclusive = false;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (reached_inclusive) continue;
      reached_inclusive = flags[j] == kInclusive;
      // An inclusive status is the constant transform s -> 0 * s + inclusive.
      const Acc sy = reached_inclusive ? inclusive_y[j] : aggregate_y[j];
      const Acc sc = reached_inclusive ? Acc(0) : aggregate_c[j];
      y = c * sy + y;
      c = c * sc;
    }
    const unsigned inclusive = __ballot_sync(kFullMask, reached_inclusive);
    const int last = inclusive ? __ffs(inclusive) - 1 : kWarpSize - 1;  // the nearest lane with an inclusive
    if (lane > last) {
      y = Acc(0);
      c = Acc(1);
    }
    // Compose lane 0 (outermost, nearest) ... lane `last` (innermost): (outer o inner)(s) = outer(inner(s)).
#pragma unroll
    for (int delta = 1; delta < kWarpSize; delta *= 2) {
      const Acc inner_y = __shfl_down_sync(kFullMask, y, delta);
      const Acc inner_c = __shfl_down_sync(kFullMask, c, delta);
      if (lane + delta < kWarpSize) {
        y = c * inner_y + y;
        c = c * inner_c;
      }
    }
    const Acc window_y = __shfl_sync(kFullMask, y, 0), window_c = __shfl_sync(kFullMask, c, 0);
    known_y = known_c * window_y + known_y;
    known_c = known_c * window_c;
    if (inclusive) break;
  }
  // With an inclusive predecessor folded in, the transform is constant: its value is the state.
  if (lane == 0) publish(&statuses[k], kInclusive, total_c * known_y + total_y, Acc(0));
  return known_y;
}

// The per-thread variant of look_back, for kernels where every thread scans its
// own sequence (strided.cuh): the state before chunk k of one sequence whose
// chunk statuses are statuses[0], statuses[stride], ... Walks back one chunk at
// a time: those kernels keep only a few chunks of a sequence in flight.
template <typename Acc>
__device__ __forceinline__ Acc look_back_thread(TileStatus<Acc>* statuses, int64_t stride, int64_t k,
                                                Acc total_y, Acc total_c, Acc initial) {
  if (k == 0) {
    publish(&statuses[0], kInclusive, total_c * initial + total_y, Acc(0));
    return initial;
  }
  // Chunks are numbered chunk-major, so the predecessor has usually finished:
  // then this chunk publishes its inclusive status only, one fence instead of two.
  int flag = load_flag(&statuses[(k - 1) * stride]);
  if (flag != kInclusive) publish(&statuses[k * stride], kAggregate, total_y, total_c);
  Acc known_y = Acc(0), known_c = Acc(1);  // the chunks between p and k: s -> known_c * s + known_y
  Acc state;
  for (int64_t p = k - 1;; --p) {
    if (p != k - 1 || flag == kNotReady) flag = wait_flag(&statuses[p * stride]);
    __threadfence();
    const volatile TileStatus<Acc>* s = &statuses[p * stride];
    if (flag == kInclusive) {
      state = known_c * s->inclusive + known_y;
      break;
    }
    known_y = known_c * s->aggregate_y + known_y;
    known_c = known_c * s->aggregate_c;
  }
  publish(&statuses[k * stride], kInclusive, total_c * state + total_y, Acc(0));
  return state;
}

}  // namespace linrec

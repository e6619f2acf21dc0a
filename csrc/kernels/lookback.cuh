// Single-pass chained scan across blocks: decoupled look-back (Merrill & Garland,
// "Single-pass Parallel Prefix Scan with Decoupled Look-back", 2016), over the
// recurrence's transforms s -> c * s + y.
//
// Each block scans one tile of a sequence. As soon as it knows its tile's total
// transform it publishes it (kAggregate); once it knows the state before the
// tile it publishes the state after it (kInclusive). To find its entering state,
// warp 0 reads the statuses of the 32 nearest predecessors at once, composes the
// transforms up to the nearest inclusive one, and moves on by 32 if none is
// inclusive yet. Tile numbers come from an atomic counter in launch order, so a
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

// The state before tile k of a sequence whose tiles' statuses are `statuses`,
// given this tile's total transform (total_y, total_c) and the state before the
// sequence. Called by all 32 lanes of one warp; publishes this tile's statuses.
template <typename Acc>
__device__ __forceinline__ Acc look_back(TileStatus<Acc>* statuses, int64_t k, Acc total_y, Acc total_c, Acc initial) {
  const int lane = threadIdx.x % kWarpSize;
  if (k == 0) {
    if (lane == 0) publish(&statuses[0], kInclusive, total_c * initial + total_y, Acc(0));
    return initial;
  }
  if (lane == 0) publish(&statuses[k], kAggregate, total_y, total_c);
  // Transform of the tiles between the current window and k: s -> known_c * s + known_y.
  Acc known_y = Acc(0), known_c = Acc(1);
  for (int64_t end = k - 1;; end -= kWarpSize) {
    const int64_t p = end - lane;  // lane 0 holds the nearest predecessor
    int flag = kInclusive;
    Acc y = Acc(0), c = Acc(0);  // before tile 0 nothing: a constant transform
    if (p >= 0) {
      volatile int* f = &statuses[p].flag;
      do {
        flag = *f;
      } while (flag == kNotReady);
      __threadfence();
      const volatile TileStatus<Acc>* s = &statuses[p];
      if (flag == kInclusive) {
        y = s->inclusive;  // the state after tile p: the constant transform s -> 0 * s + inclusive
        c = Acc(0);
      } else {
        y = s->aggregate_y;
        c = s->aggregate_c;
      }
    }
    const unsigned inclusive = __ballot_sync(kFullMask, flag == kInclusive);
    const int last = inclusive ? __ffs(inclusive) - 1 : kWarpSize - 1;  // the nearest inclusive lane
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

}  // namespace linrec

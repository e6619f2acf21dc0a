// The block scan of one tile held in registers, in three levels (thread ->
// warp -> block), after CUB's layering.
//
// The scan runs over pairs (y, c) with the associative combine
//     (y1, c1) then (y2, c2)  =  (c2 * y1 + y2,  c1 * c2),
// i.e. "apply step 1, then step 2" of the recurrence y <- c * y + x. Each
// thread first scans its own E elements (level 1), leaving in c[i] the product
// of its coefficients up to i. The threads' totals are scanned across the warp
// with shuffles (level 2) and the warps' totals across the block through shared
// memory (level 3); the carry from the previous tile enters at level 3. Finally
// every element adds (its cumulative coefficient) * (the state before the thread).
//
// `rev` reverses the logical order: threads, lanes, warps and elements are then
// visited from last to first, so the same memory layout serves both directions.
#pragma once
#include "../../config.h"
#include "../../memio.h"

namespace linrec {

// Shared state of the block scan: warp totals, warp prefixes and the carry.
template <typename Acc>
struct BlockScanStorage {
  Acc warp_y[kWarpSize];
  Acc warp_c[kWarpSize];
  Acc warp_prefix[kWarpSize];
  Acc carry;
};

// Level 1: scan this thread's elements in place; returns its total in (y, c).
template <int E, typename Acc>
__device__ __forceinline__ void scan_thread(Acc (&y)[E], Acc (&c)[E], bool rev, Acc& total_y, Acc& total_c) {
  if (!rev) {
#pragma unroll
    for (int i = 1; i < E; ++i) {
      y[i] = c[i] * y[i - 1] + y[i];
      c[i] = c[i] * c[i - 1];
    }
    total_y = y[E - 1];
    total_c = c[E - 1];
  } else {
#pragma unroll
    for (int i = E - 2; i >= 0; --i) {
      y[i] = c[i] * y[i + 1] + y[i];
      c[i] = c[i] * c[i + 1];
    }
    total_y = y[0];
    total_c = c[0];
  }
}

// The value of the logically previous lane of this segment, `delta` lanes back.
template <typename Acc>
__device__ __forceinline__ Acc shfl_prev(Acc v, int delta, bool rev, int width) {
  return rev ? __shfl_down_sync(kFullMask, v, delta, width) : __shfl_up_sync(kFullMask, v, delta, width);
}

// Level 2: inclusive scan of the threads' totals over the logical lanes of each
// segment of `width` lanes (a power of two; the whole warp by default, smaller
// for the packed kernels' short sequences). Returns the exclusive prefix of this
// lane in (ex_y, ex_c) and leaves the inclusive value in (y, c).
template <typename Acc>
__device__ __forceinline__ void scan_warp(Acc& y, Acc& c, bool rev, Acc& ex_y, Acc& ex_c,
                                          int width = kWarpSize) {
  const int lane = threadIdx.x & (width - 1);  // width is a power of two
  const int logical_lane = rev ? width - 1 - lane : lane;
#pragma unroll
  for (int delta = 1; delta < kWarpSize; delta *= 2) {
    if (delta >= width) break;
    const Acc prev_y = shfl_prev(y, delta, rev, width);
    const Acc prev_c = shfl_prev(c, delta, rev, width);
    if (logical_lane >= delta) {
      y = c * prev_y + y;
      c = c * prev_c;
    }
  }
  ex_y = shfl_prev(y, 1, rev, width);
  ex_c = shfl_prev(c, 1, rev, width);
  if (logical_lane == 0) {
    ex_y = Acc(0);
    ex_c = Acc(1);
  }
}

// Level 3: combine the warps' totals and the state before the tile. Every thread
// gets the state before its warp; storage.carry becomes the state after the tile.
// `state_before(total_y, total_c)` gives the state before the tile; warp 0 calls it
// (all lanes) once the tile's total is known, so a multi-block scan can look back
// there. Contains two block barriers.
template <int NT, typename Acc, typename StateBefore>
__device__ __forceinline__ Acc scan_block(Acc warp_y, Acc warp_c, StateBefore&& state_before, bool rev,
                                          BlockScanStorage<Acc>& storage) {
  constexpr int kWarps = NT / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int last_lane = rev ? 0 : kWarpSize - 1;  // holds the warp's inclusive total
  if (lane == last_lane) {
    storage.warp_y[warp] = warp_y;
    storage.warp_c[warp] = warp_c;
  }
  __syncthreads();
  if (warp == 0) {
    // Lane k takes the k-th warp in logical order; a plain forward scan over lanes.
    const int src = rev ? kWarps - 1 - lane : lane;
    Acc y = lane < kWarps ? storage.warp_y[src] : Acc(0);
    Acc c = lane < kWarps ? storage.warp_c[src] : Acc(1);
#pragma unroll
    for (int delta = 1; delta < kWarps; delta *= 2) {
      const Acc prev_y = __shfl_up_sync(kFullMask, y, delta);
      const Acc prev_c = __shfl_up_sync(kFullMask, c, delta);
      if (lane >= delta) {
        y = c * prev_y + y;
        c = c * prev_c;
      }
    }
    const Acc carry = state_before(__shfl_sync(kFullMask, y, kWarps - 1), __shfl_sync(kFullMask, c, kWarps - 1));
    // State before warp `lane` = (inclusive total of warps before it) applied to the carry.
    Acc ex_y = __shfl_up_sync(kFullMask, y, 1);
    Acc ex_c = __shfl_up_sync(kFullMask, c, 1);
    if (lane == 0) {
      ex_y = Acc(0);
      ex_c = Acc(1);
    }
    if (lane < kWarps) storage.warp_prefix[src] = ex_c * carry + ex_y;
    if (lane == kWarps - 1) storage.carry = c * carry + y;
  }
  __syncthreads();
  return storage.warp_prefix[warp];
}

// scan_tile whose entering state comes from state_before(tile total) (see scan_block);
// `carry` is used by the ablation levels only, and receives the state after the tile.
template <AlgoCode Algo, int E, int NT, typename Acc, typename StateBefore>
__device__ __forceinline__ void scan_tile_resolved(Acc (&y)[E], Acc (&c)[E], bool rev, Acc& carry,
                                                   BlockScanStorage<Acc>& storage, StateBefore&& state_before) {
  if constexpr (Algo == AlgoCode::kLoadStore) return;
  Acc total_y, total_c;
  scan_thread(y, c, rev, total_y, total_c);
  Acc before_thread = carry;  // state before this thread's first element
  if constexpr (Algo >= AlgoCode::kWarp) {
    Acc ex_y, ex_c;
    scan_warp(total_y, total_c, rev, ex_y, ex_c);
    Acc before_warp = carry;
    if constexpr (Algo == AlgoCode::kBlock) {
      before_warp = scan_block<NT>(total_y, total_c, state_before, rev, storage);
      carry = storage.carry;
    }
    before_thread = ex_c * before_warp + ex_y;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) y[i] = c[i] * before_thread + y[i];
}

// The whole tile scan at the level `Algo`, entered with the state `carry`. On
// return y[i] holds the recurrence's outputs and `carry` the state after the
// tile (for kBlock; lower levels are ablations and leave the carry unchanged).
template <AlgoCode Algo, int E, int NT, typename Acc>
__device__ __forceinline__ void scan_tile(Acc (&y)[E], Acc (&c)[E], bool rev, Acc& carry,
                                          BlockScanStorage<Acc>& storage) {
  const Acc known = carry;
  scan_tile_resolved<Algo, E, NT>(y, c, rev, carry, storage, [known](Acc, Acc) { return known; });
}

}  // namespace linrec

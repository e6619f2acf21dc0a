// Single-pass chained scan across blocks: decoupled look-back (Merrill & Garland,
// "Single-pass Parallel Prefix Scan with Decoupled Look-back", 2016), over the
// recurrence's transforms s -> c * s + y.
//
// Each block scans one tile of a sequence. As soon as it knows its tile's total
// transform it publishes it (kAggregate); once it knows the state before the
// tile it publishes the state after it (kInclusive). To find its entering state,
// warp 0 reads the statuses of its 32 nearest predecessors at once, composes
// the transforms up to the nearest inclusive one, and moves on by that window
// if none is inclusive yet. A block waits only on blocks that already started,
// so nothing deadlocks: tiles are numbered by block index, and blocks start in
// increasing index order.
#pragma once
#include <cstdint>

#include "../../memio.h"
#include "complex.cuh"

namespace linrec {

enum TileFlag : int { kNotReady = 0, kAggregate = 1, kInclusive = 2 };

// What a reader learns from one status: the flag and a transform s -> c * s + y
// (for kInclusive the constant transform: c = 0, y = the state after the tile).
template <typename Acc>
struct StatusValue {
  int flag;
  Acc y, c;
};

// One status per tile, zeroed before the launch. With a 4-byte accumulator a
// status is two 8-byte words, (flag, y) and (flag, c), each written and read
// whole: an aligned 8-byte access is single-copy atomic, while the PTX memory
// model treats the elements of a vector access as separate accesses. A reader
// that finds the same flag in both words has a consistent transform, so neither
// side needs a memory fence, and each fence is a round trip to L2 on the path
// every later tile waits on. Wider
// accumulators (float64, complex) keep the aggregate and the inclusive value in their
// own fields, ordered by fences, so a reader that saw kAggregate never reads a
// value that was overwritten after it.
template <typename Acc, bool kTwoWords = sizeof(Acc) == 4>
struct TileStatus;

template <typename Acc>
struct alignas(16) TileStatus<Acc, true> {
  unsigned long long flag_y, flag_c;  // flag in the low half, the value's bits in the high half
};

template <typename Acc>
struct TileStatus<Acc, false> {
  int flag;
  Acc aggregate_y, aggregate_c, inclusive;
};

// The workspace: the statuses of all tiles, zeroed before the launch (workspace.cuh).
struct ChainWorkspaceLayout {
  template <typename Acc>
  static int64_t bytes(int64_t num_tiles) {
    return num_tiles * static_cast<int64_t>(sizeof(TileStatus<Acc>));
  }
  template <typename Acc>
  static __device__ __forceinline__ TileStatus<Acc>* statuses(void* base) {
    return static_cast<TileStatus<Acc>*>(base);
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// The L2 policy of status writes and loads (not of the atomic reads, see
// StatusRead): evicted last. The tiles stream through L2 at the full DRAM rate
// while their statuses are polled; the hint ranks the statuses above that
// stream. Measured, not traced: H100, one sequence of 2^26, forward kernel µs
// fp32 299 -> 295, bf16 154 -> 152 (docs/design/0002-chained-lookback-statuses.md).
__device__ __forceinline__ unsigned long long status_cache_policy() {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
#endif

// Publishes (flag, y, c); for kInclusive, y is the state after the tile.
template <typename Acc>
__device__ __forceinline__ void publish(TileStatus<Acc>* status, TileFlag flag, Acc y, Acc c) {
  if constexpr (sizeof(Acc) == 4) {
    const auto word = [flag](Acc v) {
      return static_cast<unsigned long long>(static_cast<unsigned>(flag)) |
             (static_cast<unsigned long long>(__float_as_uint(v)) << 32);
    };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("st.relaxed.gpu.global.L2::cache_hint.v2.u64 [%0], {%1, %2}, %3;" ::"l"(status), "l"(word(y)),
                 "l"(word(c)), "l"(status_cache_policy())
                 : "memory");
#else
    asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(status), "l"(word(y)), "l"(word(c))
                 : "memory");
#endif
  } else {
    if (flag == kAggregate) {
      status->aggregate_y = y;
      status->aggregate_c = c;
    } else {
      status->inclusive = y;
    }
    __threadfence();  // the values become visible before the flag
    atomicExch(&status->flag, static_cast<int>(flag));
  }
}

// How a look-back reads a status. The chained kernels, when their tiles fill
// more than one wave, read theirs with an atomic: a 16-byte compare-and-swap of
// 0 with 0, which leaves every status as it is (a status is 0 only until it is
// published) and returns all 16 bytes. Measured on the H100 against the relaxed
// load, one run (kernel µs at 1 x 2^24 / 2^26): fp32 forward 78.3 /
// 294.5 -> 75.2 / 279.4, backward 121.7 / 476.1 -> 117.4 / 456.1; bf16 forward
// 43.2 / 152.3 -> 42.0 / 143.8. Not traced; the likely reading is that a load
// queues behind its SM's tile copies on the way to L2 and an atomic does not.
// A single wave, whose tiles all poll together after their copies land, was
// slower with it (1 x 2^22 bf16 forward 10.5 -> 11.6 µs) and keeps the load, as
// do the strided kernels, whose status reads are few ((8, 4096, 2048) over dim
// 1, fp32 forward 283 -> 288 µs a call with it). The atomic needs sm_90; before
// it, both are loads.
enum class StatusRead { kLoad, kAtomic };

// A relaxed load of a two-word status (evict-last from sm_80, see status_cache_policy).
template <typename Acc>
__device__ __forceinline__ void load_status_words(const TileStatus<Acc>* status, unsigned long long& flag_y,
                                                  unsigned long long& flag_c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ld.relaxed.gpu.global.L2::cache_hint.v2.u64 {%0, %1}, [%2], %3;"
               : "=l"(flag_y), "=l"(flag_c)
               : "l"(status), "l"(status_cache_policy())
               : "memory");
#else
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(flag_y), "=l"(flag_c) : "l"(status) : "memory");
#endif
}

// One read of a status; its flag is kNotReady until it is ready and whole.
template <StatusRead kRead, typename Acc>
__device__ __forceinline__ StatusValue<Acc> read_status(const TileStatus<Acc>* status) {
  if constexpr (sizeof(Acc) == 4) {
    unsigned long long flag_y, flag_c;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (kRead == StatusRead::kAtomic) {
      asm volatile(
          "{\n\t.reg .b128 old, zero;\n\tmov.b128 zero, {%2, %2};\n\t"
          "atom.relaxed.gpu.global.cas.b128 old, [%3], zero, zero;\n\tmov.b128 {%0, %1}, old;\n\t}"
          : "=l"(flag_y), "=l"(flag_c)
          : "l"(0ull), "l"(status)
          : "memory");
    } else {
      load_status_words(status, flag_y, flag_c);
    }
#else
    load_status_words(status, flag_y, flag_c);
#endif
    const int flag = static_cast<int>(static_cast<unsigned>(flag_y));
    // Not a torn (aggregate, inclusive) mix; the atomic read cannot tear, the load can.
    const bool whole = flag == static_cast<int>(static_cast<unsigned>(flag_c));
    return {whole ? flag : int(kNotReady), __uint_as_float(static_cast<unsigned>(flag_y >> 32)),
            __uint_as_float(static_cast<unsigned>(flag_c >> 32))};
  } else {
    const volatile TileStatus<Acc>* s = status;
    const int flag = s->flag;
    if (flag == kNotReady) return {flag, Acc(0), Acc(1)};
    __threadfence();  // the values are read after the flag
    if (flag == kInclusive) return {flag, load_volatile(s->inclusive), Acc(0)};
    return {flag, load_volatile(s->aggregate_y), load_volatile(s->aggregate_c)};
  }
}

// A status once it is ready. Waiting readers back off (sleeping 32 ns, doubling
// up to kMaxBackoffNs) so their polling leaves L2 to the tiles' loads; the cap
// bounds how late a waiter notices the status it waits for.
constexpr unsigned kMaxBackoffNs = 256;

template <StatusRead kRead, typename Acc>
__device__ __forceinline__ StatusValue<Acc> wait_status(const TileStatus<Acc>* status) {
  StatusValue<Acc> v = read_status<kRead>(status);
  for (unsigned ns = 32; v.flag == kNotReady; ns = ns < kMaxBackoffNs ? 2 * ns : ns) {
    __nanosleep(ns);
    v = read_status<kRead>(status);
  }
  return v;
}

// Tile k's status is statuses[k * kTileStatusSpacing]: 64 bytes apart rather
// than packed 16 bytes apart. Every waiting block polls the few statuses just
// behind the newest tiles; packed, they share one or two L2 lines, and the
// slices holding those lines serialize the polls. Measured on the H100, 1 x 2^24:
// fp32 0.64 -> 0.68 of copy forward, bf16 0.49 -> 0.53.
constexpr int kTileStatusSpacing = 4;

// The first wave of tiles, loaded in order. All resident blocks start at once
// and copy their tiles together, so the tiles finish loading in no particular
// order, about when the last one does; none can resolve before all tiles ahead
// of it are loaded, and no new tile starts loading until some resolve and end.
// Measured on the H100 (1 x 2^22 fp32, timestamps a tile): loads done 4-13 µs
// into the kernel, tiles resolved at 15-18 µs, no reads in between. So the
// first wave takes turns, two ways (later tiles start only as others end, in
// order already):
//   - Past the first `lead` tiles, a tile waits for the tile `lead` before it
//     to publish its aggregate before it loads. Kernel time, 1 x 2^24, a lead
//     of half the first wave: fp32 forward 84 -> 80 µs, backward 136 -> 128;
//     bf16 49 -> 44.5, 84 -> 79.
//   - Tile n waits until n * pace_ps after its block started (%globaltimer),
//     so the wave's loads are issued in tile order at about the DRAM's rate
//     (chained_schedule) and the first tiles land first. H100, kernel µs at
//     1 x 2^24 / 2^26 (with the lead, one run): fp32 forward 75.3 /
//     280.0 -> 74.1 / 278.1, bf16 42.1 / 144.1 -> 40.6 / 142.9; backward
//     within 0.7 µs. A model on per-tile timestamps (not a counter) put DRAM
//     at 0.76-0.78 of copy from 1 to 5 µs without it, 0.93-0.98 from 2 to
//     4 µs with it (8 ns a tile).
// Called by the whole block; status_index(n) is where tile number n's status lies.
template <typename Acc, typename StatusIndex>
__device__ __forceinline__ void wait_for_turn(void* workspace, int64_t number, const ChainSchedule& schedule,
                                              StatusIndex status_index) {
  if (number >= schedule.first_wave) return;
  if (threadIdx.x == 0) {
    if (schedule.pace_ps > 0) {
      auto now_ns = [] {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        return t;
      };
      const unsigned long long turn = now_ns() + static_cast<unsigned long long>(number * schedule.pace_ps / 1000);
      while (now_ns() < turn) __nanosleep(32);
    }
    if (schedule.lead > 0 && number >= schedule.lead) {  // lead 0 (a first wave of one tile): no tile to wait on
      const TileStatus<Acc>* statuses = ChainWorkspaceLayout::statuses<Acc>(workspace);
      wait_status<StatusRead::kAtomic>(statuses + status_index(number - schedule.lead) * kTileStatusSpacing);
    }
  }
  __syncthreads();
}

// The state before tile k of a sequence whose tiles' statuses are `statuses`,
// given this tile's total transform (total_y, total_c) and the state before the
// sequence. Called by all 32 lanes of one warp; publishes this tile's statuses.
// Statuses are read as kRead says.
// Lane L reads predecessor end - L of the current window; lanes past the
// nearest inclusive status need not wait for theirs. (A window of 8 statuses a
// lane was measured slower on the H100: every waiting warp polls 8x the flags.)
template <StatusRead kRead, typename Acc>
__device__ __forceinline__ Acc look_back(TileStatus<Acc>* statuses, int64_t k, Acc total_y, Acc total_c,
                                         Acc initial) {
  const int lane = threadIdx.x % kWarpSize;
  if (k == 0) {
    if (lane == 0) publish(&statuses[0], kInclusive, total_c * initial + total_y, Acc(0));
    return initial;
  }
  if (lane == 0) publish(&statuses[k * kTileStatusSpacing], kAggregate, total_y, total_c);
  // Transform of the tiles between the current window and k: s -> known_c * s + known_y.
  Acc known_y = Acc(0), known_c = Acc(1);
  for (int64_t end = k - 1;; end -= kWarpSize) {
    // Tile 0 is always inclusive, so lanes before it are never composed.
    const int64_t p = end - lane;
    StatusValue<Acc> s = p >= 0 ? read_status<kRead>(&statuses[p * kTileStatusSpacing])
                                : StatusValue<Acc>{kInclusive, Acc(0), Acc(0)};
    const unsigned seen = __ballot_sync(kFullMask, s.flag == kInclusive);
    const int bound = seen ? __ffs(seen) - 1 : kWarpSize;  // lanes nearer than the nearest inclusive seen
    if (s.flag == kNotReady && lane < bound) s = wait_status<kRead>(&statuses[p * kTileStatusSpacing]);
    const unsigned inclusive = __ballot_sync(kFullMask, s.flag == kInclusive);
    const int last = inclusive ? __ffs(inclusive) - 1 : kWarpSize - 1;  // the nearest lane with an inclusive
    Acc y = lane <= last ? s.y : Acc(0), c = lane <= last ? s.c : Acc(1);
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
  if (lane == 0) publish(&statuses[k * kTileStatusSpacing], kInclusive, total_c * known_y + total_y, Acc(0));
  return known_y;
}

// The per-thread variant of look_back, for kernels where every thread scans its
// own V adjacent sequences (strided.cuh): the states before chunk k of them,
// whose chunk statuses are statuses[j], statuses[stride + j], ... for sequence
// j. Reads the nearest chunk's status first (usually inclusive: chunks are
// numbered chunk-major), then walks back a few chunks a step. The V first
// reads are issued together.
template <int V, typename Acc>
__device__ __forceinline__ void look_back_thread(TileStatus<Acc>* statuses, int64_t stride, int64_t k,
                                                 const Acc (&total_y)[V], const Acc (&total_c)[V],
                                                 const Acc (&initial)[V], Acc (&state)[V]) {
  if (k == 0) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      publish(&statuses[j], kInclusive, total_c[j] * initial[j] + total_y[j], Acc(0));
      state[j] = initial[j];
    }
    return;
  }
  // Chunks are numbered chunk-major, so the predecessor has usually finished:
  // then this chunk publishes its inclusive status only.
  StatusValue<Acc> first[V];
#pragma unroll
  for (int j = 0; j < V; ++j) first[j] = read_status<StatusRead::kLoad>(&statuses[(k - 1) * stride + j]);
#pragma unroll
  for (int j = 0; j < V; ++j)
    if (first[j].flag != kInclusive) publish(&statuses[k * stride + j], kAggregate, total_y[j], total_c[j]);
  // Past the nearest chunk the walk reads kWindow statuses a step. Chains of
  // thousands of chunks (channel-last data with few channels and long T) keep
  // many unresolved chunks between a chunk and the nearest inclusive one, and
  // one status a round trip was the whole lag there. H100, µs fwd / fwd+bwd,
  // windows of 1 / 4 / 8 (tools/ab_builds.sh with python -m tools shape-sweep, one
  // run): (1, 2^20, 16) over dim 1 fp32 164.9 / 146.5 / 167.2 and 393.9 /
  // 343.9 / 382.9, bf16 237.2 / 188.6 / 270.0; (4, 2^18, 64) bf16 205.5 / 191.5 /
  // 230.9; the bench's (8, 4096, 2048), whose chains are 32 chunks, within 1%.
  constexpr int kWindow = 4;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    Acc known_y = Acc(0), known_c = Acc(1);  // the chunks between p and k: s -> known_c * s + known_y
    // Composes chunk p's status into `known`; true once it was inclusive.
    auto compose = [&](StatusValue<Acc> s, int64_t p) {
      if (s.flag == kNotReady) s = wait_status<StatusRead::kLoad>(&statuses[p * stride + j]);
      known_y = known_c * s.y + known_y;
      known_c = known_c * s.c;
      return s.flag == kInclusive;
    };
    if (!compose(first[j], k - 1)) {
      for (int64_t end = k - 2;; end -= kWindow) {
        StatusValue<Acc> w[kWindow];
#pragma unroll
        for (int i = 0; i < kWindow; ++i)
          w[i] = end - i >= 0 ? read_status<StatusRead::kLoad>(&statuses[(end - i) * stride + j])
                              : StatusValue<Acc>{kInclusive, Acc(0), Acc(0)};
        bool done = false;
#pragma unroll
        for (int i = 0; i < kWindow; ++i)
          if (!done) done = compose(w[i], end - i);
        if (done) break;
      }
    }
    // known_c is now 0: the state is known_y.
    publish(&statuses[k * stride + j], kInclusive, total_c[j] * known_y + total_y[j], Acc(0));
    state[j] = known_y;
  }
}

}  // namespace linrec

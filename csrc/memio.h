// Moving tiles between global memory and registers.
//
// A tile is tile_len = E * NT consecutive elements of one sequence, starting at
// `tile_start`; thread t owns the E elements at tile_start + t*E + [0, E).
// Positions at or past `len` read as `fill` and are never written. Values are
// held in registers in the arithmetic type Acc. Three strategies (MemCode):
//   kDirect    each thread reads its own elements, one at a time, any stride;
//   kVector    the same, 16 bytes (or E*sizeof(T) if smaller) per access, when
//              the sequence is unit-stride and the thread's chunk is aligned
//              and whole; otherwise element by element, so misaligned starts
//              and tails never fault;
//   kCoalesced each warp reads its 32*E elements with consecutive lanes on
//              consecutive elements and transposes them through shared memory
//              (Acc words, one pad word per 32, so the thread-major reads hit
//              32 different banks).
// Shifted windows (the backward's "one step later / earlier") are built from
// registers already loaded: a shuffle from the neighbouring lane, plus one
// direct load at the warp's edge.
#pragma once
#include <cstdint>
#include <type_traits>

#include "config.h"
#include "kernels/primitives/dtype.cuh"

namespace linrec {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;

// Shared-memory words the coalesced strategy needs for one tile.
template <int E, int NT>
constexpr int coalesced_smem_words() {
  return NT * E + (NT * E) / kWarpSize;
}
__device__ __forceinline__ int pad_index(int j) { return j + j / kWarpSize; }

template <int Bytes> struct VecOf;
template <> struct VecOf<16> { using type = uint4; };
template <> struct VecOf<8> { using type = uint2; };
template <> struct VecOf<4> { using type = unsigned int; };
template <> struct VecOf<2> { using type = unsigned short; };

// Bytes per vector access for a chunk of E elements of T.
template <typename T, int E>
constexpr int vec_bytes() {
  constexpr int chunk = E * static_cast<int>(sizeof(T));
  return chunk >= 16 ? 16 : chunk >= 8 ? 8 : chunk >= 4 ? 4 : 2;
}

template <int E, typename T, typename Acc>
__device__ __forceinline__ void load_direct(Acc (&dst)[E], const T* seq, int64_t stride, int64_t first,
                                            int64_t len, Acc fill) {
#pragma unroll
  for (int i = 0; i < E; ++i) dst[i] = first + i < len ? to_acc<Acc>(seq[(first + i) * stride]) : fill;
}

template <int E, typename T, typename Acc>
__device__ __forceinline__ void store_direct(T* seq, int64_t stride, const Acc (&src)[E], int64_t first,
                                             int64_t len) {
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (first + i < len) seq[(first + i) * stride] = from_acc<T>(src[i]);
}

template <int E, typename T>
__device__ __forceinline__ bool vector_ok(const T* seq, int64_t stride, int64_t first, int64_t len) {
  constexpr int kBytes = vec_bytes<T, E>();
  return stride == 1 && first + E <= len && (E * sizeof(T)) % kBytes == 0 &&
         reinterpret_cast<uintptr_t>(seq + first) % kBytes == 0;
}

// E elements from `src`, which is aligned to vec_bytes<T, E>() and holds them all.
template <int E, typename T, typename Acc>
__device__ __forceinline__ void load_aligned(Acc (&dst)[E], const T* src) {
  using Vec = typename VecOf<vec_bytes<T, E>()>::type;
  constexpr int kPerVec = sizeof(Vec) / sizeof(T);
#pragma unroll
  for (int v = 0; v < E / kPerVec; ++v) {
    const Vec raw = reinterpret_cast<const Vec*>(src)[v];
    const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kPerVec; ++i) dst[v * kPerVec + i] = to_acc<Acc>(elems[i]);
  }
}

template <int E, typename T, typename Acc>
__device__ __forceinline__ void store_aligned(T* dst, const Acc (&src)[E]) {
  using Vec = typename VecOf<vec_bytes<T, E>()>::type;
  constexpr int kPerVec = sizeof(Vec) / sizeof(T);
#pragma unroll
  for (int v = 0; v < E / kPerVec; ++v) {
    Vec raw;
    T* elems = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kPerVec; ++i) elems[i] = from_acc<T>(src[v * kPerVec + i]);
    reinterpret_cast<Vec*>(dst)[v] = raw;
  }
}

template <int E, typename T, typename Acc>
__device__ __forceinline__ void load_vector(Acc (&dst)[E], const T* seq, int64_t stride, int64_t first,
                                            int64_t len, Acc fill) {
  if (!vector_ok<E>(seq, stride, first, len)) return load_direct(dst, seq, stride, first, len, fill);
  load_aligned(dst, seq + first);
}

template <int E, typename T, typename Acc>
__device__ __forceinline__ void store_vector(T* seq, int64_t stride, const Acc (&src)[E], int64_t first,
                                             int64_t len) {
  if (!vector_ok<E>(seq, stride, first, len)) return store_direct(seq, stride, src, first, len);
  store_aligned(seq + first, src);
}

// `warp_smem` is this warp's private slice of coalesced_smem_words<E, 32>() words.
template <int E, typename T, typename Acc>
__device__ __forceinline__ void load_coalesced(Acc (&dst)[E], const T* seq, int64_t stride,
                                               int64_t warp_first, int64_t len, Acc fill, Acc* warp_smem) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int r = 0; r < E; ++r) {
    const int j = r * kWarpSize + lane;
    const int64_t pos = warp_first + j;
    warp_smem[pad_index(j)] = pos < len ? to_acc<Acc>(seq[pos * stride]) : fill;
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < E; ++i) dst[i] = warp_smem[pad_index(lane * E + i)];
  __syncwarp();  // the buffer is refilled by the next call
}

template <int E, typename T, typename Acc>
__device__ __forceinline__ void store_coalesced(T* seq, int64_t stride, const Acc (&src)[E],
                                                int64_t warp_first, int64_t len, Acc* warp_smem) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int i = 0; i < E; ++i) warp_smem[pad_index(lane * E + i)] = src[i];
  __syncwarp();
#pragma unroll
  for (int r = 0; r < E; ++r) {
    const int j = r * kWarpSize + lane;
    const int64_t pos = warp_first + j;
    if (pos < len) seq[pos * stride] = from_acc<T>(warp_smem[pad_index(j)]);
  }
  __syncwarp();
}

// This thread's E elements of the tile at tile_start, by strategy M.
template <MemCode M, int E, typename T, typename Acc>
__device__ __forceinline__ void load_tile(Acc (&dst)[E], const T* seq, int64_t stride, int64_t tile_start,
                                          int64_t len, Acc fill, Acc* smem) {
  const int64_t first = tile_start + static_cast<int64_t>(threadIdx.x) * E;
  if constexpr (M == MemCode::kDirect) {
    load_direct(dst, seq, stride, first, len, fill);
  } else if constexpr (M == MemCode::kVector) {
    load_vector(dst, seq, stride, first, len, fill);
  } else {
    const int warp = threadIdx.x / kWarpSize;
    load_coalesced(dst, seq, stride, tile_start + static_cast<int64_t>(warp) * kWarpSize * E, len, fill,
                   smem + warp * coalesced_smem_words<E, kWarpSize>());
  }
}

template <MemCode M, int E, typename T, typename Acc>
__device__ __forceinline__ void store_tile(T* seq, int64_t stride, const Acc (&src)[E], int64_t tile_start,
                                           int64_t len, Acc* smem) {
  const int64_t first = tile_start + static_cast<int64_t>(threadIdx.x) * E;
  if constexpr (M == MemCode::kDirect) {
    store_direct(seq, stride, src, first, len);
  } else if constexpr (M == MemCode::kVector) {
    store_vector(seq, stride, src, first, len);
  } else {
    const int warp = threadIdx.x / kWarpSize;
    store_coalesced(seq, stride, src, tile_start + static_cast<int64_t>(warp) * kWarpSize * E, len,
                    smem + warp * coalesced_smem_words<E, kWarpSize>());
  }
}

// kStaged (chained kernels): the block copies a tensor's whole tile into shared
// memory in the storage type, 16 bytes a thread at a time with cp.async, so no
// register waits on the load; threads then read their elements from there.
// Thread t's E elements form row t, followed by 16 bytes of padding so that
// neighbouring rows start in different banks.
template <typename T, int E>
constexpr int staged_row_bytes() {
  static_assert(E * sizeof(T) % 16 == 0, "a staged row is whole 16-byte chunks");
  return E * static_cast<int>(sizeof(T)) + 16;
}

template <typename T, int E, int NT>
constexpr int staged_tile_bytes() {
  return NT * staged_row_bytes<T, E>();
}

// Element e (0 <= e < E * NT) of a staged tile.
template <typename T, int E>
__device__ __forceinline__ T& staged_at(unsigned char* tile, int e) {
  return reinterpret_cast<T*>(tile + (e / E) * staged_row_bytes<T, E>())[e % E];
}

// An asynchronous copy of kBytes (4, 8 or 16) from global to shared memory.
// 16-byte copies bypass L1 (.cg); smaller ones may only go through it (.ca).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(gmem) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(to), "l"(gmem), "n"(kBytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory"); }

// Asks L2 to fetch [first, first + count) of a global array ahead of its use
// (sm_90 bulk prefetch; a hint, nothing waits on it; no-op before sm_90). Only
// a range of whole 16-byte words, as the instruction takes, is prefetched.
template <typename T>
__device__ __forceinline__ void prefetch_l2(const T* first, int64_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
  if (count <= 0 || reinterpret_cast<uintptr_t>(first) % 16 != 0 || bytes % 16 != 0) return;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(first), "r"(static_cast<unsigned>(bytes))
               : "memory");
#endif
}

// Copies the tile at `start` of `seq` into `tile`: asynchronously when it is
// unit-stride, 16-byte aligned and whole, by one load when the stride is 0, else
// element by element (`fill` past len). Wait for it with cp_async_wait, then a
// block barrier.
template <int E, int NT, typename T>
__device__ __forceinline__ void stage_tile(unsigned char* tile, const T* seq, int64_t stride, int64_t start,
                                           int64_t len, T fill) {
  constexpr int kTileLen = E * NT;
  constexpr int kChunk = 16 / static_cast<int>(sizeof(T));  // elements a 16-byte copy
  constexpr int kChunksPerRow = E / kChunk;
  if (stride == 1 && start + kTileLen <= len && reinterpret_cast<uintptr_t>(seq + start) % 16 == 0) {
#pragma unroll
    for (int k = threadIdx.x; k < NT * kChunksPerRow; k += NT)
      cp_async<16>(tile + (k / kChunksPerRow) * staged_row_bytes<T, E>() + (k % kChunksPerRow) * 16,
                  seq + start + static_cast<int64_t>(k) * kChunk);
  } else if (stride == 0) {
    // One value along the whole sequence (coefficients broadcast over time, a
    // d_outputs of ones from y.sum()): one load, then each thread fills its own
    // row 16 bytes at a time, `fill` past len, rather than E loads and 2- or
    // 4-byte stores a thread.
    const T value = seq[0];
    unsigned char* row = tile + threadIdx.x * staged_row_bytes<T, E>();
#pragma unroll
    for (int j = 0; j < kChunksPerRow; ++j) {
      uint4 chunk;
      T* v = reinterpret_cast<T*>(&chunk);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = start + threadIdx.x * E + j * kChunk + i < len ? value : fill;
      reinterpret_cast<uint4*>(row)[j] = chunk;
    }
  } else {
    for (int e = threadIdx.x; e < kTileLen; e += NT) {
      const int64_t pos = start + e;
      staged_at<T, E>(tile, e) = pos < len ? seq[pos * stride] : fill;
    }
  }
}

// Stores a staged tile to the tile at `start` of `seq` (positions past len are
// not written): 16 bytes a thread when unit-stride, aligned and whole.
template <int E, int NT, typename T>
__device__ __forceinline__ void store_staged_tile(T* seq, int64_t stride, const unsigned char* tile, int64_t start,
                                                  int64_t len) {
  constexpr int kTileLen = E * NT;
  constexpr int kChunk = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunksPerRow = E / kChunk;
  if (stride == 1 && start + kTileLen <= len && reinterpret_cast<uintptr_t>(seq + start) % 16 == 0) {
#pragma unroll
    for (int k = threadIdx.x; k < NT * kChunksPerRow; k += NT)
      *reinterpret_cast<uint4*>(seq + start + static_cast<int64_t>(k) * kChunk) = *reinterpret_cast<const uint4*>(
          tile + (k / kChunksPerRow) * staged_row_bytes<T, E>() + (k % kChunksPerRow) * 16);
  } else {
    for (int e = threadIdx.x; e < kTileLen; e += NT) {
      const int64_t pos = start + e;
      if (pos < len) seq[pos * stride] = staged_at<T, E>(const_cast<unsigned char*>(tile), e);
    }
  }
}

// A tile loaded ahead of its scan (the pipe and chained schedules). Vector and
// direct loads stay in the storage type until `take` converts them: a 16-bit
// tile then holds half the registers, and no conversion waits on a load still
// in flight (converted at the load, a prefetched bf16 tile stalls right where
// it is issued). The coalesced strategy converts as it stages, so it holds Acc.
template <MemCode M, int E, typename T, typename Acc>
struct PrefetchedTile {
  static constexpr bool kRaw = M != MemCode::kCoalesced;
  using Vec = typename VecOf<vec_bytes<T, E>()>::type;
  static constexpr int kPerVec = static_cast<int>(sizeof(Vec) / sizeof(T));
  static constexpr int kVecs = kRaw ? E / kPerVec : 1;
  Vec raw[kVecs];
  Acc converted[kRaw ? 1 : E];

  __device__ __forceinline__ void load(const T* seq, int64_t stride, int64_t tile_start, int64_t len, Acc fill,
                                       Acc* smem) {
    if constexpr (!kRaw) {
      load_tile<M>(converted, seq, stride, tile_start, len, fill, smem);
    } else {
      const int64_t first = tile_start + static_cast<int64_t>(threadIdx.x) * E;
      if (M == MemCode::kVector && vector_ok<E>(seq, stride, first, len)) {
        const Vec* src = reinterpret_cast<const Vec*>(seq + first);
#pragma unroll
        for (int v = 0; v < kVecs; ++v) raw[v] = src[v];
      } else {
        const T fill_t = stored_value<T>(fill);
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          T* elems = reinterpret_cast<T*>(&raw[v]);
#pragma unroll
          for (int i = 0; i < kPerVec; ++i) {
            const int64_t pos = first + v * kPerVec + i;
            elems[i] = pos < len ? seq[pos * stride] : fill_t;
          }
        }
      }
    }
  }

  __device__ __forceinline__ void take(Acc (&dst)[E]) const {
    if constexpr (!kRaw) {
#pragma unroll
      for (int i = 0; i < E; ++i) dst[i] = converted[i];
    } else {
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        const T* elems = reinterpret_cast<const T*>(&raw[v]);
#pragma unroll
        for (int i = 0; i < kPerVec; ++i) dst[v * kPerVec + i] = to_acc<Acc>(elems[i]);
      }
    }
  }
};

// Moves the values in v (this thread's tile elements, at first + i, as loaded
// by load_tile) one position in place: v[i] becomes the sequence's value one
// position after (from_next) or before it, and `fill` where that position lies
// outside [0, len). All 32 lanes of the warp must call this together.
template <int E, typename T, typename Acc>
__device__ __forceinline__ void shift_window(Acc (&v)[E], const T* seq, int64_t stride, int64_t tile_start,
                                             int64_t len, Acc fill, bool from_next) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = tile_start + static_cast<int64_t>(threadIdx.x) * E;
  if (from_next) {
    Acc edge = __shfl_down_sync(kFullMask, v[0], 1);  // the next thread's first element
    if (lane == kWarpSize - 1) edge = first + E < len ? to_acc<Acc>(seq[(first + E) * stride]) : fill;
#pragma unroll
    for (int i = 0; i < E - 1; ++i) v[i] = first + i + 1 < len ? v[i + 1] : fill;
    v[E - 1] = first + E < len ? edge : fill;
  } else {
    Acc edge = __shfl_up_sync(kFullMask, v[E - 1], 1);  // the previous thread's last element
    if (lane == 0) edge = (first >= 1 && first - 1 < len) ? to_acc<Acc>(seq[(first - 1) * stride]) : fill;
#pragma unroll
    for (int i = E - 1; i > 0; --i) v[i] = v[i - 1];
    v[0] = first == 0 ? fill : edge;
  }
}

// shift_window for a sequence held whole by a segment of `width` lanes (the
// packed kernels): lane j of the segment holds positions j*E + [0, E) of a
// sequence of len <= width * E, so every neighbour is in a register of the
// segment and nothing is loaded. All 32 lanes of the warp must call this together.
template <int E, typename Acc>
__device__ __forceinline__ void shift_segment(Acc (&v)[E], int width, int64_t len, Acc fill, bool from_next) {
  const int64_t first = static_cast<int64_t>(threadIdx.x & (width - 1)) * E;  // width is a power of two
  if (from_next) {
    const Acc edge = __shfl_down_sync(kFullMask, v[0], 1, width);  // the next lane's first element
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] = first + i + 1 < len ? (i + 1 < E ? v[i + 1] : edge) : fill;
  } else {
    const Acc edge = __shfl_up_sync(kFullMask, v[E - 1], 1, width);  // the previous lane's last element
#pragma unroll
    for (int i = E - 1; i > 0; --i) v[i] = v[i - 1];
    v[0] = first == 0 ? fill : edge;
  }
}

// Packed sequences (cu_seqlens): cuts[l] != 0 where a segment begins in scan order, l a
// position along the scan dim (the same for every sequence). The recurrence is cut there: the
// coefficient at l reads as 0, in the forward and in the backward (whose scan takes each
// coefficient one forward step later), and its gradient is 0 (the coefficient is not used).
// The state entering a segment comes in through the inputs (linrec/_segments.py).
struct CutAt {
  const uint8_t* cuts;
  int64_t len;
  __device__ __forceinline__ bool operator()(int64_t l) const { return cuts != nullptr && l >= 0 && l < len && cuts[l]; }
};

// Zeroes v[i] where position first + i is cut (a no-op without cuts).
template <int E, typename Acc>
__device__ __forceinline__ void zero_cut(Acc (&v)[E], CutAt cut, int64_t first) {
  if (cut.cuts == nullptr) return;
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (cut(first + i)) v[i] = Acc(0);
}

// The cut flags of a thread's E elements from `first`, loaded with its tile (the strided and
// register-tile chained kernels; the others read bits, PrefetchedCutBits). Flags read one by
// one where each coefficient is used took packed bf16 rows of 32768 to 0.29-0.66 of copy
// (H200, H100), against 0.94-1.00 uncut.
template <int E>
struct CutFlags {
  static_assert(E <= 64, "one bit an element");
  using Bits = std::conditional_t<(E > 32), uint64_t, uint32_t>;
  Bits bits = 0;  // bit i: element first + i is cut
  // One vector access where the E flags are whole and aligned: a load instruction a flag
  // outnumbers the tile's own loads.
  __device__ __forceinline__ void load(CutAt cut, int64_t first) {
    if (cut.cuts == nullptr) return;
    constexpr int kBytes = E >= 16 ? 16 : E >= 8 ? 8 : E >= 4 ? 4 : 1;
    using Vec = typename VecOf<kBytes >= 2 ? kBytes : 2>::type;
    if (kBytes >= 4 && first >= 0 && first + E <= cut.len &&
        reinterpret_cast<uintptr_t>(cut.cuts + first) % kBytes == 0) {
#pragma unroll
      for (int v = 0; v < E / kBytes; ++v) {
        const Vec raw = reinterpret_cast<const Vec*>(cut.cuts + first)[v];
        const uint8_t* flags = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
        for (int i = 0; i < kBytes; ++i) bits |= static_cast<Bits>(flags[i] != 0) << (v * kBytes + i);
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < E; ++i) bits |= static_cast<Bits>(cut(first + i)) << i;
  }
  // The same flags in the other order: bit i becomes bit E - 1 - i.
  __device__ __forceinline__ void reverse() {
    if constexpr (E > 32) bits = __brevll(bits) >> (64 - E);
    else bits = __brev(bits) >> (32 - E);
  }
  template <typename Acc>
  __device__ __forceinline__ void apply(Acc (&v)[E]) const {
    if (bits == 0) return;
#pragma unroll
    for (int i = 0; i < E; ++i)
      if ((bits >> i) & 1u) v[i] = Acc(0);
  }
};

// The same cuts packed one bit a step, 32 steps a 32-bit word (bit l % 32 of word l / 32; zero
// past the end, to a whole 64-bit word), as the tile, pipe and staged chained kernels read them:
// the launch packs them (cut_bits.cuh). A thread's E flags, from its first step in a tile, are
// one load (a 64-bit word for E = 64), held as loaded until taken. The byte flags read into
// bits at once (CutFlags::load) made a warp wait for that load where it was issued.
template <int E>
struct PrefetchedCutBits {
  static_assert(E <= 64 && 64 % E == 0, "a thread's flags lie in one word");
  using Word = std::conditional_t<(E > 32), uint64_t, uint32_t>;
  static constexpr int kWordBits = 8 * static_cast<int>(sizeof(Word));
  Word word = 0;
  // first: this thread's first step in a tile; tiles start at multiples of kWordBits steps.
  __device__ __forceinline__ void load(const uint32_t* cut_bits, int64_t first, int64_t len) {
    if (cut_bits != nullptr && first < len)
      word = reinterpret_cast<const Word*>(cut_bits)[static_cast<uint64_t>(first) / kWordBits];  // first >= 0
  }
  __device__ __forceinline__ CutFlags<E> take() const {
    CutFlags<E> flags;
    if constexpr (E == kWordBits) {
      flags.bits = word;
    } else {
      const uint32_t shift = (threadIdx.x * E) % kWordBits;  // first % kWordBits: tiles start at multiples of it
      flags.bits = static_cast<typename CutFlags<E>::Bits>((word >> shift) & ((Word(1) << E) - 1));
    }
    return flags;
  }
};

}  // namespace linrec

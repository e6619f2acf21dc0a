// The selective-scan kernels' memory plan: a lane's K consecutive steps of a (batch, dim, L)
// row (16-byte vectors where the host found the rows aligned), the outputs likewise, float4
// atomics into the d_B and d_C accumulators, and the chunk tiles of per-step B and C that a
// block's warps share in shared memory. kReverse (the scan runs from position L-1 down) is a
// template argument throughout: a run's element order is then fixed at compile time.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../../selective_params.h"
#include "../primitives/dtype.cuh"

namespace linrec::selective {

template <bool kReverse> __device__ __forceinline__ int64_t position(int64_t L, int64_t t) {
  return kReverse ? L - 1 - t : t;
}

// Values and pointers the compiler must take as new where they are used: the scalar paths'
// offsets (opaque) and the inputs a chunk's end reads again (again), so that nothing of them
// is precomputed or kept in registers across the states' loop. Measured with ptxas -v: with
// all three uses, the backward at 4 steps a thread fits its 168 registers; without any of
// them it spills 120 bytes; removing any one alone changes nothing, nor do they at 8 steps.
__device__ __forceinline__ int64_t opaque(int64_t v) {
  asm volatile("" : "+l"(v));
  return v;
}

__device__ __forceinline__ const void* again(const void* p) {
  asm volatile("" : "+l"(p));
  return p;
}

// A run of kN elements of T as whole vectors: 16-byte ones, or one of 8 bytes (4 steps of
// 16-bit values).
template <int kN, typename T>
struct Packed {
  static constexpr int kBytes = kN * sizeof(T);
  static_assert(kBytes % 16 == 0 || kBytes == 8, "a run is whole 16-byte vectors, or 8 bytes");
  using Vec = std::conditional_t<kBytes % 16 == 0, uint4, uint2>;
  static constexpr int kVecs = kBytes / sizeof(Vec);
  Vec v[kVecs];

  __device__ __forceinline__ void load_global(const T* src) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) v[i] = __ldg(reinterpret_cast<const Vec*>(src) + i);
  }
  __device__ __forceinline__ void load_shared(const T* src) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) v[i] = reinterpret_cast<const Vec*>(src)[i];
  }
  __device__ __forceinline__ void store(T* dst) const {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) reinterpret_cast<Vec*>(dst)[i] = v[i];
  }
};

// A packed run to Acc, in reverse order for kReverse. bf16 widens with one integer op an
// element (a shift or a mask of its 32-bit pair).
template <bool kReverse, int kN, typename T, typename Acc>
__device__ __forceinline__ void unpack(const Packed<kN, T>& raw, Acc (&out)[kN]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && std::is_same_v<Acc, float>) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(raw.v);
#pragma unroll
    for (int s = 0; s < kN; s += 2) {
      const float lo = __uint_as_float(w[s / 2] << 16), hi = __uint_as_float(w[s / 2] & 0xffff0000u);
      out[kReverse ? kN - 1 - s : s] = lo;
      out[kReverse ? kN - 2 - s : s + 1] = hi;
    }
  } else {
    const T* v = reinterpret_cast<const T*>(raw.v);
#pragma unroll
    for (int s = 0; s < kN; ++s) out[s] = to_acc<Acc>(v[kReverse ? kN - 1 - s : s]);
  }
}

// Steps t0 .. t0+kN-1 of a row along the sequence (element stride `stride`); zero past the
// end. `vector`: unit stride, and every kN-step run of either direction starts 16-byte
// aligned, so whole runs load as vectors.
template <bool kReverse, int kN, typename T, typename Acc>
__device__ __forceinline__ void load_steps(const T* row, int64_t stride, int64_t L, int64_t t0, bool vector,
                                           Acc (&out)[kN]) {
  if (vector && t0 + kN <= L) {
    Packed<kN, T> raw;
    raw.load_global(row + (kReverse ? L - t0 - kN : t0));
    unpack<kReverse>(raw, out);
    return;
  }
  stride = opaque(stride);
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    const int64_t t = t0 + s;
    out[s] = t < L ? to_acc<Acc>(row[position<kReverse>(L, t) * stride]) : Acc(0);
  }
}

// The inverse of load_steps for a contiguous output row; steps past the end are not stored.
template <bool kReverse, int kN, typename T, typename Acc>
__device__ __forceinline__ void store_steps(T* row, int64_t L, int64_t t0, bool vector, const Acc (&in)[kN]) {
  if (vector && t0 + kN <= L) {
    Packed<kN, T> raw;
    T* v = reinterpret_cast<T*>(raw.v);
#pragma unroll
    for (int s = 0; s < kN; ++s) v[kReverse ? kN - 1 - s : s] = from_acc<T>(in[s]);
    raw.store(row + (kReverse ? L - t0 - kN : t0));
    return;
  }
  const int64_t first = opaque(position<kReverse>(L, t0));
#pragma unroll
  for (int s = 0; s < kN; ++s)
    if (t0 + s < L) row[kReverse ? first - s : first + s] = from_acc<T>(in[s]);
}

// Adds in[s] into the float accumulator `row` at step t0 + s, for the steps before the end.
// `vector`: L is a multiple of 4 and t0 of kN, so float runs add as float4 atomics (sm_90).
template <bool kReverse, int kN, typename Acc>
__device__ __forceinline__ void add_steps(Acc* row, int64_t L, int64_t t0, bool vector, const Acc (&in)[kN]) {
  if constexpr (std::is_same_v<Acc, float> && kN % 4 == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (vector && t0 + kN <= L) {
#pragma unroll
      for (int s = 0; s < kN; s += 4) {
        const float4 v = kReverse ? make_float4(in[s + 3], in[s + 2], in[s + 1], in[s])
                                  : make_float4(in[s], in[s + 1], in[s + 2], in[s + 3]);
        atomicAdd(reinterpret_cast<float4*>(row + (kReverse ? L - t0 - s - 4 : t0 + s)), v);
      }
      return;
    }
#endif
  }
#pragma unroll
  for (int s = 0; s < kN; ++s)
    if (t0 + s < L) atomicAdd(row + position<kReverse>(L, t0 + s), in[s]);
}

// Which rows load and store as 16-byte vectors (the host's checks, launch in selective_scan.cuh).
struct VectorRows {
  bool u = false, delta = false, z = false, d_y = false, bc = false;
  bool out = false;  // the contiguous (batch, dim, L) outputs and the float accumulators
};

// B or C for one call: per step (batch, groups, N, L) in T, or per channel (dim, N) in Acc.
template <typename T, typename Acc>
struct BCRows {
  const void* data;
  StridesBC strides;
  bool per_step, vector;

  // State n's values at steps t0 .. t0+kN-1 for channel d (group g) of batch b.
  template <bool kReverse, int kN>
  __device__ __forceinline__ void load(int64_t b, int64_t d, int64_t g, int n, int64_t L, int64_t t0,
                                       Acc (&out)[kN]) const {
    if (!per_step) {
      const Acc value = static_cast<const Acc*>(data)[d * strides.group + n * strides.state];
#pragma unroll
      for (int s = 0; s < kN; ++s) out[s] = value;  // past the end dt * u = 0 and d_y = 0: no effect
      return;
    }
    const T* row = static_cast<const T*>(data) + b * strides.batch + g * strides.group + n * strides.state;
    load_steps<kReverse>(row, strides.step, L, t0, vector, out);
  }
};

__device__ __forceinline__ void copy_async_16(void* dst, const void* src, bool inside) {
  const unsigned dst_addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst_addr), "l"(src), "r"(inside ? 16 : 0));
}
__device__ __forceinline__ void wait_async_copies() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Per-step B and C of a block's channels. Where both are per step and the block's warps are
// channels of one batch element and group (`tiled`), each chunk's rows load once per block
// into shared tiles, [state][kChunk positions], and the warps read them from there; otherwise
// each warp loads its own from global memory.
template <typename T, typename Acc, int K, int kWarps>
struct BCSource {
  static constexpr int kChunk = 32 * K;
  BCRows<T, Acc> B, C;
  T* tile_B;  // where tiled
  T* tile_C;

  static size_t tile_bytes(const SelectiveParams& p) {
    return p.b_per_step && p.c_per_step ? 2 * p.states * kChunk * sizeof(T) : 0;
  }

  // Starts the block's loads of the chunk at chunk_t0 (all threads); finish_chunk waits.
  template <bool kReverse>
  __device__ __forceinline__ void start_chunk(int64_t b, int64_t g, int N, int64_t L, int64_t chunk_t0) const {
    const int64_t pos_lo = kReverse ? L - chunk_t0 - kChunk : chunk_t0;  // the tiles' first position
    load_tile(tile_B, B, b, g, N, L, pos_lo);
    load_tile(tile_C, C, b, g, N, L, pos_lo);
  }
  __device__ __forceinline__ void finish_chunk() const {
    wait_async_copies();
    __syncthreads();
  }

  // A lane's first step in the tiles of state 0: the lanes walk the states by kChunk.
  template <bool kReverse> __device__ __forceinline__ const T* lane_tile(bool is_C, int lane) const {
    return (is_C ? tile_C : tile_B) + (kReverse ? kChunk - K - lane * K : lane * K);
  }
  template <bool kReverse> static __device__ __forceinline__ void read_tile(const T* at, Acc (&out)[K]) {
    Packed<K, T> raw;
    raw.load_shared(at);
    unpack<kReverse>(raw, out);
  }

 private:
  // Positions pos_lo .. pos_lo + kChunk - 1 of every state's row, zero outside [0, L).
  static __device__ __forceinline__ void load_tile(T* tile, const BCRows<T, Acc>& rows, int64_t b, int64_t g, int N,
                                                   int64_t L, int64_t pos_lo) {
    constexpr int kThreads = 32 * kWarps;
    const T* base = static_cast<const T*>(rows.data) + b * rows.strides.batch + g * rows.strides.group;
    if (rows.vector) {  // whole 16-byte vectors, each inside [0, L) or outside
      constexpr int kPer = 16 / sizeof(T), kVectors = kChunk / kPer;
      // Not unrolled: unrolled, the compiler keeps every pass's addresses in registers across
      // the whole chunk loop (about 70 more registers a thread).
#pragma unroll 1
      for (int v = threadIdx.x; v < N * kVectors; v += kThreads) {
        const int n = v / kVectors, j = v % kVectors * kPer;
        const int64_t pos = pos_lo + j;
        const bool inside = pos >= 0 && pos < L;
        copy_async_16(tile + n * kChunk + j, base + n * rows.strides.state + (inside ? pos : 0), inside);
      }
      return;
    }
#pragma unroll 1
    for (int e = threadIdx.x; e < N * kChunk; e += kThreads) {
      const int n = e / kChunk, j = e % kChunk;
      const int64_t pos = pos_lo + j;
      tile[e] = pos >= 0 && pos < L ? base[n * rows.strides.state + pos * rows.strides.step] : from_acc<T>(0);
    }
  }
};

}  // namespace linrec::selective

// Packing the cuts of packed sequences (one byte a step, memio.h's CutAt) into bits, one a
// step and 32 a word, for the tile, pipe and staged chained kernels (memio.h's
// PrefetchedCutBits). Launched before the scan as the workspace clear is (workspace.cuh): the
// scan starts at once and waits for it.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../../params.h"
#include "grid_launch.cuh"

namespace linrec {

// Each warp reads 32 consecutive flags and writes their ballot as one word; bits past the end are 0.
__global__ void __launch_bounds__(256) pack_cut_bits_kernel(const uint8_t* cuts, uint32_t* bits, int64_t len) {
  allow_dependents_to_launch();
  wait_for_prior_grid();
  const int lane = threadIdx.x % 32;
  const int64_t steps = cut_bit_words(len) * 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;  // a multiple of 32
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x - lane; base < steps; base += stride) {
    const int64_t l = base + lane;
    const unsigned word = __ballot_sync(0xffffffffu, l < len && cuts[l] != 0);
    if (lane == 0) bits[base / 32] = word;
  }
}

// Packs `len` flags at `cuts` into cut_bit_words(len) words at `bits`, on `stream`.
inline void pack_cut_bits(const uint8_t* cuts, uint32_t* bits, int64_t len, cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 1024;  // a grid-stride loop past this
  if (len == 0) return;
  const int64_t blocks = std::min((cut_bit_words(len) * 32 + kThreads - 1) / kThreads, kMaxBlocks);
  launch_kernel<pack_cut_bits_kernel>(dim3(static_cast<unsigned>(blocks)), kThreads, 0, stream, cuts, bits, len);
  check_launch("linrec_pack_cut_bits");
}

}  // namespace linrec

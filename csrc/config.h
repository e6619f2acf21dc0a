// Compile-time kernel configurations, as named structs and enums.
#pragma once
#include <cstdint>
#include <string>

#include "registry.h"  // KernelKind: the kernel families

namespace linrec {

// How a block moves a tile between global memory and registers (memio.h).
enum class MemCode : int {
  kDirect = 0,     // each thread loads its own elements, one by one
  kVector = 1,     // each thread loads its own elements, 16 bytes at a time
  kCoalesced = 2,  // the block loads consecutive elements, staged in shared memory
  kStaged = 3,     // chained kernels only: the whole tile copied into shared memory (cp.async)
};

// Which levels of the block scan run (scan.cuh). Anything below kBlock gives
// wrong results on purpose: the lower levels exist as ablations for tuning.
enum class AlgoCode : int {
  kLoadStore = 0,  // no arithmetic: memory traffic only
  kThread = 1,     // each thread scans its own elements
  kWarp = 2,       // + carries passed between the threads of a warp
  kBlock = 3,      // + carries passed between the warps of a block: the full scan
};

// One compiled instantiation of the tile and pipe kernels.
struct TileConfig {
  int elems_per_thread;
  int threads_per_block;
  MemCode memcode;
  AlgoCode algocode;

  constexpr bool operator==(const TileConfig&) const = default;
  constexpr int tile_len() const { return elems_per_thread * threads_per_block; }

  std::string to_string() const {
    return "TileConfig{elems_per_thread=" + std::to_string(elems_per_thread) +
           ", threads_per_block=" + std::to_string(threads_per_block) +
           ", memcode=" + std::to_string(static_cast<int>(memcode)) +
           ", algocode=" + std::to_string(static_cast<int>(algocode)) + "}";
  }
};

// One compiled instantiation of the selective-scan kernels (kernels/selective_scan.cuh):
// `lanes` threads share a channel and take the sequence `lanes` steps at a time; each
// holds `states_per_lane` of the channel's states, so it takes at most lanes * states_per_lane.
struct SelectiveConfig {
  int lanes;
  int states_per_lane;

  constexpr bool operator==(const SelectiveConfig&) const = default;
  constexpr int max_states() const { return lanes * states_per_lane; }

  std::string to_string() const {
    return "SelectiveConfig{lanes=" + std::to_string(lanes) + ", states_per_lane=" + std::to_string(states_per_lane) +
           "}";
  }
};

}  // namespace linrec

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

// One compiled instantiation of the selective-scan kernels (kernels/selective_scan.cuh): a
// warp takes a channel, each lane `steps_per_thread` consecutive steps of a chunk of
// 32 * steps_per_thread, and a block `warps` channels (whose d_B and d_C it adds before
// the atomics). Any number of states: they go one after another.
struct SelectiveConfig {
  int steps_per_thread;
  int warps;

  constexpr bool operator==(const SelectiveConfig&) const = default;

  std::string to_string() const {
    return "SelectiveConfig{steps_per_thread=" + std::to_string(steps_per_thread) +
           ", warps=" + std::to_string(warps) + "}";
  }
};

}  // namespace linrec

// Run-time to compile-time dispatch of kernel configs.
//
// CONFIG_LIST is the explicit product of the tile configs that get compiled.
// The wheel compiles a small default list; building with LINREC_CONFIGS=full
// (setup.py defines LINREC_FULL_CONFIGS) compiles the whole tuning product.
// Each family names its lists in csrc/registry.toml. `dispatch_config` turns a
// run-time TileConfig into a call of a template instantiated for it. Which
// config a call takes is tuning, kept apart as data (csrc/tuning/).
#pragma once
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "config.h"

namespace linrec {

// Every combination of the given axes, in row-major order.
template <std::size_t NE, std::size_t NT, std::size_t NM, std::size_t NA>
constexpr auto product(std::array<int, NE> elems, std::array<int, NT> threads,
                       std::array<MemCode, NM> memcodes, std::array<AlgoCode, NA> algocodes) {
  std::array<TileConfig, NE * NT * NM * NA> out{};
  std::size_t i = 0;
  for (int e : elems)
    for (int t : threads)
      for (MemCode m : memcodes)
        for (AlgoCode a : algocodes) out[i++] = TileConfig{e, t, m, a};
  return out;
}

template <typename T, std::size_t N, std::size_t M>
constexpr std::array<T, N + M> concat(const std::array<T, N>& a, const std::array<T, M>& b) {
  std::array<T, N + M> out{};
  for (std::size_t i = 0; i < N; ++i) out[i] = a[i];
  for (std::size_t i = 0; i < M; ++i) out[N + i] = b[i];
  return out;
}

constexpr std::array kAllMemCodes{MemCode::kDirect, MemCode::kVector, MemCode::kCoalesced};

#if defined(LINREC_FULL_CONFIGS)
constexpr auto CONFIG_LIST = product(
    std::array{2, 4, 8, 16}, std::array{32, 64, 128, 256, 512, 1024}, kAllMemCodes,
    std::array{AlgoCode::kLoadStore, AlgoCode::kThread, AlgoCode::kWarp, AlgoCode::kBlock});
#else
// The tuned shapes, full scan only. The coalesced strategy never won on the
// H100 and spills at 16 elements per thread in the pipelined backward, so it
// comes at 4 and 8 only. (1024 threads leave 64 registers a thread, too few
// for the pipelined backward without spilling.)
constexpr auto CONFIG_LIST = concat(
    product(std::array{4, 8, 16}, std::array{64, 256}, std::array{MemCode::kDirect, MemCode::kVector},
            std::array{AlgoCode::kBlock}),
    product(std::array{4, 8}, std::array{64, 256}, std::array{MemCode::kCoalesced}, std::array{AlgoCode::kBlock}));
#endif

// The strided kernels (strided.cuh) as TileConfigs: elems_per_thread time steps
// per thread, threads_per_block / 32 warps splitting a chunk of time. Each
// thread loads its own channels' steps, into registers (MemCode::kDirect) or
// into shared memory (MemCode::kStaged), which leaves room for longer slices.
constexpr auto STRIDED_CONFIG_LIST =
    concat(concat(product(std::array{8, 16}, std::array{128, 256, 512}, std::array{MemCode::kDirect},
                          std::array{AlgoCode::kBlock}),
                  product(std::array{16, 32}, std::array{128, 256}, std::array{MemCode::kStaged},
                          std::array{AlgoCode::kBlock})),
           product(std::array{64}, std::array{128}, std::array{MemCode::kStaged}, std::array{AlgoCode::kBlock}));

// The chained kernels take the tile configs, plus tiles staged whole in shared
// memory (MemCode::kStaged): registers then hold no tile while it loads and
// while the block looks back, so an SM keeps more bytes in flight. Complex
// storage is compiled for the staged configs only.
constexpr auto CHAINED_STAGED_CONFIG_LIST =
    concat(product(std::array{16, 32}, std::array{128, 256}, std::array{MemCode::kStaged}, std::array{AlgoCode::kBlock}),
           product(std::array{64}, std::array{128}, std::array{MemCode::kStaged}, std::array{AlgoCode::kBlock}));
constexpr auto CHAINED_CONFIG_LIST = concat(CONFIG_LIST, CHAINED_STAGED_CONFIG_LIST);

// Complex storage (complex64, complex128) takes the tile kernel at the vector
// configs only: a row that is misaligned or strided loads element by element
// in the same kernel. The pipe kernel is not compiled for it (longer complex
// rows take the chained kernels).
constexpr auto COMPLEX_TILE_CONFIG_LIST =
    product(std::array{4, 8, 16}, std::array{64, 256}, std::array{MemCode::kVector}, std::array{AlgoCode::kBlock});

// The packed kernels (packed.cuh): sequences of at most 32 * elems_per_thread
// elements, several to a warp, threads_per_block threads to a block.
constexpr auto PACKED_CONFIG_LIST = product(std::array{4, 8, 16}, std::array{128, 256},
                                            std::array{MemCode::kVector}, std::array{AlgoCode::kBlock});

// The selective-scan kernels (selective_scan.cuh), as (steps_per_thread, warps); the automatic
// choice is in selective_launch.cu.
constexpr std::array SELECTIVE_CONFIG_LIST{SelectiveConfig{8, 4}, SelectiveConfig{4, 4}, SelectiveConfig{8, 8}};

// Calls fn.template operator()<C>() for the compiled config C equal to `config`.
// A fold over the list's indices, not recursion: the full product has 288 entries.
template <auto kList = CONFIG_LIST, typename Fn>
void dispatch_config(const typename std::remove_cvref_t<decltype(kList)>::value_type& config, Fn&& fn,
                     const char* kernel_name) {
  const bool found = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return ((config == kList[I] ? (fn.template operator()<kList[I]>(), true) : false) || ...);
  }(std::make_index_sequence<kList.size()>{});
  if (!found)
    throw std::invalid_argument(std::string("linrec: ") + kernel_name + " is not compiled for " +
                                config.to_string() +
                                "; see linrec.compiled_configs(), or build with LINREC_CONFIGS=full");
}

}  // namespace linrec

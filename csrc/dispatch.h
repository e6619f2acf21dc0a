// Run-time to compile-time dispatch, in one place.
//
// CONFIG_LIST is the explicit product of the tile configs that get compiled.
// The wheel compiles a small default list; building with LINREC_CONFIGS=full
// (setup.py defines LINREC_FULL_CONFIGS) compiles the whole tuning product.
// `dispatch_config` turns a run-time TileConfig into a call of a template
// instantiated for it; `select_config` is the one rule mapping a shape to a kernel.
#pragma once
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
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

// Calls fn.template operator()<C>() for the compiled config C equal to `config`.
// A fold over the list's indices, not recursion: the full product has 288 entries.
template <auto kList = CONFIG_LIST, typename Fn>
void dispatch_config(const TileConfig& config, Fn&& fn, const char* kernel_name) {
  const bool found = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return ((config == kList[I] ? (fn.template operator()<kList[I]>(), true) : false) || ...);
  }(std::make_index_sequence<kList.size()>{});
  if (!found)
    throw std::invalid_argument(std::string("linrec: ") + kernel_name + " is not compiled for " +
                                config.to_string() +
                                "; see linrec.compiled_configs(), or build with LINREC_CONFIGS=full");
}

// The shape -> kernel rule used when the caller asks for KernelKind::kAuto.
// Derived from `python -m linrec.tune` on an H100 (scripts/tune_sweep.sh; README, "Performance").
struct KernelChoice {
  KernelKind kind;
  TileConfig config;
};

// One tile per sequence while it fits, with as few idle threads as the compiled
// configs allow; then pipe. H100, 13200 sequences, device time (python -m
// linrec.tune), float32 and bfloat16 storage each. Float64 takes the float32 rule.
inline KernelChoice select_one_block_per_seq(int64_t seq_len, bool backward, bool storage_16bit) {
  constexpr MemCode kVec = MemCode::kVector;
  constexpr AlgoCode kFull = AlgoCode::kBlock;
  if (storage_16bit) {
    // bf16: tiles up to 1024 forward (13200 x 1024, kernel µs, one device call:
    // 27.9 over aligned rows, 29.8 for the general kernel (pipe, one tile),
    // torch.add 27.2); then pipe, whose prefetched tile stays in bf16 (memio.h):
    // 16x64 (0.95-0.97 of copy forward at 2048-4096), 16x256 forward from 16384
    // (1.00); backward pipe 8x64 up to 2048, then 16x64.
    if (seq_len <= 8 * 64) return {KernelKind::kTile, {8, 64, kVec, kFull}};
    if (backward) return {KernelKind::kPipe, {seq_len <= 2048 ? 8 : 16, 64, kVec, kFull}};
    if (seq_len <= 16 * 64) return {KernelKind::kTile, {16, 64, kVec, kFull}};
    if (seq_len > 8192) return {KernelKind::kPipe, {16, 256, kVec, kFull}};
    return {KernelKind::kPipe, {16, 64, kVec, kFull}};
  }
  // fp32: pipe 4x256 leads the forward past 1024 (0.99-1.00 of copy from 2048 to
  // 16384), pipe 16x64 the backward past 4096 (0.94-0.95). Up to 1024 one tile
  // (13200 x 1024, kernel µs, one device call: tile 4x256 over aligned rows 54.6,
  // pipe 4x256 55.5, torch.add 55.3; the general tile 4x256 55.2, another call).
  if (!backward) {
    if (seq_len <= 8 * 64) return {KernelKind::kTile, {8, 64, kVec, kFull}};
    if (seq_len <= 4 * 256) return {KernelKind::kTile, {4, 256, kVec, kFull}};
    return {KernelKind::kPipe, {4, 256, kVec, kFull}};
  }
  if (seq_len <= 16 * 64) return {KernelKind::kTile, {16, 64, kVec, kFull}};
  if (seq_len <= 8 * 256) return {KernelKind::kTile, {8, 256, kVec, kFull}};
  if (seq_len <= 16 * 256) return {KernelKind::kTile, {16, 256, kVec, kFull}};
  return {KernelKind::kPipe, {16, 64, kVec, kFull}};
}

// Complex storage (complex64, complex128). Channel-last data takes the strided
// kernels, slices staged as for real data; complex128 (16-byte elements) with
// half the threads, so a block's staged slices stay within 64 KB forward. Rows
// take the packed kernels up to 128 elements, the tile kernel up to 1024
// (complex64: 2047), then the chained kernels (staged tiles of 2048 elements:
// 16 KB of complex64 a tensor, as fp32's 32x128). H100, 13200 rows, kernel µs
// fwd / bwd (scripts/config_sweep.py --cold, one device call), complex64 then
// complex128, against torch.add:
//   L = 64    packed 4x128 7.0 / 11.1, 14.4 / 26.6 (add 6.6, 13.3)
//   L = 256   tile 4x64 28.0 / 47.3 (packed 8x128 29.4 / 52.3), 56.2 / 93.3
//             (packed 82.7 / 148.9) (add 27.8, 55.3)
//   L = 512   tile 8x64 56.0 / 93.0 (4x256 55.1 / 105.2); complex128 4x256
//             115.6 / 233.2 (8x64 160.3 / 290.4) (add 54.6, 108.2)
//   L = 1024  tile 4x256 106.9 / 179.6, 217.0 / 376.3; chained 147.2 / 236.3,
//             283.7 / 463.9 (add 108.0, 214.7)
//   L = 2048  chained 216.7 / 368.5, 426.7 / 730.7; tile 8x256 225.5 / 371.1,
//             628.1 / 1126.7 (add 213.9, 428.0)
// Longer rows (complex_bench.py): (1056, 8192) chained 0.86 / 0.90 of copy; (8,
// 4096, 1024) over dim 1 strided 0.87 / 0.93.
inline KernelChoice select_complex_config(int64_t seq_len, bool seqs_interleaved, int elem_bytes) {
  constexpr AlgoCode kFull = AlgoCode::kBlock;
  constexpr MemCode kVec = MemCode::kVector;
  if (seqs_interleaved) {
    if (seq_len < 256) return {KernelKind::kStrided, {8, 128, MemCode::kDirect, kFull}};
    return {KernelKind::kStrided, {16, elem_bytes > 8 ? 128 : 256, MemCode::kStaged, kFull}};
  }
  const bool c128 = elem_bytes > 8;
  if (seq_len <= 128) return {KernelKind::kPacked, {4, 128, kVec, kFull}};
  if (seq_len <= 256) return {KernelKind::kTile, {4, 64, kVec, kFull}};
  if (seq_len <= 512) return {KernelKind::kTile, {c128 ? 4 : 8, c128 ? 256 : 64, kVec, kFull}};
  if (seq_len <= 1024) return {KernelKind::kTile, {4, 256, kVec, kFull}};
  if (seq_len < 2048 && !c128) return {KernelKind::kTile, {8, 256, kVec, kFull}};
  return {KernelKind::kChained, {16, 128, MemCode::kStaged, kFull}};
}

inline KernelChoice select_config(int64_t seq_len, int64_t num_seqs, bool seqs_interleaved, bool backward,
                                  int elem_bytes, int sm_count) {
  constexpr AlgoCode kFull = AlgoCode::kBlock;
  const bool storage_16bit = elem_bytes == 2;
  // Neighbouring sequences nearer in memory than a sequence's own neighbouring
  // elements (channel-last data scanned over T; seqs_interleaved in ops.cpp):
  // lanes on neighbouring channels, time cut into chunks chained by look-back.
  // H100, (4096, 16384) over dim 0, GB/s forward / backward, one device call:
  // slices staged in shared memory, 16x256: fp32 2829 / 2824, bf16 (two
  // channels a lane) 2686 / 2763; in registers at best fp32 2856 / 2848 (two
  // configs), bf16 1312 / 1705 (8x128). Short sequences keep the short chunk.
  // A sequence strided along its length but still nearest itself (x[:, ::2])
  // takes the per-sequence kernels below, which read along it with its stride:
  // H100, (13200, 2048)[:, ::2], µs fwd / fwd+bwd, fp32 454.7 / 571.9 on the
  // strided kernel -> 90.6 / 207.9 (torch.add 89.9), bf16 316.1 / 376.0 -> 63.4 /
  // 126.0 (scripts/shape_sweep.py).
  if (seqs_interleaved) {
    if (seq_len < 256) return {KernelKind::kStrided, {8, 128, MemCode::kDirect, kFull}};
    return {KernelKind::kStrided, {16, 256, MemCode::kStaged, kFull}};
  }
  // Fewer sequences than the GPU has room for blocks (one block per sequence
  // would leave SMs idle), each several tiles long: a block per tile, staged in
  // shared memory, 32x128 for fp32 and 64x128 for 16-bit storage (a tile of the
  // same bytes) both ways. H100, one sequence, kernel µs at 2^22 / 2^24 / 2^26,
  // one device call: fp32 forward 32x128 24.7 / 79.6 / 300.0 (64x128 25.1 /
  // 79.8 / 293.5, 16x256 27.9 / 87.1 / 323.0), backward 38.3 / 125.4 / 484.9
  // (64x128 39.7 / 125.6 / 489.5); bf16 forward 64x128 11.1 / 44.6 / 153.0
  // (32x128 12.5 / 49.0 / 173.3), backward 64x128 19.2 / 69.4 / 247.6 (32x128
  // 21.3 / 74.1 / 270.2, 32x256 19.9 / 72.7 / 270.6). Tiles in registers were
  // slower at 1 x 2^24 (fp32 forward 2037 GB/s against staged 2338, tune).
  //
  // Up to 64 sequences a multiprocessor, from 2 tiles a sequence (fp32) or 4
  // (16-bit), the chained kernel also beats one block per sequence, whose blocks
  // fill the GPU only a few waves deep. H100, µs rule before / chained / torch.add
  // (scripts/shape_sweep.py, two device calls): fp32 forward 264 x 2^16 109.4 /
  // 72.8 / 71.1, 1056 x 2^15 165.1 / 139.7 / 138.1, 8448 x 2^13 284.5 / 278.4 /
  // 275.3; fp32 fwd+bwd 1056 x 2^15 460.7 / 377.9, 8448 x 2^13 776.8 / 753.5;
  // bf16 forward 528 x 2^16 78.6 / 73.3 / 70.2, 2112 x 2^15 145.0 / 140.5 /
  // 137.4 (264 x 2^16 38.8 / 39.9, the one loss); bf16 fwd+bwd 264 x 2^16
  // 122.4 / 103.7, 2112 x 2^15 399.6 / 380.2. At 2 tiles a sequence bf16 is
  // even or slower (2112 x 2^14 forward 72.3 / 73.6). The bench's 13200
  // sequences stay on one block per sequence.
  const int64_t sms = sm_count;
  const TileConfig chained{storage_16bit ? 64 : 32, 128, MemCode::kStaged, kFull};
  const bool few_long = num_seqs < 2 * sms && seq_len >= 16384;
  const bool many_tiles =
      elem_bytes <= 4 && num_seqs < 64 * sms && seq_len >= (storage_16bit ? 4 : 2) * chained.tile_len();
  if (few_long || many_tiles) return {KernelKind::kChained, chained};
  // Short sequences, several to a warp (packed). H100, 13200 sequences, kernel
  // µs fwd / bwd of the aligned-rows kernels, one device call: fp32 4x256 from
  // 16 to 128 (L = 64: 2.5 / 3.6 against 8x128's 2.7 / 3.6; L = 128: 3.8 / 7.4
  // against 3.8 / 7.8), then 8x128 to 256 (11.0 / 23.4); 16-bit storage 8x256
  // below 128 (L = 16: 1.4 / 1.7 against 4x128's 1.6 / 1.9), then 16x128 to
  // 512 (L = 128: 2.8 / 3.8 against 8x128's 2.8 / 4.1; L = 512: 11.3 / 23.6
  // against tile 8x64's 11.0 / 28.3 forward and pipe 8x64 backward). The
  // 16-bit forward of 33-127 takes 16x128 (L = 64, two runs: 2.1-2.2 µs against
  // 8x256's 2.3-2.4, torch.add 1.8; its backward 2.9 against 2.8).
  if (storage_16bit) {
    if (!backward && seq_len > 32 && seq_len < 128) return {KernelKind::kPacked, {16, 128, MemCode::kVector, kFull}};
    if (seq_len < 128) return {KernelKind::kPacked, {8, 256, MemCode::kVector, kFull}};
    if (seq_len <= 512) return {KernelKind::kPacked, {16, 128, MemCode::kVector, kFull}};
  } else {
    if (seq_len <= 128) return {KernelKind::kPacked, {4, 256, MemCode::kVector, kFull}};
    if (seq_len <= 256) return {KernelKind::kPacked, {8, 128, MemCode::kVector, kFull}};
  }
  return select_one_block_per_seq(seq_len, backward, storage_16bit);
}

}  // namespace linrec

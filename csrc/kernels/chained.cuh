// The chained kernels: few long sequences, split across the whole GPU.
//
// One block per sequence leaves an H100 idle when there are fewer sequences
// than multiprocessors. Here every tile of E * NT elements gets its own block:
// block b takes tile number b (TileNumbering), each tile finds the state
// before it by decoupled look-back over the tiles before it in its sequence
// (lookback.cuh), and blocks start in increasing index order, so a block waits
// only on blocks that already started: no deadlock.
//
// Measured and dropped (H100, 1 x 2^24 fp32): a persistent grid whose blocks
// prefetch their next tile during the look-back ran at 0.45 of copy against
// 0.65 for a block per tile: a prefetched tile publishes its aggregate only
// after its block's current tile is resolved, so later tiles wait on that.
// The backward is the fused one of tiled.cuh. Complex storage takes the staged
// kernel only, whose backward conjugates the coefficients and outputs it reads
// (complex.cuh).
#pragma once
#include <cuda_runtime.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../dispatch.h"
#include "../memio.h"
#include "../params.h"
#include "instances/families.h"
#include "primitives/lookback.cuh"
#include "primitives/scan.cuh"
#include "tiled.cuh"

namespace linrec {

// The launch after a chained kernel. Every block lets a dependent launch
// (grid_launch.cuh) start as soon as it starts itself, so the dependent is
// launched once the last wave of tiles is resident, and its blocks take the
// slots that the drain frees; they still wait for this kernel to complete
// before they touch memory. Where the next call's workspace clear and scan
// follow (a training step's calls, a CUDA graph), their launches then overlap
// this kernel's drain. Measured on the H100 (`python -m linrec.bench --only 2^2`,
// two builds each way in one run): 1 x 2^24 fp32 forward 80.2-80.4 ->
// 79.6-79.7 µs a call, every few-long figure (fp32 and bf16, fwd and fwd+bwd)
// 0.01 of copy faster. A kernel launched without the attribute is unaffected.

// This block's tile: sequence `seq`, its k-th tile in scan order.
struct ChainedTile {
  int64_t seq, k;
};

// Tile numbers (block indices) in one of two orders: sequence by sequence, in
// scan order, or interleaved across the sequences, tile k of every sequence
// before tile k + 1 of any. Interleaved, each sequence's tiles load num_seqs
// times slower than the launch's, which was meant to leave its resolved
// frontier fewer tiles to cross behind the loaded one (not traced). Statuses
// are stored sequence by sequence either way (status_index), so a walk reads
// its sequence's side by side. Which order a launch takes:
// kMaxInterleavedSeqsBwd / Fwd below.
struct TileNumbering {
  int64_t num_seqs, tiles_per_seq;
  bool interleaved;
  __device__ __forceinline__ ChainedTile tile(int64_t number) const {
    if (interleaved) return {number % num_seqs, number / num_seqs};
    return {number / tiles_per_seq, number % tiles_per_seq};
  }
  __device__ __forceinline__ int64_t status_index(int64_t number) const {
    const ChainedTile t = tile(number);
    return t.seq * tiles_per_seq + t.k;
  }
};

// Which launches interleave: the backward's of up to 16 sequences, the
// forward's of up to 4. Measured on the H100, one build switched at run time,
// the chained kernel's call in python -m tools shape-sweep (µs, two runs each).
//  - Backward and forward interleaved against neither, one run, fwd+bwd:
//    bf16 4 x 2^22 116.5 -> 109.2, 8 x 2^20 68.5 -> 63.2, 8 x 2^22 207.4 ->
//    199.0, 16 x 2^20 112.7 -> 106.0; fp32 2 x 2^22 104.9 -> 100.7, 4 x 2^20
//    58.7 -> 54.8. With 64 sequences it gained at 2^18 (bf16 107.6 -> 103.6) and
//    lost at 2^20 (fp32 733 -> 770), and 528 of 2^16 lost up to 3.7%: 16 is the
//    most sequences measured to gain throughout (docs/design/0008-chained-interleaved-tiles.md).
//  - The forward interleaved or not, the backward interleaved, another call:
//    fwd+bwd up to 3% faster interleaved from 2 to 16 sequences, even at fp32
//    16 x 2^20-2^22 (bf16 4 x 2^22 110.1 -> 107.1, 8 x 2^22 201.4 -> 198.4;
//    fp32 2 x 2^22 101.7 -> 100.0),
//    while the forward alone ran even up to 4 sequences and 2-5% slower from 8
//    (bf16 8 x 2^20 23.6 -> 25.0, 16 x 2^20 40.2 -> 41.8), hence 4. A likely reading
//    of the fwd+bwd gain, not measured: an interleaved forward writes every
//    sequence's last tiles last, and the backward reads those first, from L2.
// The bench's 4 x 2^22 bf16 fwd+bwd: 0.77-0.80 of copy with neither interleaved
// (two runs), 0.81 with the backward alone (two), 0.82-0.85 with both
// (five); its fp32 forward 0.91 with neither, 0.89-0.90 with both.
constexpr int64_t kMaxInterleavedSeqsBwd = 16;
constexpr int64_t kMaxInterleavedSeqsFwd = 4;

// This block's tile, once it is its turn to load if it is in the first wave.
// The tile number is the block index, not a ticket from an atomic counter in
// the workspace: blocks start in increasing index order, which CUB's single-pass
// scan also relies on, and a ticket is an L2 round trip (about 1.5 µs under full
// DRAM load) before every block can issue its loads. Measured on the H100
// (`python -m linrec.bench --only 2^2`, two builds each way in one device
// call), µs a call: 1 x 2^24 fwd+bwd bf16
// 113.7-113.8 -> 109.3-109.4 (0.79 -> 0.82 of copy), fp32 204.8-205.9 ->
// 200.4-201.3; bf16 forward 45.0-45.3 -> 43.6-44.3, fp32 within the spread.
template <typename Acc>
__device__ __forceinline__ ChainedTile chained_tile(void* workspace, const TileNumbering& numbering,
                                                   const ChainSchedule& schedule) {
  const int64_t number = blockIdx.x;
  wait_for_turn<Acc>(workspace, number, schedule, [&](int64_t n) { return numbering.status_index(n); });
  return numbering.tile(number);
}

// What a chained block knows of its tile before loading it, the same for both
// chained kernels: which tile it is, where its tensors' elements are, and where
// its sequence's statuses are.
template <typename S, bool kBackward>
struct ChainedBlock {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  // The scanned values (inputs, or d_outputs for the backward) and the coefficients.
  static constexpr int kV = kBackward ? int(kBwdDOutputs) : int(kFwdInputs);
  static constexpr int kC = kBackward ? int(kBwdCoeffs) : int(kFwdCoeffs);
  static constexpr int kInitial = kBackward ? int(kBwdInitial) : int(kFwdInitial);
  bool rev;        // scans against the sequence's index order
  ChainedTile tile;
  int64_t start, len;  // the tile's first element and the sequence's length
  int64_t off[kBackward ? int(kNumBwdSlots) : int(kNumFwdSlots)];
  TileStatus<Acc>* statuses;  // this sequence's
  const T* values;
  const Tc* c;
  Acc initial;  // the state before the sequence (0 without one)
  bool many_waves;  // the launch's tiles fill more than one wave: statuses are read by atomics (StatusRead)

  // The state before this tile (look_back), given its total transform and the
  // state entering the sequence.
  __device__ __forceinline__ Acc state_before(Acc total_y, Acc total_c, Acc entering) const {
    return many_waves ? look_back<StatusRead::kAtomic>(statuses, tile.k, total_y, total_c, entering)
                      : look_back<StatusRead::kLoad>(statuses, tile.k, total_y, total_c, entering);
  }
};

template <typename S, int kTileLen, bool kBackward, typename Params>
__device__ __forceinline__ ChainedBlock<S, kBackward> chained_block(const Params& p) {
  using B = ChainedBlock<S, kBackward>;
  using T = typename B::T;
  using Acc = typename B::Acc;
  B b;
  b.rev = kBackward != p.reverse;
  const TileOrder tiles = tile_order<kTileLen, false>(p.seq_len, b.rev);
  const TileNumbering numbering{p.num_seqs, tiles.num_tiles, p.chain_schedule.interleaved};
  b.tile = chained_tile<Acc>(p.chain_workspace, numbering, p.chain_schedule);
  p.index.offsets(b.tile.seq, b.off);
  b.start = tiles.start(b.tile.k);
  b.len = p.seq_len;
  b.statuses = ChainWorkspaceLayout::statuses<Acc>(p.chain_workspace) +
               b.tile.seq * tiles.num_tiles * kTileStatusSpacing;
  if constexpr (kBackward) b.values = static_cast<const T*>(p.d_outputs) + b.off[B::kV];
  else b.values = static_cast<const T*>(p.inputs) + b.off[B::kV];
  b.c = static_cast<const typename B::Tc*>(p.coeffs) + b.off[B::kC];
  b.initial = p.initial ? to_acc<Acc>(static_cast<const T*>(p.initial)[b.off[B::kInitial]]) : Acc(0);
  b.many_waves = p.chain_schedule.many_waves();
  return b;
}

// The tile scan entered with the state found by look-back over the tile's
// predecessors (ChainedBlock::state_before); `initial` enters before tile 0.
template <int E, int NT, typename Acc, typename Block>
__device__ __forceinline__ void scan_chained_tile(Acc (&y)[E], Acc (&c)[E], bool rev, BlockScanStorage<Acc>& storage,
                                                  const Block& b, Acc initial) {
  Acc carry_after = Acc(0);
  scan_tile_resolved<AlgoCode::kBlock, E, NT>(y, c, rev, carry_after, storage, [&](Acc total_y, Acc total_c) {
    return b.state_before(total_y, total_c, initial);
  });
}

// A forward tile whose inputs have landed asks L2 for those of the tile
// p.chain_schedule.prefetch_ahead numbers later (unit-stride tensors): that tile's
// copies then find its inputs in L2, fetched from DRAM while the resident
// tiles wait on their look-back, beyond what the blocks' slots hold. The
// distance is a third of the first wave, 264 tiles on the H100. H100, kernel
// µs at 1 x 2^24 / 2^26, one run: fp32 forward 73.8 / 280.0 -> 72.2 /
// 273.2, bf16 40.7 / 141.9 -> 39.5 / 138.6; 256 tiles alike; 64, 128 and 320
// slower than 256, 400 mixed, the whole first wave (792) 19-44% slower. Likely
// readings, not profiled: nearer, the later tile has already issued its own
// copies; farther, the prefetched bytes crowd L2. The backward, tried at 400
// and 792 tiles (values and coefficients, not the outputs), was slower and has
// none.
template <int kTileLen, typename Params, typename Block>
__device__ __forceinline__ void prefetch_later_tile(const Params& p, const Block& b) {
  const auto& es = p.index.elem_strides;
  const int64_t later = static_cast<int64_t>(blockIdx.x) + p.chain_schedule.prefetch_ahead;
  if (threadIdx.x != 0 || p.chain_schedule.prefetch_ahead == 0 || later >= gridDim.x) return;
  const TileOrder tiles = tile_order<kTileLen, false>(p.seq_len, b.rev);
  const ChainedTile tile = TileNumbering{p.num_seqs, tiles.num_tiles, p.chain_schedule.interleaved}.tile(later);
  int64_t off[kNumFwdSlots];
  p.index.offsets(tile.seq, off);
  const int64_t start = tiles.start(tile.k);
  const int64_t count = (start + kTileLen < b.len ? start + kTileLen : b.len) - start;
  // The tensors' bases, from this tile's sequence offsets; unit-stride tensors only (a
  // broadcast one, stride 0, is one value).
  if (es[Block::kV] == 1) prefetch_l2(b.values - b.off[Block::kV] + off[Block::kV] + start, count);
  if (es[Block::kC] == 1) prefetch_l2(b.c - b.off[Block::kC] + off[Block::kC] + start, count);
}

// Forward and fused backward in one kernel: they differ only in the tensors
// around the tile scan (the backward runs against the forward direction).
template <typename S, int E, int NT, int M, bool kBackward, typename Params>
__global__ void __launch_bounds__(NT) chained_kernel(const Params p) {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  constexpr TileConfig C = kConfigOf<E, NT, M, static_cast<int>(AlgoCode::kBlock)>;
  Acc* smem = staging_smem<Acc>();
  __shared__ BlockScanStorage<Acc> storage;

  using B = ChainedBlock<S, kBackward>;
  allow_dependents_to_launch();  // see "The launch after a chained kernel" above
  wait_for_prior_grid();
  const B b = chained_block<S, C.tile_len(), kBackward>(p);
  const auto& es = p.index.elem_strides;
  Acc vs[E], cs[E];
  load_tile<C.memcode>(vs, b.values, es[B::kV], b.start, b.len, Acc(0), smem);
  load_tile<C.memcode>(cs, b.c, es[B::kC], b.start, b.len, Acc(1), smem);

  const CutAt cut{p.cuts, b.len};
  CutFlags<E> cuts;
  cuts.load(cut, b.start + static_cast<int64_t>(threadIdx.x) * E);
  cuts.apply(cs);
  if constexpr (!kBackward) {
    scan_chained_tile<E, NT>(vs, cs, b.rev, storage, b, b.initial);
    store_tile<C.memcode>(static_cast<T*>(p.outputs) + b.off[kFwdOutputs], es[kFwdOutputs], vs, b.start, b.len, smem);
  } else {
    Acc own_cs[E];  // log storage: the coefficients at their own steps, for the gradient of log c
    if constexpr (kIsLog<Tc>) {
#pragma unroll
      for (int i = 0; i < E; ++i) own_cs[i] = cs[i];
    }
    const Acc first_coeff = shift_bwd_coeffs(cs, b.c, es[B::kC], cut, b.start, b.len, p.reverse);
    scan_chained_tile<E, NT>(vs, cs, b.rev, storage, b, Acc(0));
    store_tile<C.memcode>(static_cast<T*>(p.d_inputs) + b.off[kBwdDInputs], es[kBwdDInputs], vs, b.start, b.len, smem);
    store_bwd_coeffs<C.memcode>(vs, static_cast<const T*>(p.outputs) + b.off[kBwdOutputs], es[kBwdOutputs],
                                static_cast<Tc*>(p.d_coeffs) + b.off[kBwdDCoeffs], es[kBwdDCoeffs], own_cs, cuts,
                                b.start, b.len, p.reverse, b.initial, first_coeff,
                                static_cast<T*>(p.d_initial) + b.off[kBwdDInitial], smem);
  }
}

// Packed sequences, in a staged tile of E elements a thread: writes `zero` at element e - shift
// of the tile for each cut element e of this thread's row (`flags`, loaded before the tile
// landed; a loop over the set ones). Out of line: inlined, the uncut backward paid for it
// (1 x 2^24 bf16 0.80 -> 0.69-0.76 of copy, H100, whether the row's loop was unrolled or not).
// The flags were read here once, after the tile had landed: each block then waited out one more
// load, and packed bf16 rows of 32768 took 1.15x (forward) and 1.19x (backward) the kernel time
// of unpacked ones (H200).
template <typename V, int E, int NT>
__device__ __noinline__ void cut_staged_row(unsigned char* tile, CutFlags<E> flags, int shift, V zero) {
  const int row_start = static_cast<int>(threadIdx.x) * E;
  for (auto bits = static_cast<unsigned long long>(flags.bits); bits != 0; bits &= bits - 1) {
    const int e = row_start + __ffsll(static_cast<long long>(bits)) - 1 - shift;
    if (e >= 0 && e < E * NT) staged_at<V, E>(tile, e) = zero;
  }
}

// The chained kernels with the tile staged in shared memory (MemCode::kStaged).
// A block with its tile in registers holds E registers a tensor for the whole
// of its life, most of which is the look-back (H100, 1 x 2^24 fp32: 6.7 of 9.2
// µs; docs/design/0003-chained-staged-tiles.md), and registers cap the tiles in flight at about 12
// an SM. Here the tile waits in shared memory instead:
//   1. the block stages its tensors' tiles (cp.async);
//   2. each thread folds its E elements, read from shared memory, into its
//      transform; the block scan and the look-back find the state before it;
//   3. each thread rescans its elements and writes the results in place; the
//      block then stores the tile with consecutive threads on consecutive
//      elements. The backward then stages the forward's outputs where the
//      coefficients were and computes d_coeffs from them as it stores: two
//      tiles of shared memory a block rather than three, so more blocks fit.
template <typename S, int E, int NT, bool kBackward, typename Params>
__global__ void __launch_bounds__(NT) chained_staged_kernel(const Params p) {
  using T = values_t<S>;
  using Tc = coeffs_t<S>;
  using Acc = acc_t<S>;
  constexpr int kTileLen = E * NT;
  constexpr int kTileBytes = staged_tile_bytes<T, E, NT>();
  // The backward stages the forward's outputs where the coefficients were.
  static_assert(sizeof(Tc) >= sizeof(T), "the coefficients' tile holds the outputs' tile");
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ BlockScanStorage<Acc> storage;
  __shared__ Acc edge_c, edge_y;  // the backward's neighbours of the tile (see below)
  __shared__ Acc first_c;         // the backward's coeffs at the forward's first step, if in the tile

  using B = ChainedBlock<S, kBackward>;
  allow_dependents_to_launch();  // see "The launch after a chained kernel" above
  wait_for_prior_grid();
  const B b = chained_block<S, kTileLen, kBackward>(p);
  const auto& es = p.index.elem_strides;
  const CutAt cut{p.cuts, b.len};
  unsigned char* tile_v = staged;
  unsigned char* tile_c = staged + kTileBytes;

  // Step 1.
  static_assert(kTileLen % 64 == 0, "PrefetchedCutBits: tiles start at multiples of its word");
  const int64_t my_first = b.start + static_cast<int64_t>(threadIdx.x) * E;  // this thread's row
  stage_tile<E, NT>(tile_v, b.values, es[B::kV], b.start, b.len, T(from_acc<T>(Acc(0))));
  stage_tile<E, NT>(tile_c, b.c, es[B::kC], b.start, b.len, stored_value<Tc>(Acc(1)));
  cp_async_commit();
  PrefetchedCutBits<E> row_cuts;  // in flight with the tile
  row_cuts.load(p.cut_bits, my_first, b.len);
  // Backward, with "next" one step later in the forward direction: the scan's
  // coefficient at l is coeffs[next(l)] (0 past the sequence), and d_coeffs[l]
  // = d_inputs[l] * outputs[prev(l)] (initial before the first). Inside the
  // tile both come from shared memory; one element each lies beyond its edge.
  const int64_t fwd_step = p.reverse ? -1 : 1;
  const int64_t first = p.reverse ? b.len - 1 : 0;  // the forward direction's first step
  const T* y = nullptr;
  if constexpr (kBackward) {
    y = static_cast<const T*>(p.outputs) + b.off[kBwdOutputs];
    if (threadIdx.x == 0) {
      const int64_t after = p.reverse ? b.start - 1 : b.start + kTileLen;  // next() of the tile's last element
      const int64_t before = p.reverse ? b.start + kTileLen : b.start - 1;  // prev() of its first
      edge_c = after >= 0 && after < b.len && !cut(after) ? conj(to_acc<Acc>(b.c[after * es[B::kC]])) : Acc(0);
      edge_y = before >= 0 && before < b.len ? to_acc<Acc>(y[before * es[kBwdOutputs]]) : b.initial;
      if (cut(p.reverse ? b.start + kTileLen - 1 : b.start)) edge_y = Acc(0);  // the tile's first step is cut
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  // Packed sequences: cut steps' coefficients read as 0, written into the staged tile (then a
  // barrier, as rows read a neighbour's first element).
  if (p.cuts != nullptr) {
    cut_staged_row<Tc, E, NT>(tile_c, row_cuts.take(), 0, stored_value<Tc>(Acc(0)));
    __syncthreads();
  }
  if constexpr (!kBackward) prefetch_later_tile<kTileLen>(p, b);

  // Threads read and write their rows 16 bytes at a time: with the rows'
  // padding, a quarter-warp's 16-byte accesses fall on distinct banks. A chunk
  // is 16 bytes of values; its coefficients are kCoeffWords 16-byte words
  // (two for float32 beside 16-bit values).
  constexpr int kChunk = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunks = E / kChunk;
  constexpr int kCoeffsPerWord = 16 / static_cast<int>(sizeof(Tc));
  constexpr int kCoeffWords = kChunk / kCoeffsPerWord;
  const int row = static_cast<int>(threadIdx.x) * E;  // this thread's first tile element
  unsigned char* my_v = tile_v + threadIdx.x * staged_row_bytes<T, E>();
  const unsigned char* my_c = tile_c + threadIdx.x * staged_row_bytes<Tc, E>();
  // This thread's coefficients of chunk j, in element order (the backward's
  // conjugated: see complex.cuh; the identity for real storage).
  auto chunk_coeffs = [&](int j, Acc (&a)[kChunk]) {
#pragma unroll
    for (int w = 0; w < kCoeffWords; ++w) {
      const uint4 raw = reinterpret_cast<const uint4*>(my_c)[j * kCoeffWords + w];
      const Tc* cs = reinterpret_cast<const Tc*>(&raw);
#pragma unroll
      for (int i = 0; i < kCoeffsPerWord; ++i)
        a[w * kCoeffsPerWord + i] = kBackward ? conj(to_acc<Acc>(cs[i])) : to_acc<Acc>(cs[i]);
    }
  };
  // The backward scan's coefficient at l is coeffs[next(l)], and next(l) is
  // the element it visits just before l: the walk passes each coefficient on
  // to the next element, and only the row's first element looks beyond the
  // row (0 past the sequence). Padding visited before the sequence's last
  // element passes on its fill 1 instead of 0, which multiplies a state of 0:
  // that tile is the first in scan order, entered with 0, and padding adds 0.
  Acc row_entry_c = Acc(0);
  if constexpr (kBackward) {
    const int next = p.reverse ? row - 1 : row + E;
    if (b.start + next >= 0 && b.start + next < b.len)
      row_entry_c = next >= 0 && next < kTileLen ? conj(to_acc<Acc>(staged_at<Tc, E>(tile_c, next))) : edge_c;
  }
  auto chunk_values = [&](int j, Acc (&x)[kChunk]) {
    const uint4 raw = reinterpret_cast<const uint4*>(my_v)[j];
    const T* vs = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) x[i] = to_acc<Acc>(vs[i]);
  };

  // Visits this thread's elements in scan order, one 16-byte chunk at a time:
  // visit(x, a, i) for element i of chunk j (x its value, a the scan's
  // coefficient), then end_chunk(j). Shared by the fold and the rescan.
  auto walk_row = [&]<bool kRev>(auto&& visit, auto&& end_chunk) {
    [[maybe_unused]] Acc carry = row_entry_c;  // used by the backward only
#pragma unroll
    for (int jj = 0; jj < kChunks; ++jj) {
      const int j = kRev ? kChunks - 1 - jj : jj;
      Acc x[kChunk], a[kChunk];
      chunk_values(j, x);
      chunk_coeffs(j, a);
#pragma unroll
      for (int ii = 0; ii < kChunk; ++ii) {
        const int i = kRev ? kChunk - 1 - ii : ii;
        if constexpr (kBackward) {
          visit(x[i], carry, i);
          carry = a[i];
        } else {
          visit(x[i], a[i], i);
        }
      }
      end_chunk(j);
    }
  };
  auto in_scan_order = [&](auto&& visit, auto&& end_chunk) {
    if (b.rev) walk_row.template operator()<true>(visit, end_chunk);
    else walk_row.template operator()<false>(visit, end_chunk);
  };

  // Step 2: fold this thread's elements.
  Acc total_y = Acc(0), total_c = Acc(1);
  in_scan_order(
      [&](Acc x, Acc a, int) {
        total_y = a * total_y + x;
        total_c = a * total_c;
      },
      [](int) {});
  Acc ex_y, ex_c;
  scan_warp(total_y, total_c, b.rev, ex_y, ex_c);
  const Acc before_warp = scan_block<NT>(
      total_y, total_c,
      [&](Acc tile_y_total, Acc tile_c_total) {
        return b.state_before(tile_y_total, tile_c_total, kBackward ? Acc(0) : b.initial);
      },
      b.rev, storage);

  // Step 3: rescan from the state before this thread, results in place, a
  // chunk written back whole once all its elements are in `out`.
  Acc state = ex_c * before_warp + ex_y;
  uint4 out;
  in_scan_order(
      [&](Acc x, Acc a, int i) {
        state = a * state + x;
        reinterpret_cast<T*>(&out)[i] = from_acc<T>(state);
      },
      [&](int j) { reinterpret_cast<uint4*>(my_v)[j] = out; });
  if constexpr (!kBackward) {
    __syncthreads();
    store_staged_tile<E, NT>(static_cast<T*>(p.outputs) + b.off[kFwdOutputs], es[kFwdOutputs], tile_v, b.start, b.len);
  } else {
    if (threadIdx.x == 0 && first >= b.start && first < b.start + kTileLen)
      first_c = conj(to_acc<Acc>(staged_at<Tc, E>(tile_c, static_cast<int>(first - b.start))));
    __syncthreads();  // every rescan is done: tile_v holds d_inputs, tile_c is free
    unsigned char* tile_y = tile_c;  // the forward's outputs, copied while d_inputs is stored
    stage_tile<E, NT>(tile_y, y, es[kBwdOutputs], b.start, b.len, T(from_acc<T>(Acc(0))));
    cp_async_commit();
    PrefetchedCutBits<E> y_cuts;  // read again rather than held through the scan
    y_cuts.load(p.cut_bits, my_first, b.len);
    store_staged_tile<E, NT>(static_cast<T*>(p.d_inputs) + b.off[kBwdDInputs], es[kBwdDInputs], tile_v, b.start, b.len);
    cp_async_wait<0>();
    __syncthreads();
    if (p.cuts != nullptr) {  // a cut step's gradient is 0: the output before it reads as 0
      cut_staged_row<T, E, NT>(tile_y, y_cuts.take(), static_cast<int>(fwd_step), from_acc<T>(Acc(0)));
      __syncthreads();
    }
    Tc* dc = static_cast<Tc*>(p.d_coeffs) + b.off[kBwdDCoeffs];
    // y_prev(e): the forward's output one forward step before tile element e.
    auto y_prev = [&](int e) {
      const int prev = e - static_cast<int>(fwd_step);
      return prev >= 0 && prev < kTileLen ? to_acc<Acc>(staged_at<T, E>(tile_y, prev)) : edge_y;
    };
    if (es[kBwdDCoeffs] == 1 && b.start + kTileLen <= b.len && reinterpret_cast<uintptr_t>(dc + b.start) % 16 == 0) {
      // 16 bytes a thread, consecutive threads on consecutive chunks: as many
      // instructions per byte for 16-bit storage as for fp32.
#pragma unroll 2
      for (int q = threadIdx.x; q < kTileLen / kChunk; q += NT) {
        const int e0 = q * kChunk;
        const uint4 g_raw = *reinterpret_cast<const uint4*>(&staged_at<T, E>(tile_v, e0));
        const uint4 y_raw = *reinterpret_cast<const uint4*>(&staged_at<T, E>(tile_y, e0));
        const T* g = reinterpret_cast<const T*>(&g_raw);
        const T* ys = reinterpret_cast<const T*>(&y_raw);
        const Acc y_outside = y_prev(p.reverse ? e0 + kChunk - 1 : e0);  // the one neighbour outside the chunk
        Acc yp[kChunk];  // y_prev of the chunk's elements; one loop per direction keeps indices constant
        if (p.reverse) {
#pragma unroll
          for (int i = 0; i < kChunk; ++i) yp[i] = i + 1 < kChunk ? to_acc<Acc>(ys[i + 1 < kChunk ? i + 1 : i]) : y_outside;
        } else {
#pragma unroll
          for (int i = 0; i < kChunk; ++i) yp[i] = i > 0 ? to_acc<Acc>(ys[i > 0 ? i - 1 : i]) : y_outside;
        }
        uint4 out[kCoeffWords];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          Acc grad = to_acc<Acc>(g[i]) * conj(b.start + e0 + i == first ? b.initial : yp[i]);
          // Log storage: the coefficients' tile is gone (tile_y took its place); read again from L2.
          if constexpr (kIsLog<Tc>) grad = coeff_grad<Tc>(grad, to_acc<Acc>(b.c[(b.start + e0 + i) * es[B::kC]]));
          reinterpret_cast<Tc*>(out)[i] = from_acc<Tc>(grad);
        }
#pragma unroll
        for (int w = 0; w < kCoeffWords; ++w) reinterpret_cast<uint4*>(dc + b.start + e0)[w] = out[w];
      }
    } else {
      for (int e = threadIdx.x; e < kTileLen; e += NT) {
        const int64_t pos = b.start + e;
        if (pos >= b.len) continue;
        const Acc g = to_acc<Acc>(staged_at<T, E>(tile_v, e));
        Acc grad = g * conj(pos == first ? b.initial : y_prev(e));
        if constexpr (kIsLog<Tc>) grad = coeff_grad<Tc>(grad, to_acc<Acc>(b.c[pos * es[B::kC]]));
        dc[pos * es[kBwdDCoeffs]] = from_acc<Tc>(grad);
      }
    }
    if (threadIdx.x == 0 && first >= b.start && first < b.start + kTileLen)
      static_cast<T*>(p.d_initial)[b.off[kBwdDInitial]] =
          from_acc<T>(to_acc<Acc>(staged_at<T, E>(tile_v, static_cast<int>(first - b.start))) * first_c);
  }
}

template <typename T, TileConfig C, bool kBackward>
constexpr auto chained_kernel_for() {
  using Params = std::conditional_t<kBackward, BackwardParams, ForwardParams>;
  if constexpr (C.memcode == MemCode::kStaged)
    return chained_staged_kernel<T, C.elems_per_thread, C.threads_per_block, kBackward, Params>;
  else
    return chained_kernel<T, C.elems_per_thread, C.threads_per_block, static_cast<int>(C.memcode), kBackward,
                          Params>;
}

template <typename T, TileConfig C, bool kBackward>
constexpr int chained_dynamic_smem_bytes() {
  if constexpr (C.memcode == MemCode::kStaged)
    return staged_tile_bytes<values_t<T>, C.elems_per_thread, C.threads_per_block>() +
           staged_tile_bytes<coeffs_t<T>, C.elems_per_thread, C.threads_per_block>();
  else
    return tiled_dynamic_smem_bytes<acc_t<T>, C>();
}

// Bytes of the chained kernels' workspace (cleared by the launch, workspace.cuh) for this call.
template <typename T>
int64_t Family<KernelKind::kChained>::workspace_bytes(int64_t num_seqs, int64_t seq_len, const TileConfig& config) {
  const int64_t tiles = (seq_len + config.tile_len() - 1) / config.tile_len();
  return ChainWorkspaceLayout::bytes<acc_t<T>>(num_seqs * tiles * kTileStatusSpacing);
}

// The first wave's turns for `blocks` tiles (see wait_for_turn), when the tiles
// fill more than one wave. A single wave gains nothing from loading in order
// and loses the lead's wait (H100, 1 x 2^22 bf16 backward, one wave, a lead of
// 384 tiles: 23.0 -> 27.9 µs). The lead is half the first wave. The pace issues
// a tile's inputs (`tile_input_bytes`) at 1.25x the device's peak DRAM rate: on
// the H100 (3.35 TB/s) 7.8 ns a 32 KB tile; 8 and 11 ns measured alike. Blocks
// an SM are computed once per kernel; a failed query gives no lead and no
// pace, which only costs speed. The wait never deadlocks, whatever the lead: a
// tile waits only on a smaller tile number, whose block has started, and a
// block publishes its aggregate before it waits on anything but its turn.
template <auto kKernel, int kThreads, int kSmem>
ChainSchedule chained_schedule(int64_t blocks, int64_t tile_input_bytes) {
  // A failed query's error is cleared, so that check_launch does not report it.
  static const int per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreads, kSmem) == cudaSuccess) return n;
    cudaGetLastError();
    return 0;
  }();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  const int64_t first_wave = static_cast<int64_t>(cuda_sm_count(device)) * per_sm;
  if (blocks <= first_wave) return {};
  const double bytes_per_ns = cuda_dram_bytes_per_ns(device);
  const int64_t pace_ps = bytes_per_ns > 0 ? static_cast<int64_t>(tile_input_bytes * 1000 / (1.25 * bytes_per_ns)) : 0;
  return {first_wave / 2, first_wave, pace_ps, first_wave / 3};
}

// Launches the chained kernel for `config`: one block per tile.
// Complex storage takes the staged configs only (the register kernel's backward is
// written for real values): csrc/registry.toml.
template <typename T, bool kBackward>
void Family<KernelKind::kChained>::launch(const ParamsOf<kBackward>& p, const TileConfig& config,
                                          cudaStream_t stream) {
  const std::string name = kBackward ? "linrec_chained_bwd" : "linrec_chained_fwd";
  dispatch_config<configs<T>()>(config, [&]<TileConfig C>() {
    constexpr auto kernel = chained_kernel_for<T, C, kBackward>();
    constexpr int smem = chained_dynamic_smem_bytes<T, C, kBackward>();
    allow_dynamic_smem<kernel, C, smem>(name);
    if (p.chain_workspace == nullptr) throw std::runtime_error("linrec: " + name + " needs a workspace");
    const int64_t blocks = p.num_seqs * tile_order<C.tile_len(), false>(p.seq_len, false).num_tiles;
    if (blocks > 0x7fffffff) throw std::runtime_error("linrec: " + name + " needs more than 2^31-1 blocks");
    if (blocks == 0) return;
    ParamsOf<kBackward> q = p;
    const int64_t tile_input_bytes = C.tile_len() * int64_t(sizeof(values_t<T>) + sizeof(coeffs_t<T>));
    q.chain_schedule = chained_schedule<kernel, C.threads_per_block, smem>(blocks, tile_input_bytes);
    q.chain_schedule.interleaved = p.num_seqs <= (kBackward ? kMaxInterleavedSeqsBwd : kMaxInterleavedSeqsFwd);
    launch_kernel<kernel>(static_cast<unsigned>(blocks), C.threads_per_block, smem, stream, q);
    check_launch(name.c_str());
  }, name.c_str());
}

template <typename T, bool kBackward>
std::optional<cudaFuncAttributes> Family<KernelKind::kChained>::attributes(const TileConfig& config,
                                                                           KernelVariant variant) {
  std::optional<cudaFuncAttributes> attrs;
  if (variant != KernelVariant::kGeneral) return attrs;
  dispatch_config<configs<T>()>(config, [&]<TileConfig C>() {
    attrs = kernel_attributes(chained_kernel_for<T, C, kBackward>());
  }, kBackward ? "linrec_chained_bwd" : "linrec_chained_fwd");
  return attrs;
}

}  // namespace linrec

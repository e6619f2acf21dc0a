// Tile, pipe and chained kernels, forward and fused backward.
//
// A sequence is cut into tiles of E * NT elements aligned to its start. `tile`
// gives one block a sequence of at most one tile; `pipe` gives one block a whole
// sequence and walks its tiles in scan order with the carry between them,
// loading the next tile before scanning the current one so the loads are in
// flight during the scan; `chained` gives every tile its own block, which finds
// its entering state by decoupled look-back (lookback.cuh): the schedule for few
// long sequences. Reverse runs the tiles, and the order inside each tile, from
// last to first over the same memory layout.
//
// Backward (fused): with "next" meaning one step later in the forward direction,
//     d_inputs[l]  = coeffs[next(l)] * d_inputs[next(l)] + d_outputs[l]
//     d_coeffs[l]  = d_inputs[l] * outputs[prev(l)]      (outputs[prev(first)] = initial)
//     d_initial    = d_inputs[first] * coeffs[first]
// i.e. the same scan against the forward direction, over d_outputs with the
// coefficients shifted by one. Reads d_outputs, coeffs, outputs; writes
// d_inputs, d_coeffs: 5 tensors.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../dispatch.h"
#include "../memio.h"
#include "../params.h"
#include "lookback.cuh"
#include "scan.cuh"

namespace linrec {

enum class Schedule : int { kOneTile, kPipe, kChained };

template <typename Acc, TileConfig C>
constexpr int tiled_dynamic_smem_bytes() {
  return C.memcode == MemCode::kCoalesced
             ? coalesced_smem_words<C.elems_per_thread, C.threads_per_block>() * static_cast<int>(sizeof(Acc))
             : 0;
}

// The tiles of one sequence in scan order: tile k starts at start(k). The tile
// kernel has one tile; pipe and chained have ceil(len / tile_len).
struct TileOrder {
  int64_t num_tiles, tile_len;
  bool rev;
  __device__ __forceinline__ int64_t start(int64_t k) const { return (rev ? num_tiles - 1 - k : k) * tile_len; }
};

template <int64_t kTileLen, Schedule S>
__host__ __device__ __forceinline__ TileOrder tile_order(int64_t len, bool rev) {
  return {S == Schedule::kOneTile ? 1 : (len + kTileLen - 1) / kTileLen, kTileLen, rev};
}

// Which sequence and which of its tiles this block scans: [first_tile, end_tile).
struct BlockWork {
  int64_t seq, first_tile, end_tile;
};

template <Schedule S>
__device__ __forceinline__ BlockWork block_work(const TileOrder& tiles, void* chain_workspace) {
  if constexpr (S == Schedule::kChained) {
    const int64_t number = next_tile_number(chain_workspace);
    const int64_t k = number % tiles.num_tiles;
    return {number / tiles.num_tiles, k, k + 1};
  } else {
    return {static_cast<int64_t>(blockIdx.x), 0, tiles.num_tiles};
  }
}

// The dynamic shared memory that the coalesced memio strategy stages tiles in.
template <typename Acc>
__device__ __forceinline__ Acc* staging_smem() {
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  return reinterpret_cast<Acc*>(dynamic_smem);
}

// The tile scan entered with the state this schedule uses: the block's running
// carry, or for a chained tile the state found by look-back (always the full scan).
template <Schedule S, AlgoCode Algo, int E, int NT, typename Acc>
__device__ __forceinline__ void scan_scheduled(Acc (&y)[E], Acc (&c)[E], bool rev, Acc& carry,
                                               BlockScanStorage<Acc>& storage, void* chain_workspace,
                                               const BlockWork& work, const TileOrder& tiles) {
  if constexpr (S == Schedule::kChained) {
    TileStatus<Acc>* statuses =
        ChainWorkspaceLayout::statuses<Acc>(chain_workspace) + work.seq * tiles.num_tiles;
    const Acc initial = carry;
    const int64_t k = work.first_tile;
    scan_tile_resolved<AlgoCode::kBlock, E, NT>(
        y, c, rev, carry, storage, [&](Acc total_y, Acc total_c) { return look_back(statuses, k, total_y, total_c, initial); });
  } else {
    scan_tile<Algo, E, NT>(y, c, rev, carry, storage);
  }
}

template <int E, typename Acc>
__device__ __forceinline__ void move_registers(Acc (&dst)[E], const Acc (&src)[E]) {
#pragma unroll
  for (int i = 0; i < E; ++i) dst[i] = src[i];
}

// Kernels take the config as plain ints: nvcc's host stubs cannot spell class-type template arguments.
template <int E, int NT, int M, int A>
constexpr TileConfig kConfigOf{E, NT, static_cast<MemCode>(M), static_cast<AlgoCode>(A)};

template <typename T, int E_, int NT_, int M_, int A_, Schedule S>
__global__ void __launch_bounds__(NT_) tiled_fwd_kernel(const ForwardParams p) {
  using Acc = acc_t<T>;
  constexpr TileConfig C = kConfigOf<E_, NT_, M_, A_>;
  constexpr int E = C.elems_per_thread;
  constexpr int NT = C.threads_per_block;
  constexpr int64_t kTileLen = static_cast<int64_t>(E) * NT;
  Acc* smem = staging_smem<Acc>();
  __shared__ BlockScanStorage<Acc> storage;

  const TileOrder tiles = tile_order<kTileLen, S>(p.seq_len, p.reverse);
  const BlockWork work = block_work<S>(tiles, p.chain_workspace);
  int64_t off[kNumFwdSlots];
  p.index.offsets(work.seq, off);
  const T* x = static_cast<const T*>(p.inputs) + off[kFwdInputs];
  const T* c = static_cast<const T*>(p.coeffs) + off[kFwdCoeffs];
  T* y = static_cast<T*>(p.outputs) + off[kFwdOutputs];
  const int64_t sx = p.index.elem_strides[kFwdInputs], sc = p.index.elem_strides[kFwdCoeffs],
                sy = p.index.elem_strides[kFwdOutputs];
  const int64_t len = p.seq_len;
  const bool rev = p.reverse;
  Acc carry = p.initial ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kFwdInitial]]) : Acc(0);

  Acc xs[E], cs[E];
  load_tile<C.memcode>(xs, x, sx, tiles.start(work.first_tile), len, Acc(0), smem);
  load_tile<C.memcode>(cs, c, sc, tiles.start(work.first_tile), len, Acc(1), smem);
  for (int64_t k = work.first_tile; k < work.end_tile; ++k) {
    Acc next_xs[E], next_cs[E];
    if (S == Schedule::kPipe && k + 1 < work.end_tile) {
      load_tile<C.memcode>(next_xs, x, sx, tiles.start(k + 1), len, Acc(0), smem);
      load_tile<C.memcode>(next_cs, c, sc, tiles.start(k + 1), len, Acc(1), smem);
    }
    scan_scheduled<S, C.algocode, E, NT>(xs, cs, rev, carry, storage, p.chain_workspace, work, tiles);
    store_tile<C.memcode>(y, sy, xs, tiles.start(k), len, smem);
    if constexpr (S == Schedule::kPipe) {
      move_registers(xs, next_xs);
      move_registers(cs, next_cs);
    }
  }
}

template <typename T, int E_, int NT_, int M_, int A_, Schedule S>
__global__ void __launch_bounds__(NT_) tiled_bwd_kernel(const BackwardParams p) {
  using Acc = acc_t<T>;
  constexpr TileConfig C = kConfigOf<E_, NT_, M_, A_>;
  constexpr int E = C.elems_per_thread;
  constexpr int NT = C.threads_per_block;
  constexpr int64_t kTileLen = static_cast<int64_t>(E) * NT;
  Acc* smem = staging_smem<Acc>();
  __shared__ BlockScanStorage<Acc> storage;

  const bool rev = !p.reverse;  // the backward scan runs against the forward direction
  const TileOrder tiles = tile_order<kTileLen, S>(p.seq_len, rev);
  const BlockWork work = block_work<S>(tiles, p.chain_workspace);
  int64_t off[kNumBwdSlots];
  p.index.offsets(work.seq, off);
  const auto& es = p.index.elem_strides;
  const T* dy = static_cast<const T*>(p.d_outputs) + off[kBwdDOutputs];
  const T* c = static_cast<const T*>(p.coeffs) + off[kBwdCoeffs];
  const T* y = static_cast<const T*>(p.outputs) + off[kBwdOutputs];
  T* dx = static_cast<T*>(p.d_inputs) + off[kBwdDInputs];
  T* dc = static_cast<T*>(p.d_coeffs) + off[kBwdDCoeffs];
  const int64_t len = p.seq_len;
  const bool fwd_rev = p.reverse;
  const Acc initial = p.initial ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kBwdInitial]]) : Acc(0);
  Acc carry = Acc(0);

  Acc gs[E], cs[E];
  load_tile<C.memcode>(gs, dy, es[kBwdDOutputs], tiles.start(work.first_tile), len, Acc(0), smem);
  load_tile<C.memcode>(cs, c, es[kBwdCoeffs], tiles.start(work.first_tile), len, Acc(1), smem);
  const int64_t first = fwd_rev ? len - 1 : 0;  // the forward direction's first step
  for (int64_t k = work.first_tile; k < work.end_tile; ++k) {
    const int64_t start = tiles.start(k);
    const int64_t mine = start + static_cast<int64_t>(threadIdx.x) * E;
    Acc next_gs[E], next_cs[E];
    if (S == Schedule::kPipe && k + 1 < work.end_tile) {
      load_tile<C.memcode>(next_gs, dy, es[kBwdDOutputs], tiles.start(k + 1), len, Acc(0), smem);
      load_tile<C.memcode>(next_cs, c, es[kBwdCoeffs], tiles.start(k + 1), len, Acc(1), smem);
    }
    Acc first_coeff = Acc(0);  // coeffs[first], if this thread holds it
#pragma unroll
    for (int i = 0; i < E; ++i)
      if (mine + i == first) first_coeff = cs[i];
    // coeffs one forward step later: from the next position, or the previous one when reversed.
    shift_window(cs, c, es[kBwdCoeffs], start, len, Acc(0), /*from_next=*/!fwd_rev);
    scan_scheduled<S, C.algocode, E, NT>(gs, cs, rev, carry, storage, p.chain_workspace, work, tiles);
    store_tile<C.memcode>(dx, es[kBwdDInputs], gs, start, len, smem);
    // d_coeffs = d_inputs * (outputs one forward step earlier, the initial state before the first).
    Acc ys[E];
    load_tile<C.memcode>(ys, y, es[kBwdOutputs], start, len, Acc(0), smem);
    shift_window(ys, y, es[kBwdOutputs], start, len, initial, /*from_next=*/fwd_rev);
#pragma unroll
    for (int i = 0; i < E; ++i) {
      if (mine + i == first) static_cast<T*>(p.d_initial)[off[kBwdDInitial]] = from_acc<T>(gs[i] * first_coeff);
      ys[i] = gs[i] * ys[i];
    }
    store_tile<C.memcode>(dc, es[kBwdDCoeffs], ys, start, len, smem);
    if constexpr (S == Schedule::kPipe) {
      move_registers(gs, next_gs);
      move_registers(cs, next_cs);
    }
  }
}

inline void check_launch(const char* name) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("linrec: ") + name + " failed: " + cudaGetErrorString(err));
}

template <typename T, TileConfig C, Schedule S, bool kBackward>
constexpr auto tiled_kernel() {
  constexpr int M = static_cast<int>(C.memcode), A = static_cast<int>(C.algocode);
  if constexpr (kBackward) return tiled_bwd_kernel<T, C.elems_per_thread, C.threads_per_block, M, A, S>;
  else return tiled_fwd_kernel<T, C.elems_per_thread, C.threads_per_block, M, A, S>;
}

inline std::string tiled_name(Schedule s, bool backward) {
  const char* kind = s == Schedule::kOneTile ? "tile" : s == Schedule::kPipe ? "pipe" : "chained";
  return std::string("linrec_") + kind + (backward ? "_bwd" : "_fwd");
}

// Bytes of the chained kernels' workspace (zeroed by the caller) for this call.
template <typename T>
int64_t chained_workspace_bytes(int64_t num_seqs, int64_t seq_len, const TileConfig& config) {
  const int64_t tiles = (seq_len + config.tile_len() - 1) / config.tile_len();
  return ChainWorkspaceLayout::bytes<acc_t<T>>(num_seqs * tiles);
}

// Launches the tile, pipe or chained kernel for `config`: one block per sequence,
// or for chained one block per tile.
template <typename T, Schedule S, bool kBackward, typename Params>
void launch_tiled(const Params& p, const TileConfig& config, cudaStream_t stream) {
  const std::string name = tiled_name(S, kBackward);
  dispatch_config(config, [&]<TileConfig C>() {
    constexpr auto kernel = tiled_kernel<T, C, S, kBackward>();
    constexpr int smem = tiled_dynamic_smem_bytes<acc_t<T>, C>();
    if constexpr (smem > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (err != cudaSuccess)
        throw std::runtime_error("linrec: " + name + " needs " + std::to_string(smem) +
                                 " bytes of shared memory for " + config.to_string() + ": " + cudaGetErrorString(err));
    }
    const int64_t blocks = S == Schedule::kChained ? p.num_seqs * tile_order<C.tile_len(), S>(p.seq_len, false).num_tiles
                                                   : p.num_seqs;
    if (blocks > 0x7fffffff) throw std::runtime_error("linrec: " + name + " needs more than 2^31-1 blocks");
    if (S == Schedule::kChained && p.chain_workspace == nullptr) throw std::runtime_error("linrec: " + name + " needs a workspace");
    kernel<<<static_cast<unsigned>(blocks), C.threads_per_block, smem, stream>>>(p);
    check_launch(name.c_str());
  }, name.c_str());
}

template <typename T, Schedule S, bool kBackward>
cudaFuncAttributes tiled_func_attrs(const TileConfig& config) {
  cudaFuncAttributes attrs{};
  dispatch_config(config, [&]<TileConfig C>() {
    const cudaError_t err = cudaFuncGetAttributes(&attrs, tiled_kernel<T, C, S, kBackward>());
    if (err != cudaSuccess) throw std::runtime_error(std::string("linrec: cudaFuncGetAttributes: ") + cudaGetErrorString(err));
  }, tiled_name(S, kBackward).c_str());
  return attrs;
}

// Explicit instantiations live in kernels/instances/*.cu, one file per
// (dtype, schedule, direction), so the build compiles them in parallel.
#define LINREC_INSTANTIATE_TILED(T, SCHEDULE, BACKWARD, PARAMS)                                              \
  template void launch_tiled<T, SCHEDULE, BACKWARD, PARAMS>(const PARAMS&, const TileConfig&, cudaStream_t); \
  template cudaFuncAttributes tiled_func_attrs<T, SCHEDULE, BACKWARD>(const TileConfig&);

}  // namespace linrec

// The chained kernels: few long sequences, split across the whole GPU.
//
// One block per sequence leaves an H100 idle when there are fewer sequences
// than multiprocessors. Here every tile of E * NT elements gets its own block:
// tiles are numbered sequence by sequence in scan order, blocks take their
// numbers from an atomic counter (so a block waits only on blocks that already
// started: no deadlock), and each tile finds the state before it by decoupled
// look-back over the tiles before it (lookback.cuh).
//
// Measured and dropped (H100, 1 x 2^24 fp32): a persistent grid whose blocks
// prefetch their next tile during the look-back ran at 0.45 of copy against
// 0.65 for a block per tile: a prefetched tile publishes its aggregate only
// after its block's current tile is resolved, so later tiles wait on that.
// The backward is the fused one of tiled.cuh.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "../dispatch.h"
#include "../memio.h"
#include "../params.h"
#include "lookback.cuh"
#include "scan.cuh"
#include "tiled.cuh"

namespace linrec {

// This block's tile: sequence `seq`, its k-th tile in scan order.
struct ChainedTile {
  int64_t seq, k;
};

__device__ __forceinline__ ChainedTile chained_tile(void* workspace, int64_t tiles_per_seq) {
  const int64_t number = next_tile_number(workspace);
  return {number / tiles_per_seq, number % tiles_per_seq};
}

// The tile scan entered with the state found by look-back over tile k's
// predecessors among `statuses` (its sequence's); `initial` enters before tile 0.
template <int E, int NT, typename Acc>
__device__ __forceinline__ void scan_chained_tile(Acc (&y)[E], Acc (&c)[E], bool rev, BlockScanStorage<Acc>& storage,
                                                  TileStatus<Acc>* statuses, int64_t k, Acc initial) {
  Acc carry_after = Acc(0);
  scan_tile_resolved<AlgoCode::kBlock, E, NT>(y, c, rev, carry_after, storage, [&](Acc total_y, Acc total_c) {
    return look_back(statuses, k, total_y, total_c, initial);
  });
}

// Forward and fused backward in one kernel: they differ only in the tensors
// around the tile scan (the backward runs against the forward direction).
template <typename T, int E, int NT, int M, bool kBackward, typename Params>
__global__ void __launch_bounds__(NT) chained_kernel(const Params p) {
  using Acc = acc_t<T>;
  constexpr TileConfig C = kConfigOf<E, NT, M, static_cast<int>(AlgoCode::kBlock)>;
  Acc* smem = staging_smem<Acc>();
  __shared__ BlockScanStorage<Acc> storage;

  const bool rev = kBackward != p.reverse;
  const TileOrder tiles = tile_order<C.tile_len(), false>(p.seq_len, rev);
  const ChainedTile tile = chained_tile(p.chain_workspace, tiles.num_tiles);
  int64_t off[kBackward ? kNumBwdSlots : kNumFwdSlots];
  p.index.offsets(tile.seq, off);
  const auto& es = p.index.elem_strides;
  const int64_t start = tiles.start(tile.k), len = p.seq_len;
  TileStatus<Acc>* statuses = ChainWorkspaceLayout::statuses<Acc>(p.chain_workspace) +
                               tile.seq * tiles.num_tiles * kTileStatusSpacing;
  // The scanned values (inputs, or d_outputs for the backward) and the coefficients.
  constexpr int kV = kBackward ? int(kBwdDOutputs) : int(kFwdInputs);
  constexpr int kC = kBackward ? int(kBwdCoeffs) : int(kFwdCoeffs);
  constexpr int kInitial = kBackward ? int(kBwdInitial) : int(kFwdInitial);
  const T* values;
  if constexpr (kBackward) values = static_cast<const T*>(p.d_outputs) + off[kV];
  else values = static_cast<const T*>(p.inputs) + off[kV];
  const T* c = static_cast<const T*>(p.coeffs) + off[kC];
  const Acc initial = p.initial ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kInitial]]) : Acc(0);
  Acc vs[E], cs[E];
  load_tile<C.memcode>(vs, values, es[kV], start, len, Acc(0), smem);
  load_tile<C.memcode>(cs, c, es[kC], start, len, Acc(1), smem);

  if constexpr (!kBackward) {
    scan_chained_tile<E, NT>(vs, cs, rev, storage, statuses, tile.k, initial);
    store_tile<C.memcode>(static_cast<T*>(p.outputs) + off[kFwdOutputs], es[kFwdOutputs], vs, start, len, smem);
  } else {
    const Acc first_coeff = shift_bwd_coeffs(cs, c, es[kC], start, len, p.reverse);
    scan_chained_tile<E, NT>(vs, cs, rev, storage, statuses, tile.k, Acc(0));
    store_tile<C.memcode>(static_cast<T*>(p.d_inputs) + off[kBwdDInputs], es[kBwdDInputs], vs, start, len, smem);
    store_bwd_coeffs<C.memcode>(vs, static_cast<const T*>(p.outputs) + off[kBwdOutputs], es[kBwdOutputs],
                                static_cast<T*>(p.d_coeffs) + off[kBwdDCoeffs], es[kBwdDCoeffs], start, len,
                                p.reverse, initial, first_coeff, static_cast<T*>(p.d_initial) + off[kBwdDInitial],
                                smem);
  }
}

template <typename T, TileConfig C, bool kBackward>
constexpr auto chained_kernel_for() {
  using Params = std::conditional_t<kBackward, BackwardParams, ForwardParams>;
  return chained_kernel<T, C.elems_per_thread, C.threads_per_block, static_cast<int>(C.memcode), kBackward, Params>;
}

// Bytes of the chained kernels' workspace (zeroed by the caller) for this call.
template <typename T>
int64_t chained_workspace_bytes(int64_t num_seqs, int64_t seq_len, const TileConfig& config) {
  const int64_t tiles = (seq_len + config.tile_len() - 1) / config.tile_len();
  return ChainWorkspaceLayout::bytes<acc_t<T>>(num_seqs * tiles * kTileStatusSpacing);
}

// Launches the chained kernel for `config`: one block per tile.
template <typename T, bool kBackward, typename Params>
void launch_chained(const Params& p, const TileConfig& config, cudaStream_t stream) {
  const std::string name = kBackward ? "linrec_chained_bwd" : "linrec_chained_fwd";
  dispatch_config(config, [&]<TileConfig C>() {
    constexpr auto kernel = chained_kernel_for<T, C, kBackward>();
    constexpr int smem = tiled_dynamic_smem_bytes<acc_t<T>, C>();
    allow_dynamic_smem<C, smem>(kernel, name);
    if (p.chain_workspace == nullptr) throw std::runtime_error("linrec: " + name + " needs a workspace");
    const int64_t blocks = p.num_seqs * tile_order<C.tile_len(), false>(p.seq_len, false).num_tiles;
    if (blocks > 0x7fffffff) throw std::runtime_error("linrec: " + name + " needs more than 2^31-1 blocks");
    if (blocks == 0) return;
    kernel<<<static_cast<unsigned>(blocks), C.threads_per_block, smem, stream>>>(p);
    check_launch(name.c_str());
  }, name.c_str());
}

template <typename T, bool kBackward>
cudaFuncAttributes chained_func_attrs(const TileConfig& config) {
  cudaFuncAttributes attrs{};
  dispatch_config(config, [&]<TileConfig C>() {
    const cudaError_t err = cudaFuncGetAttributes(&attrs, chained_kernel_for<T, C, kBackward>());
    if (err != cudaSuccess) throw std::runtime_error(std::string("linrec: cudaFuncGetAttributes: ") + cudaGetErrorString(err));
  }, kBackward ? "linrec_chained_bwd" : "linrec_chained_fwd");
  return attrs;
}

#define LINREC_INSTANTIATE_CHAINED(T, BACKWARD, PARAMS)                                                 \
  template void launch_chained<T, BACKWARD, PARAMS>(const PARAMS&, const TileConfig&, cudaStream_t); \
  template cudaFuncAttributes chained_func_attrs<T, BACKWARD>(const TileConfig&);

}  // namespace linrec

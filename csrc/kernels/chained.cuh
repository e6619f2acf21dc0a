// The chained kernels: few long sequences, split across the whole GPU.
//
// One block per sequence leaves an H100 idle when there are fewer sequences
// than multiprocessors. Here every tile of E * NT elements is a unit of work:
// tiles are numbered sequence by sequence in scan order, and a persistent grid
// (as many blocks as fit on the GPU at once) takes tile numbers from an atomic
// counter. Each tile finds the state before it by decoupled look-back over the
// tiles before it (lookback.cuh), which may have to wait for them: so a block
// issues the loads of its next tile before resolving the current one, and the
// wait overlaps memory traffic instead of idling the block (on an H100, one
// block per tile without this prefetch ran 1 x 2^24 fp32 at 0.5-0.65 of copy).
//
// Deadlock-free without co-residency: tile numbers are handed out in order, a
// block holds at most two (its current one and the next, taken later), and it
// resolves its current one before the next; a tile waits only on smaller ones.
// The backward is the fused one of tiled.cuh, tile by tile.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../dispatch.h"
#include "../memio.h"
#include "../params.h"
#include "lookback.cuh"
#include "scan.cuh"
#include "tiled.cuh"

namespace linrec {

// A tile of the chained order: sequence `seq`, its k-th tile in scan order.
struct ChainedTile {
  int64_t seq, k;
  bool valid;
};

__device__ __forceinline__ ChainedTile next_chained_tile(void* workspace, int64_t tiles_per_seq, int64_t num_seqs) {
  const int64_t number = next_tile_number(workspace);
  return {number / tiles_per_seq, number % tiles_per_seq, number < tiles_per_seq * num_seqs};
}

// The statuses of sequence `seq`'s tiles.
template <typename Acc>
__device__ __forceinline__ TileStatus<Acc>* seq_statuses(void* workspace, int64_t seq, int64_t tiles_per_seq) {
  return ChainWorkspaceLayout::statuses<Acc>(workspace) + seq * tiles_per_seq;
}

// The tile scan entered with the state found by look-back over tile t's predecessors.
template <int E, int NT, typename Acc>
__device__ __forceinline__ void scan_chained_tile(Acc (&y)[E], Acc (&c)[E], bool rev, BlockScanStorage<Acc>& storage,
                                                  TileStatus<Acc>* statuses, int64_t k, Acc initial) {
  Acc carry_after = Acc(0);
  scan_tile_resolved<AlgoCode::kBlock, E, NT>(y, c, rev, carry_after, storage, [&](Acc total_y, Acc total_c) {
    return look_back(statuses, k, total_y, total_c, initial);
  });
}

template <typename T, int E_, int NT_, int M_>
__global__ void __launch_bounds__(NT_) chained_fwd_kernel(const ForwardParams p) {
  using Acc = acc_t<T>;
  constexpr TileConfig C = kConfigOf<E_, NT_, M_, static_cast<int>(AlgoCode::kBlock)>;
  constexpr int E = C.elems_per_thread;
  constexpr int NT = C.threads_per_block;
  Acc* smem = staging_smem<Acc>();
  __shared__ BlockScanStorage<Acc> storage;

  const TileOrder tiles = tile_order<C.tile_len(), false>(p.seq_len, p.reverse);
  const int64_t len = p.seq_len;
  const auto& es = p.index.elem_strides;
  // The current tile's sequence: its offsets in every tensor.
  int64_t off[kNumFwdSlots];
  auto inputs_of = [&](const int64_t (&o)[kNumFwdSlots]) { return static_cast<const T*>(p.inputs) + o[kFwdInputs]; };
  auto coeffs_of = [&](const int64_t (&o)[kNumFwdSlots]) { return static_cast<const T*>(p.coeffs) + o[kFwdCoeffs]; };

  ChainedTile tile = next_chained_tile(p.chain_workspace, tiles.num_tiles, p.num_seqs);
  if (!tile.valid) return;
  p.index.offsets(tile.seq, off);
  Acc xs[E], cs[E];
  load_tile<C.memcode>(xs, inputs_of(off), es[kFwdInputs], tiles.start(tile.k), len, Acc(0), smem);
  load_tile<C.memcode>(cs, coeffs_of(off), es[kFwdCoeffs], tiles.start(tile.k), len, Acc(1), smem);
  while (true) {
    const ChainedTile next = next_chained_tile(p.chain_workspace, tiles.num_tiles, p.num_seqs);
    int64_t next_off[kNumFwdSlots];
    PrefetchedTile<C.memcode, E, T, Acc> next_xs, next_cs;
    if (next.valid) {
      p.index.offsets(next.seq, next_off);
      next_xs.load(inputs_of(next_off), es[kFwdInputs], tiles.start(next.k), len, Acc(0), smem);
      next_cs.load(coeffs_of(next_off), es[kFwdCoeffs], tiles.start(next.k), len, Acc(1), smem);
    }
    const Acc initial = p.initial && tile.k == 0 ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kFwdInitial]])
                                                 : Acc(0);
    scan_chained_tile<E, NT>(xs, cs, p.reverse, storage, seq_statuses<Acc>(p.chain_workspace, tile.seq, tiles.num_tiles),
                             tile.k, initial);
    store_tile<C.memcode>(static_cast<T*>(p.outputs) + off[kFwdOutputs], es[kFwdOutputs], xs, tiles.start(tile.k), len,
                          smem);
    if (!next.valid) return;
    tile = next;
    for (int t = 0; t < kNumFwdSlots; ++t) off[t] = next_off[t];
    next_xs.take(xs);
    next_cs.take(cs);
  }
}

template <typename T, int E_, int NT_, int M_>
__global__ void __launch_bounds__(NT_) chained_bwd_kernel(const BackwardParams p) {
  using Acc = acc_t<T>;
  constexpr TileConfig C = kConfigOf<E_, NT_, M_, static_cast<int>(AlgoCode::kBlock)>;
  constexpr int E = C.elems_per_thread;
  constexpr int NT = C.threads_per_block;
  Acc* smem = staging_smem<Acc>();
  __shared__ BlockScanStorage<Acc> storage;

  const bool rev = !p.reverse;  // the backward scan runs against the forward direction
  const bool fwd_rev = p.reverse;
  const TileOrder tiles = tile_order<C.tile_len(), false>(p.seq_len, rev);
  const int64_t len = p.seq_len;
  const auto& es = p.index.elem_strides;
  int64_t off[kNumBwdSlots];
  auto d_outputs_of = [&](const int64_t (&o)[kNumBwdSlots]) {
    return static_cast<const T*>(p.d_outputs) + o[kBwdDOutputs];
  };
  auto coeffs_of = [&](const int64_t (&o)[kNumBwdSlots]) { return static_cast<const T*>(p.coeffs) + o[kBwdCoeffs]; };

  ChainedTile tile = next_chained_tile(p.chain_workspace, tiles.num_tiles, p.num_seqs);
  if (!tile.valid) return;
  p.index.offsets(tile.seq, off);
  Acc gs[E], cs[E];
  load_tile<C.memcode>(gs, d_outputs_of(off), es[kBwdDOutputs], tiles.start(tile.k), len, Acc(0), smem);
  load_tile<C.memcode>(cs, coeffs_of(off), es[kBwdCoeffs], tiles.start(tile.k), len, Acc(1), smem);
  while (true) {
    const ChainedTile next = next_chained_tile(p.chain_workspace, tiles.num_tiles, p.num_seqs);
    int64_t next_off[kNumBwdSlots];
    PrefetchedTile<C.memcode, E, T, Acc> next_gs, next_cs;
    if (next.valid) {
      p.index.offsets(next.seq, next_off);
      next_gs.load(d_outputs_of(next_off), es[kBwdDOutputs], tiles.start(next.k), len, Acc(0), smem);
      next_cs.load(coeffs_of(next_off), es[kBwdCoeffs], tiles.start(next.k), len, Acc(1), smem);
    }
    const int64_t start = tiles.start(tile.k);
    const Acc first_coeff = shift_bwd_coeffs(cs, coeffs_of(off), es[kBwdCoeffs], start, len, fwd_rev);
    scan_chained_tile<E, NT>(gs, cs, rev, storage, seq_statuses<Acc>(p.chain_workspace, tile.seq, tiles.num_tiles),
                             tile.k, Acc(0));
    store_tile<C.memcode>(static_cast<T*>(p.d_inputs) + off[kBwdDInputs], es[kBwdDInputs], gs, start, len, smem);
    const Acc initial = p.initial ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kBwdInitial]]) : Acc(0);
    store_bwd_coeffs<C.memcode>(gs, static_cast<const T*>(p.outputs) + off[kBwdOutputs], es[kBwdOutputs],
                                static_cast<T*>(p.d_coeffs) + off[kBwdDCoeffs], es[kBwdDCoeffs], start, len, fwd_rev,
                                initial, first_coeff, static_cast<T*>(p.d_initial) + off[kBwdDInitial], smem);
    if (!next.valid) return;
    tile = next;
    for (int t = 0; t < kNumBwdSlots; ++t) off[t] = next_off[t];
    next_gs.take(gs);
    next_cs.take(cs);
  }
}

template <typename T, TileConfig C, bool kBackward>
constexpr auto chained_kernel() {
  constexpr int M = static_cast<int>(C.memcode);
  if constexpr (kBackward) return chained_bwd_kernel<T, C.elems_per_thread, C.threads_per_block, M>;
  else return chained_fwd_kernel<T, C.elems_per_thread, C.threads_per_block, M>;
}

// Bytes of the chained kernels' workspace (zeroed by the caller) for this call.
template <typename T>
int64_t chained_workspace_bytes(int64_t num_seqs, int64_t seq_len, const TileConfig& config) {
  const int64_t tiles = (seq_len + config.tile_len() - 1) / config.tile_len();
  return ChainWorkspaceLayout::bytes<acc_t<T>>(num_seqs * tiles);
}

// Blocks of `kernel` that fit on one multiprocessor of the current device, asked once per device.
template <auto kKernel>
int resident_blocks_per_sm(int threads, int smem, int device) {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  if (device >= 0 && device < kMaxDevices && cached[device] > 0) return cached[device];
  int blocks = 0;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, threads, smem);
  if (err != cudaSuccess) throw std::runtime_error(std::string("linrec: occupancy query failed: ") + cudaGetErrorString(err));
  blocks = blocks > 0 ? blocks : 1;
  if (device >= 0 && device < kMaxDevices) cached[device] = blocks;
  return blocks;
}

// Launches the persistent chained kernel for `config`: min(tiles, resident blocks) blocks.
template <typename T, bool kBackward, typename Params>
void launch_chained(const Params& p, const TileConfig& config, cudaStream_t stream) {
  const std::string name = kBackward ? "linrec_chained_bwd" : "linrec_chained_fwd";
  dispatch_config(config, [&]<TileConfig C>() {
    constexpr auto kernel = chained_kernel<T, C, kBackward>();
    constexpr int smem = tiled_dynamic_smem_bytes<acc_t<T>, C>();
    allow_dynamic_smem<C, smem>(kernel, name);
    if (p.chain_workspace == nullptr) throw std::runtime_error("linrec: " + name + " needs a workspace");
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      throw std::runtime_error("linrec: " + name + " could not query the device");
    const int64_t tiles = p.num_seqs * tile_order<C.tile_len(), false>(p.seq_len, false).num_tiles;
    const int64_t resident = static_cast<int64_t>(sms) * resident_blocks_per_sm<kernel>(C.threads_per_block, smem, device);
    const int64_t blocks = tiles < resident ? tiles : resident;
    if (blocks == 0) return;
    kernel<<<static_cast<unsigned>(blocks), C.threads_per_block, smem, stream>>>(p);
    check_launch(name.c_str());
  }, name.c_str());
}

template <typename T, bool kBackward>
cudaFuncAttributes chained_func_attrs(const TileConfig& config) {
  cudaFuncAttributes attrs{};
  dispatch_config(config, [&]<TileConfig C>() {
    const cudaError_t err = cudaFuncGetAttributes(&attrs, chained_kernel<T, C, kBackward>());
    if (err != cudaSuccess) throw std::runtime_error(std::string("linrec: cudaFuncGetAttributes: ") + cudaGetErrorString(err));
  }, kBackward ? "linrec_chained_bwd" : "linrec_chained_fwd");
  return attrs;
}

#define LINREC_INSTANTIATE_CHAINED(T, BACKWARD, PARAMS)                                                 \
  template void launch_chained<T, BACKWARD, PARAMS>(const PARAMS&, const TileConfig&, cudaStream_t); \
  template cudaFuncAttributes chained_func_attrs<T, BACKWARD>(const TileConfig&);

}  // namespace linrec

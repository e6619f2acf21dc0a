// Tile and pipe kernels, forward and fused backward (the chained schedule for few
// long sequences, chained.cuh, shares the tile functions here).
//
// A sequence is cut into tiles of E * NT elements aligned to its start. `tile`
// gives one block a sequence of at most one tile; `pipe` gives one block a whole
// sequence and walks its tiles in scan order with the carry between them,
// loading the next tile before scanning the current one so the loads are in
// flight during the scan. Reverse runs the tiles, and the order inside each
// tile, from last to first over the same memory layout. The one-tile forward
// has a second kernel for sequences stored as aligned rows (rows.cuh).
//
// Backward (fused): with "next" meaning one step later in the forward direction,
//     d_inputs[l]  = conj(coeffs[next(l)]) * d_inputs[next(l)] + d_outputs[l]
//     d_coeffs[l]  = d_inputs[l] * conj(outputs[prev(l)])      (outputs[prev(first)] = initial)
//     d_initial    = d_inputs[first] * conj(coeffs[first])
// (conj only matters for complex storage, where PyTorch's gradient is the
// conjugate one; for real storage it is the identity)
// i.e. the same scan against the forward direction, over d_outputs with the
// coefficients shifted by one. Reads d_outputs, coeffs, outputs; writes
// d_inputs, d_coeffs: 5 tensors.
#pragma once
#include <cuda_runtime.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "../dispatch.h"
#include "../memio.h"
#include "../params.h"
#include "instances/families.h"
#include "primitives/grid_launch.cuh"
#include "primitives/rows.cuh"
#include "primitives/scan.cuh"

namespace linrec {

enum class Schedule : int { kOneTile, kPipe };

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

template <int64_t kTileLen, bool kOneTile>
__host__ __device__ __forceinline__ TileOrder tile_order(int64_t len, bool rev) {
  return {kOneTile ? 1 : (len + kTileLen - 1) / kTileLen, kTileLen, rev};
}

// The dynamic shared memory that the coalesced memio strategy stages tiles in.
template <typename Acc>
__device__ __forceinline__ Acc* staging_smem() {
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  return reinterpret_cast<Acc*>(dynamic_smem);
}

// Backward, before the scan: replaces cs (coeffs of this thread's elements of
// the tile at `start`) by the conjugated coefficients one forward step later,
// and returns conj(coeffs[first]) if this thread holds the forward direction's
// first step (else 0). conj is the identity for real storage (complex.cuh).
// With cuts, cs comes cut at its own positions (CutFlags); the one coefficient shift_window
// loads from beyond the warp is tested here.
template <int E, typename T, typename Acc>
__device__ __forceinline__ Acc shift_bwd_coeffs(Acc (&cs)[E], const T* c, int64_t stride, CutAt cut, int64_t start,
                                                int64_t len, bool fwd_rev) {
  const int64_t mine = start + static_cast<int64_t>(threadIdx.x) * E;
  const int64_t first = fwd_rev ? len - 1 : 0;
  Acc first_coeff = Acc(0);
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (mine + i == first) first_coeff = conj(cs[i]);
  // coeffs one forward step later: from the next position, or the previous one when reversed.
  shift_window(cs, c, stride, start, len, Acc(0), /*from_next=*/!fwd_rev);
  if (cut.cuts != nullptr) {
    const int lane = threadIdx.x % kWarpSize;
    if (!fwd_rev && lane == kWarpSize - 1 && cut(mine + E)) cs[E - 1] = Acc(0);
    if (fwd_rev && lane == 0 && cut(mine - 1)) cs[0] = Acc(0);
  }
  if constexpr (kIsComplex<Acc>) {  // a no-op loop for reals still reordered the pipe backward's PTX
#pragma unroll
    for (int i = 0; i < E; ++i) cs[i] = conj(cs[i]);
  }
  return first_coeff;
}

// Backward, after the scan (gs = d_inputs of the tile at `start`, ys = its
// outputs as load_tile gives them, shifted here in place): d_coeffs =
// d_inputs * conj(outputs one forward step earlier, `initial` before the first),
// and d_initial = d_inputs[first] * conj(coeffs[first]) by the thread that holds
// it (first_coeff, conjugated by shift_bwd_coeffs). For log storage d_coeffs is
// that of log c, times c: `own_cs`, the tile's coefficients at their own steps, kept
// through the scan (read again from L2 here instead, bf16 rows of 4096 took 0.78 of
// copy forward+backward against 0.91 for plain coefficients, H200).
template <MemCode M, int E, typename T, typename Tc, typename Acc>
__device__ __forceinline__ void store_bwd_coeffs_of(const Acc (&gs)[E], Acc (&ys)[E], const T* y, int64_t y_stride,
                                                    Tc* dc, int64_t dc_stride, const Acc (&own_cs)[E],
                                                    const CutFlags<E>& cut, int64_t start, int64_t len, bool fwd_rev,
                                                    Acc initial,
                                                    Acc first_coeff, T* d_initial, Acc* smem) {
  const int64_t mine = start + static_cast<int64_t>(threadIdx.x) * E;
  const int64_t first = fwd_rev ? len - 1 : 0;
  shift_window(ys, y, y_stride, start, len, initial, /*from_next=*/fwd_rev);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if (mine + i == first) *d_initial = from_acc<T>(gs[i] * first_coeff);
    ys[i] = gs[i] * conj(ys[i]);
  }
  if constexpr (kIsLog<Tc>) {
#pragma unroll
    for (int i = 0; i < E; ++i) ys[i] = coeff_grad<Tc>(ys[i], own_cs[i]);
  }
  cut.apply(ys);  // a cut step's coefficient is not used: its gradient is 0
  store_tile<M>(dc, dc_stride, ys, start, len, smem);
}

// The same, loading the tile's outputs first.
template <MemCode M, int E, typename T, typename Tc, typename Acc>
__device__ __forceinline__ void store_bwd_coeffs(const Acc (&gs)[E], const T* y, int64_t y_stride, Tc* dc,
                                                 int64_t dc_stride, const Acc (&own_cs)[E], const CutFlags<E>& cut,
                                                 int64_t start, int64_t len, bool fwd_rev, Acc initial,
                                                 Acc first_coeff, T* d_initial, Acc* smem) {
  Acc ys[E];
  load_tile<M>(ys, y, y_stride, start, len, Acc(0), smem);
  store_bwd_coeffs_of<M>(gs, ys, y, y_stride, dc, dc_stride, own_cs, cut, start, len, fwd_rev, initial,
                         first_coeff, d_initial, smem);
}

// Kernels take the config as plain ints: nvcc's host stubs cannot spell class-type template arguments.
template <int E, int NT, int M, int A>
constexpr TileConfig kConfigOf{E, NT, static_cast<MemCode>(M), static_cast<AlgoCode>(A)};

// The pipelined backward loads each tile's outputs with its d_outputs and coefficients, ahead of
// the scan, rather than after it, where the block waits for them, for 16-bit values (a raw 16-bit
// tile costs few registers; H100, 13200 x L bf16 16x64, kernel us, L = 2048 / 4096 / 8192 /
// 16384: 104.4 / 203.6 / 398.3 / 784.0 -> 96.5 / 185.5 / 371.1 / 744.4) and for float32 at 64
// threads a block and up to 8 elements a thread (H200, 13200 x 16384: 8x64 1216 -> 1093 us,
// 4x64 1273 -> 1257). float32 16x64 needs 176 registers instead of 159 for it and lost 1% at 8192.
// The one-tile backward does the same for 16-bit values: otherwise its block waits out a second
// load after the scan (H200, bf16 13200 x 1024 at 16x64: 51.2 -> 45.3 us, 20.0 forward).
template <typename St, Schedule S, int E, int NT, int M>
constexpr bool kLoadsOutputsEarly =
    static_cast<MemCode>(M) != MemCode::kCoalesced &&
    (sizeof(values_t<St>) == 2 || (S == Schedule::kPipe && sizeof(values_t<St>) == 4 && NT == 64 && E <= 8));

// Occupancy targets (blocks a multiprocessor, __launch_bounds__' second argument) for the float32
// pipe kernels at 4 elements a thread and 256 threads a block: their tiles are small, so bytes in
// flight come from resident blocks.
// - Forward: eight blocks (32 registers). At 40 registers six fit; H200, 13200 x 16384: 83% of
//   DRAM peak, and 0.94 -> 0.97-0.99 of copy with eight.
// - Backward: six blocks (40 registers; 60 without). H200, 13200 x 16384: 1332 -> 1180 us.
// 0 sets no target. Any other value, 1 included, emits .minnctapersm, which changes how ptxas
// allocates registers: at 1 the bfloat16 backward at 8x64 took 96 registers against 70 without
// and ran slower, and every 16-bit forward slowed (H200, bf16 13200 x 4096 at 16x64: 78.3 -> 87.3 us).
// The float32 backwards that load outputs early were measured at 1 (121 registers at 8x64) and
// keep it. 32 registers spill at 64 threads a block, with the coalesced strategy's staging, and
// for 16-bit or float64 values.
template <typename St, Schedule S, int E, int NT, int M>
constexpr bool kFloat32Pipe = S == Schedule::kPipe && E <= 4 && NT == 256 &&
                              static_cast<MemCode>(M) != MemCode::kCoalesced && sizeof(values_t<St>) == 4 &&
                              sizeof(acc_t<St>) == 4;
template <typename St, Schedule S, int E, int NT, int M>
constexpr int kFwdMinBlocks = kFloat32Pipe<St, S, E, NT, M> ? 2048 / NT : 0;
template <typename St, Schedule S, int E, int NT, int M>
constexpr int kBwdMinBlocks = kFloat32Pipe<St, S, E, NT, M> && static_cast<MemCode>(M) == MemCode::kVector ? 6
                              : kLoadsOutputsEarly<St, S, E, NT, M> && sizeof(values_t<St>) == 4          ? 1
                                                                                                         : 0;

template <typename St, int E_, int NT_, int M_, int A_, Schedule S>
__global__ void __launch_bounds__(NT_, (kFwdMinBlocks<St, S, E_, NT_, M_>)) tiled_fwd_kernel(const ForwardParams p) {
  using T = values_t<St>;
  using Tc = coeffs_t<St>;
  using Acc = acc_t<St>;
  constexpr TileConfig C = kConfigOf<E_, NT_, M_, A_>;
  constexpr int E = E_, NT = NT_;
  constexpr int64_t kTileLen = C.tile_len();
  static_assert(kTileLen % 32 == 0, "PrefetchedCutBits: tiles start at multiples of 32 steps");
  Acc* smem = staging_smem<Acc>();
  __shared__ BlockScanStorage<Acc> storage;

  const TileOrder tiles = tile_order<kTileLen, S == Schedule::kOneTile>(p.seq_len, p.reverse);
  int64_t off[kNumFwdSlots];
  p.index.offsets(blockIdx.x, off);
  wait_for_prior_grid();
  const T* x = static_cast<const T*>(p.inputs) + off[kFwdInputs];
  const Tc* c = static_cast<const Tc*>(p.coeffs) + off[kFwdCoeffs];
  T* y = static_cast<T*>(p.outputs) + off[kFwdOutputs];
  const int64_t sx = p.index.elem_strides[kFwdInputs], sc = p.index.elem_strides[kFwdCoeffs],
                sy = p.index.elem_strides[kFwdOutputs];
  const int64_t len = p.seq_len;
  const bool rev = p.reverse;
  Acc carry = p.initial ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kFwdInitial]]) : Acc(0);
  const int64_t mine = static_cast<int64_t>(threadIdx.x) * E;  // this thread's first element in a tile

  Acc xs[E], cs[E];
  PrefetchedCutBits<E> first_cuts;
  load_tile<C.memcode>(xs, x, sx, tiles.start(0), len, Acc(0), smem);
  load_tile<C.memcode>(cs, c, sc, tiles.start(0), len, Acc(1), smem);
  first_cuts.load(p.cut_bits, tiles.start(0) + mine, len);
  CutFlags<E> cuts = first_cuts.take();
  for (int64_t k = 0; k < tiles.num_tiles; ++k) {
    PrefetchedTile<C.memcode, E, T, Acc> next_xs;
    PrefetchedTile<C.memcode, E, Tc, Acc> next_cs;
    PrefetchedCutBits<E> next_cuts;
    if (S == Schedule::kPipe && k + 1 < tiles.num_tiles) {
      next_xs.load(x, sx, tiles.start(k + 1), len, Acc(0), smem);
      next_cs.load(c, sc, tiles.start(k + 1), len, Acc(1), smem);
      next_cuts.load(p.cut_bits, tiles.start(k + 1) + mine, len);
    }
    cuts.apply(cs);
    scan_tile<C.algocode, E, NT>(xs, cs, rev, carry, storage);
    store_tile<C.memcode>(y, sy, xs, tiles.start(k), len, smem);
    if constexpr (S == Schedule::kPipe) {
      next_xs.take(xs);
      next_cs.take(cs);
      cuts = next_cuts.take();
    }
  }
}

// The one-tile forward over aligned rows (rows.cuh), for the vector memory
// strategy: the same scan, with the direction a template argument and each
// thread's elements one aligned vector load a tensor. A thread past the end of
// a shorter sequence holds identity steps (x = 0, c = 1). Shorter code than the
// general kernel, and fewer registers (bf16 16x64: 48 against 64). H100,
// 13200 x 1024 bf16, kernel µs (python -m tools config-sweep, one run): 27.9
// against 29.8 for the general kernel with one tile (pipe 16x64); torch.add 27.2.
template <typename S, int E, int NT, int A, bool kRev>
__global__ void __launch_bounds__(NT) tile_rows_fwd_kernel(const AlignedRows<kNumFwdSlots> p) {
  using T = values_t<S>;
  using Acc = acc_t<S>;
  __shared__ BlockScanStorage<Acc> storage;
  const int64_t n = blockIdx.x;
  const int first = static_cast<int>(threadIdx.x) * E;
  const bool holds = first < p.seq_len;  // seq_len is a multiple of E, at most E * NT
  Acc xs[E], cs[E];
  load_fwd_row<S>(xs, cs, p, n, first, holds);
  Acc carry = p.data[kFwdInitial] ? to_acc<Acc>(*row_of<const T>(p, kFwdInitial, n)) : Acc(0);
  scan_tile<static_cast<AlgoCode>(A), E, NT>(xs, cs, kRev, carry, storage);
  if (holds) store_aligned(row_of<T>(p, kFwdOutputs, n) + first, xs);
}

template <typename St, int E_, int NT_, int M_, int A_, Schedule S>
__global__ void __launch_bounds__(NT_, (kBwdMinBlocks<St, S, E_, NT_, M_>)) tiled_bwd_kernel(const BackwardParams p) {
  using T = values_t<St>;
  using Tc = coeffs_t<St>;
  using Acc = acc_t<St>;
  constexpr TileConfig C = kConfigOf<E_, NT_, M_, A_>;
  constexpr int E = E_, NT = NT_;
  constexpr int64_t kTileLen = C.tile_len();
  static_assert(kTileLen % 32 == 0, "PrefetchedCutBits: tiles start at multiples of 32 steps");
  Acc* smem = staging_smem<Acc>();
  __shared__ BlockScanStorage<Acc> storage;

  const bool rev = !p.reverse;  // the backward scan runs against the forward direction
  const TileOrder tiles = tile_order<kTileLen, S == Schedule::kOneTile>(p.seq_len, rev);
  int64_t off[kNumBwdSlots];
  p.index.offsets(blockIdx.x, off);
  wait_for_prior_grid();
  const auto& es = p.index.elem_strides;
  const T* dy = static_cast<const T*>(p.d_outputs) + off[kBwdDOutputs];
  const Tc* c = static_cast<const Tc*>(p.coeffs) + off[kBwdCoeffs];
  const T* y = static_cast<const T*>(p.outputs) + off[kBwdOutputs];
  T* dx = static_cast<T*>(p.d_inputs) + off[kBwdDInputs];
  Tc* dc = static_cast<Tc*>(p.d_coeffs) + off[kBwdDCoeffs];
  const int64_t len = p.seq_len;
  const bool fwd_rev = p.reverse;
  const Acc initial = p.initial ? to_acc<Acc>(static_cast<const T*>(p.initial)[off[kBwdInitial]]) : Acc(0);
  const CutAt cut{p.cuts, len};
  Acc carry = Acc(0);

  using Prefetched = PrefetchedTile<C.memcode, E, T, Acc>;
  constexpr bool kEarlyOutputs = kLoadsOutputsEarly<St, S, E, NT, M_>;
  Acc gs[E], cs[E];
  Prefetched ys_ahead;
  const int64_t mine = static_cast<int64_t>(threadIdx.x) * E;  // this thread's first element in a tile
  PrefetchedCutBits<E> first_cuts;
  load_tile<C.memcode>(gs, dy, es[kBwdDOutputs], tiles.start(0), len, Acc(0), smem);
  load_tile<C.memcode>(cs, c, es[kBwdCoeffs], tiles.start(0), len, Acc(1), smem);
  if constexpr (kEarlyOutputs) ys_ahead.load(y, es[kBwdOutputs], tiles.start(0), len, Acc(0), smem);
  first_cuts.load(p.cut_bits, tiles.start(0) + mine, len);
  CutFlags<E> cuts = first_cuts.take();
  for (int64_t k = 0; k < tiles.num_tiles; ++k) {
    const int64_t start = tiles.start(k);
    Prefetched next_gs, next_ys;
    PrefetchedTile<C.memcode, E, Tc, Acc> next_cs;
    PrefetchedCutBits<E> next_cuts;
    if (S == Schedule::kPipe && k + 1 < tiles.num_tiles) {
      next_gs.load(dy, es[kBwdDOutputs], tiles.start(k + 1), len, Acc(0), smem);
      next_cs.load(c, es[kBwdCoeffs], tiles.start(k + 1), len, Acc(1), smem);
      if constexpr (kEarlyOutputs) next_ys.load(y, es[kBwdOutputs], tiles.start(k + 1), len, Acc(0), smem);
      next_cuts.load(p.cut_bits, tiles.start(k + 1) + mine, len);
    }
    cuts.apply(cs);
    Acc own_cs[E];  // log storage: the coefficients at their own steps, for the gradient of log c
    if constexpr (kIsLog<Tc>) {
#pragma unroll
      for (int i = 0; i < E; ++i) own_cs[i] = cs[i];
    }
    const Acc first_coeff = shift_bwd_coeffs(cs, c, es[kBwdCoeffs], cut, start, len, fwd_rev);
    scan_tile<C.algocode, E, NT>(gs, cs, rev, carry, storage);
    store_tile<C.memcode>(dx, es[kBwdDInputs], gs, start, len, smem);
    T* d_initial = static_cast<T*>(p.d_initial) + off[kBwdDInitial];
    if constexpr (kEarlyOutputs) {
      Acc ys[E];
      ys_ahead.take(ys);
      store_bwd_coeffs_of<C.memcode>(gs, ys, y, es[kBwdOutputs], dc, es[kBwdDCoeffs], own_cs, cuts, start,
                                     len, fwd_rev, initial, first_coeff, d_initial, smem);
    } else {
      store_bwd_coeffs<C.memcode>(gs, y, es[kBwdOutputs], dc, es[kBwdDCoeffs], own_cs, cuts, start, len,
                                  fwd_rev, initial, first_coeff, d_initial, smem);
    }
    if constexpr (S == Schedule::kPipe) {
      next_gs.take(gs);
      next_cs.take(cs);
      cuts = next_cuts.take();
      if constexpr (kEarlyOutputs) ys_ahead = next_ys;
    }
  }
}

template <typename St, TileConfig C, Schedule S, bool kBackward>
constexpr auto tiled_kernel() {
  constexpr int M = static_cast<int>(C.memcode), A = static_cast<int>(C.algocode);
  if constexpr (kBackward) return tiled_bwd_kernel<St, C.elems_per_thread, C.threads_per_block, M, A, S>;
  else return tiled_fwd_kernel<St, C.elems_per_thread, C.threads_per_block, M, A, S>;
}

inline std::string tiled_name(Schedule s, bool backward) {
  return std::string("linrec_") + (s == Schedule::kOneTile ? "tile" : "pipe") + (backward ? "_bwd" : "_fwd");
}

// Raises kKernel's limit of dynamic shared memory to kSmem bytes where a block
// would otherwise not launch: past 48 KiB of shared memory in all, counting the
// kernel's static shared memory as compiled (the same for every architecture:
// it is declared, not tuned).
template <auto kKernel, TileConfig C, int kSmem>
void allow_dynamic_smem(const std::string& name) {
  if constexpr (kSmem > 0) {
    static const int static_bytes = static_cast<int>(kernel_attributes(kKernel).sharedSizeBytes);
    if (kSmem + static_bytes <= 48 * 1024) return;
    const cudaError_t err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) {
      cudaGetLastError();  // reported here, not left for the next launch's check to report as its own
      throw std::runtime_error("linrec: " + name + " needs " + std::to_string(kSmem + static_bytes) +
                               " bytes of shared memory for " + C.to_string() + ": " + cudaGetErrorString(err));
    }
  }
}

constexpr KernelKind tiled_kind(Schedule s) { return s == Schedule::kOneTile ? KernelKind::kTile : KernelKind::kPipe; }

// Launches the tile or pipe kernel for `config`: one block per sequence. The
// one-tile forward over aligned rows takes tile_rows_fwd_kernel.
template <typename T, Schedule S, bool kBackward, typename Params>
void launch_tiled(const Params& p, const TileConfig& config, cudaStream_t stream) {
  const std::string name = tiled_name(S, kBackward);
  dispatch_config<Family<tiled_kind(S)>::template configs<T>()>(config, [&]<TileConfig C>() {
    constexpr auto kernel = tiled_kernel<T, C, S, kBackward>();
    constexpr int smem = tiled_dynamic_smem_bytes<acc_t<T>, C>();
    allow_dynamic_smem<kernel, C, smem>(name);
    if (p.num_seqs > 0x7fffffff) throw std::runtime_error("linrec: " + name + " needs more than 2^31-1 blocks");
    const unsigned grid = static_cast<unsigned>(p.num_seqs);
    if constexpr (S == Schedule::kOneTile && !kBackward && C.memcode == MemCode::kVector) {
      AlignedRows<kNumFwdSlots> rows;
      if (aligned_rows<T, C.elems_per_thread>(p, rows)) {
        constexpr int E = C.elems_per_thread, NT = C.threads_per_block, A = static_cast<int>(C.algocode);
        if (p.reverse) launch_kernel<tile_rows_fwd_kernel<T, E, NT, A, true>>(grid, NT, 0, stream, rows);
        else launch_kernel<tile_rows_fwd_kernel<T, E, NT, A, false>>(grid, NT, 0, stream, rows);
        return check_launch(name.c_str());
      }
    }
    launch_kernel<kernel>(grid, C.threads_per_block, smem, stream, p);
    check_launch(name.c_str());
  }, name.c_str());
}

// Attributes of the `variant` kernel for `config`: aligned-rows variants exist for
// the one-tile forward with vector loads only.
template <typename T, Schedule S, bool kBackward>
std::optional<cudaFuncAttributes> tiled_func_attrs(const TileConfig& config, KernelVariant variant) {
  std::optional<cudaFuncAttributes> attrs;
  dispatch_config<Family<tiled_kind(S)>::template configs<T>()>(config, [&]<TileConfig C>() {
    if (variant == KernelVariant::kGeneral) {
      attrs = kernel_attributes(tiled_kernel<T, C, S, kBackward>());
    } else if constexpr (S == Schedule::kOneTile && !kBackward && C.memcode == MemCode::kVector) {
      constexpr int E = C.elems_per_thread, NT = C.threads_per_block, A = static_cast<int>(C.algocode);
      attrs = variant == KernelVariant::kRowsReverse ? kernel_attributes(tile_rows_fwd_kernel<T, E, NT, A, true>)
                                                     : kernel_attributes(tile_rows_fwd_kernel<T, E, NT, A, false>);
    }
  }, tiled_name(S, kBackward).c_str());
  return attrs;
}

template <typename S, bool kBackward>
void Family<KernelKind::kTile>::launch(const ParamsOf<kBackward>& p, const TileConfig& config, cudaStream_t stream) {
  launch_tiled<S, Schedule::kOneTile, kBackward>(p, config, stream);
}

template <typename S, bool kBackward>
std::optional<cudaFuncAttributes> Family<KernelKind::kTile>::attributes(const TileConfig& config,
                                                                        KernelVariant variant) {
  return tiled_func_attrs<S, Schedule::kOneTile, kBackward>(config, variant);
}

template <typename S, bool kBackward>
void Family<KernelKind::kPipe>::launch(const ParamsOf<kBackward>& p, const TileConfig& config, cudaStream_t stream) {
  launch_tiled<S, Schedule::kPipe, kBackward>(p, config, stream);
}

template <typename S, bool kBackward>
std::optional<cudaFuncAttributes> Family<KernelKind::kPipe>::attributes(const TileConfig& config,
                                                                        KernelVariant variant) {
  return tiled_func_attrs<S, Schedule::kPipe, kBackward>(config, variant);
}

}  // namespace linrec

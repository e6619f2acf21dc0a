// The fused selective scan (Mamba's S6), forward and backward: the plan, and the launches.
// The math is in csrc/selective_params.h, the design in docs/design/0023-fused-selective-scan.md;
// the kernels in selective/ (memory.cuh, common.cuh, forward.cuh, backward.cuh).
//
// Work plan. A warp owns one channel (b, d) and walks its sequence in chunks of 32 * K
// steps; lane l holds the chunk's steps l*K .. l*K+K-1 in registers (u, dt, dt*u, ...),
// loaded as 16-byte vectors where the rows allow. For each state n in turn:
//   1. each lane turns its K steps into one affine map h -> pa * h + pb
//      (a = exp(dt * A[n]), b = dt * u * B[n]): K exponentials, the unit the scan is bound by;
//   2. the state entering the chunk (shared memory, per state) folds into lane 0's map, and
//      a warp scan of the maps (log2(32) shuffle rounds) gives each lane its entering state;
//   3. each lane replays its K steps from that state and adds C[n] * h into its outputs.
// The chunk's outputs then store as vectors. Nothing of size (batch, dim, N, L) exists: the
// forward keeps only each chunk's state, and saves every kCheckpointSteps-th as a checkpoint.
//
// The backward takes the chunks last to first. For each state it replays the chunk from the
// checkpoint at its start (steps 1-3), then runs the state gradient dh[t] = C[t] * g[t] +
// a[t+1] * dh[t+1] the same way in reverse: lane maps, a reverse warp scan seeded with the
// gradient flowing in from the chunk after, a replay. d_B and d_C of per-step B and C sum
// over channels: the block's warps (channels of one group) add in shared memory, then one
// atomic per step and state goes to the float accumulators; otherwise each warp adds its own.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../config.h"
#include "../dispatch.h"
#include "primitives/grid_launch.cuh"
#include "selective/backward.cuh"
#include "selective/forward.cuh"

namespace linrec::selective {

// Whether the rows of a (batch, dim, L) tensor load as 16-byte vectors of K steps: unit
// stride along the sequence, and every run of either direction 16-byte aligned.
inline bool steps_vector(const void* data, const Strides3& s, int64_t L, size_t bytes) {
  return data && s.step == 1 && reinterpret_cast<uintptr_t>(data) % 16 == 0 && (s.batch * bytes) % 16 == 0 &&
         (s.channel * bytes) % 16 == 0 && (L * bytes) % 16 == 0;
}

template <typename V, typename BCT>
VectorRows vector_rows(const SelectiveParams& p) {
  using Acc = acc_t<V>;
  const auto bc_aligned = [&](const void* data, const StridesBC& s, bool per_step) {
    if (!per_step) return true;
    const int64_t bytes = sizeof(BCT);
    return s.step == 1 && reinterpret_cast<uintptr_t>(data) % 16 == 0 && (s.batch * bytes) % 16 == 0 &&
           (s.group * bytes) % 16 == 0 && (s.state * bytes) % 16 == 0 && (p.seq_len * bytes) % 16 == 0;
  };
  VectorRows v;
  v.u = steps_vector(p.u, p.u_strides, p.seq_len, sizeof(V));
  v.delta = steps_vector(p.delta, p.delta_strides, p.seq_len, sizeof(V));
  v.z = steps_vector(p.z, p.z_strides, p.seq_len, sizeof(V));
  v.bc = bc_aligned(p.B, p.b_strides, p.b_per_step) && bc_aligned(p.C, p.c_strides, p.c_per_step);
  // The outputs are contiguous and freshly allocated; the float accumulators need L % 4 == 0.
  v.out = (p.seq_len * sizeof(V)) % 16 == 0 && (p.seq_len * sizeof(Acc)) % 16 == 0;
  return v;
}

// The shared memory a block of the current device may opt in to (0 if the query fails).
inline size_t max_shared_bytes() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();  // answered with 0, not left for the launch check to report
    return 0;
  }
  return size_t(bytes);
}

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* op, int64_t states) {
  if (bytes <= 48 * 1024) return;
  if (bytes > max_shared_bytes() ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) != cudaSuccess) {
    cudaGetLastError();
    throw std::invalid_argument(std::string("linrec: ") + op + " with A's N=" + std::to_string(states) +
                                " states needs " + std::to_string(bytes) +
                                " bytes of shared memory a block, more than this GPU has; use fewer states");
  }
}

// Whether the block's warps share per-step B and C through shared tiles: they are channels of
// one group (every block full), and the tiles fit beside `other_bytes` in kTileBudget.
constexpr size_t kTileBudget = 100 * 1024;
template <typename BCT, int K, int kWarps>
bool share_tiles(const SelectiveParams& p, size_t other_bytes) {
  const size_t bytes = BCSource<BCT, acc_t<BCT>, K, kWarps>::tile_bytes(p);
  return bytes > 0 && (p.dim / p.groups) % kWarps == 0 && round_up_16(other_bytes) + bytes <= kTileBudget;
}

template <int kWarps>
int64_t num_blocks(const SelectiveParams& p) {
  return p.batch * ((p.dim + kWarps - 1) / kWarps);
}

template <typename V, typename BCT, SelectiveConfig kConfig>
void launch_fwd(const SelectiveParams& p, cudaStream_t stream) {
  constexpr int K = kConfig.steps_per_thread, kWarps = kConfig.warps;
  const auto kernel =
      p.cuts ? selective_fwd_kernel<V, BCT, K, kWarps, true> : selective_fwd_kernel<V, BCT, K, kWarps, false>;
  const size_t own = fwd_shared_bytes<acc_t<V>, K, kWarps>(p);
  const bool tiled = share_tiles<BCT, K, kWarps>(p, own);
  const size_t bytes = tiled ? round_up_16(own) + BCSource<BCT, acc_t<V>, K, kWarps>::tile_bytes(p) : own;
  allow_shared(kernel, bytes, "selective_scan_fwd", p.states);
  kernel<<<num_blocks<kWarps>(p), 32 * kWarps, bytes, stream>>>(p, vector_rows<V, BCT>(p), tiled);
  check_launch("selective_scan_fwd");
}

template <typename V, typename BCT, SelectiveConfig kConfig>
void launch_bwd(const SelectiveGradParams& p, cudaStream_t stream) {
  using Acc = acc_t<V>;
  constexpr int K = kConfig.steps_per_thread, kWarps = kConfig.warps;
  const auto kernel =
      p.cuts ? selective_bwd_kernel<V, BCT, K, kWarps, true> : selective_bwd_kernel<V, BCT, K, kWarps, false>;
  // The block's warps add their d_B and d_C first where they are channels of one group.
  const bool block_sums = (p.b_per_step || p.c_per_step) && (p.dim / p.groups) % kWarps == 0;
  const size_t own = bwd_shared_bytes<Acc, K, kWarps>(p, block_sums);
  const bool tiled = share_tiles<BCT, K, kWarps>(p, own);
  const size_t bytes = tiled ? round_up_16(own) + BCSource<BCT, Acc, K, kWarps>::tile_bytes(p) : own;
  allow_shared(kernel, bytes, "selective_scan_bwd", p.states);
  VectorRows vec = vector_rows<V, BCT>(p);
  vec.d_y = steps_vector(p.d_y, p.d_y_strides, p.seq_len, sizeof(V));
  kernel<<<num_blocks<kWarps>(p), 32 * kWarps, bytes, stream>>>(p, vec, block_sums, tiled);
  check_launch("selective_scan_bwd");
}

template <bool kBackward>
using SelectiveParamsOf = std::conditional_t<kBackward, SelectiveGradParams, SelectiveParams>;

// The kernels of storage (V, BCT) at the compiled config equal to `config`.
template <typename V, typename BCT, bool kBackward>
void launch(const SelectiveParamsOf<kBackward>& p, const SelectiveConfig& config, cudaStream_t stream) {
  dispatch_config<SELECTIVE_CONFIG_LIST>(
      config,
      [&]<SelectiveConfig kConfig>() {
        if constexpr (kBackward) launch_bwd<V, BCT, kConfig>(p, stream);
        else launch_fwd<V, BCT, kConfig>(p, stream);
      },
      "selective_scan");
}

}  // namespace linrec::selective

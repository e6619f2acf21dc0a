// Launching the strided kernels: which kernel a layout takes (channel pairs,
// lane groups, dense few-channel chunks), the workspace, and the instantiations.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "instances/families.h"
#include "strided.cuh"
#include "strided_flat.cuh"

namespace linrec {

// Whether `holds(slot, data)` is true of every tensor a strided launch reads
// or writes along the scan: all but the initial state (read and written per
// channel).
template <typename Params, typename Pred>
bool all_scanned_tensors(const Params& p, Pred holds) {
  if constexpr (std::is_same_v<Params, ForwardParams>) {
    return holds(kFwdInputs, p.inputs) && holds(kFwdCoeffs, p.coeffs) && holds(kFwdOutputs, p.outputs);
  } else {
    return holds(kBwdDOutputs, p.d_outputs) && holds(kBwdCoeffs, p.coeffs) && holds(kBwdOutputs, p.outputs) &&
           holds(kBwdDInputs, p.d_inputs) && holds(kBwdDCoeffs, p.d_coeffs);
  }
}

// Whether slot t of Params holds coefficients or their gradient (coeffs_t of the storage).
template <typename Params>
constexpr bool is_coeffs_slot(int t) {
  if constexpr (std::is_same_v<Params, ForwardParams>) return t == kFwdCoeffs;
  else return t == kBwdCoeffs || t == kBwdDCoeffs;
}

// Whether each lane may scan two adjacent channels: 16-bit values, and in
// every scanned tensor the innermost sequence dimension is unit-stride and
// even, and every other stride and the base are even, so each lane's pair is
// one aligned word (4 bytes; 8 for float32 coefficients in mixed storage).
template <typename S, typename Params>
bool strided_pairs_channels(const Params& p) {
  const auto& ix = p.index;
  if (sizeof(values_t<S>) != 2 || ix.num_dims == 0 || ix.sizes[ix.num_dims - 1] % 2 != 0) return false;
  return all_scanned_tensors(p, [&](int t, const void* data) {
    const size_t elem_bytes = is_coeffs_slot<Params>(t) ? sizeof(coeffs_t<S>) : sizeof(values_t<S>);
    if (reinterpret_cast<uintptr_t>(data) % (2 * elem_bytes) != 0) return false;
    if (ix.seq_strides[t][ix.num_dims - 1] != 1 || ix.elem_strides[t] % 2 != 0) return false;
    for (int k = 0; k + 1 < ix.num_dims; ++k)
      if (ix.seq_strides[t][k] % 2 != 0) return false;
    return true;
  });
}

// Whether the dense few-channel kernel (strided_flat.cuh) runs: rows of at
// most 16 bytes, one sequence dim (the channels) of unit stride, rows of
// exactly num_seqs elements, 16-byte aligned data, and T * D * sizeof(T) a
// multiple of 16 bytes. H100, µs forward / fwd+bwd, lane-group kernel -> this
// one (python -m tools shape-sweep, LINREC_STRIDED_FLAT=0 and 1 in one run):
//   8-byte rows,  (1, 2^22, 4) bf16: 122.8 / 318.4 -> 68.9 / 178.2
//   16-byte rows, (1, 2^21, 8) bf16:  80.0 / 190.2 -> 68.7 / 175.5
//                 (1, 2^22, 4) fp32: 118.5 / 308.1 -> 95.2 / 266.4
//   32-byte rows, (1, 2^20, 16) bf16: 72.2 / 164.2 -> 71.4 / 182.2
//                 (1, 2^21, 8) fp32: 101.1 / 250.4 -> 98.6 / 273.2
//   64-byte rows, (1, 2^20, 16) fp32: 96.6 / 239.1 -> 99.9 / 275.0
// From 32-byte rows a thread's own copies fill whole sectors, and the backward
// loses. LINREC_STRIDED_FLAT=0 in the environment turns it off (A/B timing).
// Complex storage (rows of one or two complex64) keeps the lane-group kernel:
// the dense kernel's backward is written for real values only; so does mixed
// storage, whose tensors' rows differ in bytes.
constexpr int kFlatMaxRowBytes = 16;
template <typename T, typename Params>
bool strided_dense_rows(const Params& p) {
  if constexpr (kIsComplex<T> || kIsMixed<T>) return false;
  static const bool enabled = [] {
    const char* v = std::getenv("LINREC_STRIDED_FLAT");
    return v == nullptr || v[0] != '0';
  }();
  const auto& ix = p.index;
  const int64_t row_bytes = p.num_seqs * static_cast<int64_t>(sizeof(T));
  if (!enabled || p.cuts != nullptr || row_bytes > kFlatMaxRowBytes || ix.num_dims > 1 || (p.seq_len * row_bytes) % 16 != 0) return false;
  return all_scanned_tensors(p, [&](int t, const void* data) {
    return reinterpret_cast<uintptr_t>(data) % 16 == 0 && ix.elem_strides[t] == p.num_seqs &&
           (ix.num_dims == 0 || ix.seq_strides[t][0] == 1);
  });
}

// Bytes of the strided kernels' workspace (cleared by the launch): one status
// per (chunk, sequence), sequences padded to a whole group, for either lane
// width (the launch picks it from the strides).
template <typename T>
int64_t Family<KernelKind::kStrided>::workspace_bytes(int64_t num_seqs, int64_t seq_len, const TileConfig& config) {
  int64_t statuses = 0;
  for (int v = 1; v <= (sizeof(values_t<T>) == 2 ? kStridedMaxChannelsPerLane : 1); ++v) {
    const StridedLayout l =
        strided_layout(num_seqs, seq_len, config.threads_per_block / kWarpSize, config.elems_per_thread, v);
    statuses = std::max(statuses, l.padded_seqs() * l.num_chunks);
  }
  return ChainWorkspaceLayout::bytes<acc_t<T>>(statuses);
}

template <typename T, TileConfig C, int V, bool kBackward, typename Params>
void launch_strided_with(const Params& p, bool dense_rows, cudaStream_t stream, const std::string& name) {
  const StridedLayout layout =
      strided_layout(p.num_seqs, p.seq_len, C.threads_per_block / kWarpSize, C.elems_per_thread, V);
  const int64_t blocks = layout.groups * layout.num_chunks;
  if (blocks > 0x7fffffff) throw std::runtime_error("linrec: " + name + " needs more than 2^31-1 blocks");
  if (blocks == 0) return;
  constexpr int smem = strided_dynamic_smem_bytes<T, C, V, kBackward>();
  // Lane groups are a kernel of their own, so that the one-slice kernel's
  // layout folds to constants: one kernel for both took the bench's
  // (8, 4096, 2048) bf16 forward from 149.8 to 153.8-155.0 µs (H100, three
  // runs, python -m tools shape-sweep).
  auto launch = [&]<bool kLaneGroups>() {
    constexpr auto kernel = strided_kernel_for<T, C, V, kBackward, kLaneGroups>();
    allow_dynamic_smem<kernel, C, smem>(name);
    launch_kernel<kernel>(static_cast<unsigned>(blocks), C.threads_per_block, smem, stream, p);
  };
  if constexpr (C.memcode == MemCode::kStaged && !kIsComplex<T> && !kIsMixed<T>) {
    if (layout.slices_per_warp > 1 && dense_rows) {
      constexpr int E = C.elems_per_thread, NT = C.threads_per_block;
      constexpr auto kernel = strided_flat_kernel<T, E, NT, V, kBackward, Params>;
      allow_dynamic_smem<kernel, C, flat_max_smem_bytes<T, E, NT, V, kBackward>()>(name);
      const int flat_smem = flat_smem_bytes<T, E, NT, V, kBackward>(p.num_seqs);
      launch_kernel<kernel>(static_cast<unsigned>(blocks), NT, flat_smem, stream, p);
      return check_launch(name.c_str());
    }
  }
  if (layout.slices_per_warp > 1)
    launch.template operator()<true>();
  else
    launch.template operator()<false>();
  check_launch(name.c_str());
}

template <typename T, bool kBackward>
void Family<KernelKind::kStrided>::launch(const ParamsOf<kBackward>& p, const TileConfig& config,
                                          cudaStream_t stream) {
  const std::string name = kBackward ? "linrec_strided_bwd" : "linrec_strided_fwd";
  if (p.chain_workspace == nullptr) throw std::runtime_error("linrec: " + name + " needs a workspace");
  const bool pairs = strided_pairs_channels<T>(p);
  const bool dense_rows = strided_dense_rows<T>(p);
  dispatch_config<configs<T>()>(config, [&]<TileConfig C>() {
    if constexpr (sizeof(values_t<T>) == 2) {
      if (pairs) return launch_strided_with<T, C, 2, kBackward>(p, dense_rows, stream, name);
    }
    launch_strided_with<T, C, 1, kBackward>(p, dense_rows, stream, name);
  }, name.c_str());
}

template <typename T, bool kBackward>
std::optional<cudaFuncAttributes> Family<KernelKind::kStrided>::attributes(const TileConfig& config,
                                                                           KernelVariant variant) {
  std::optional<cudaFuncAttributes> attrs;
  if (variant != KernelVariant::kGeneral) return attrs;
  dispatch_config<configs<T>()>(config, [&]<TileConfig C>() {
    // The kernel a contiguous channel-last layout runs: channel pairs for 16-bit storage.
    constexpr int V = sizeof(values_t<T>) == 2 ? kStridedMaxChannelsPerLane : 1;
    attrs = kernel_attributes(strided_kernel_for<T, C, V, kBackward, false>());
  }, kBackward ? "linrec_strided_bwd" : "linrec_strided_fwd");
  return attrs;
}

}  // namespace linrec

// The ops' CUDA kernels: the module linrec._C_cuda. Its schemas come from
// linrec._C (ops.cpp), loaded first; this module links torch's CUDA library and
// the CUDA runtime, so Python loads it only where torch's CUDA version matches
// the build's (python/linrec/_backend.py). Argument checks are ops.cpp's
// (op_args.h); here a shape becomes a kernel choice, a workspace and a launch
// on torch's current stream.
#include <torch/csrc/stable/accelerator.h>

#include <optional>
#include <tuple>

#include "../kernels/launch.h"
#include "../tuning/kernel_choice.h"
#include "cuda_stream.h"
#include "op_args.h"

namespace linrec {
namespace {

// The ops' last five arguments, as the schema passes them (ops.cpp): which kernel, and its config.
struct KernelArgs {
  int64_t kernel, elems_per_thread, threads_per_block, memcode, algocode;
};

// The compiled config named by the op's arguments, checked against what the family is
// compiled at for this storage (csrc/registry.toml), or the tuned choice for kernel 0.
KernelChoice choose(const KernelArgs& args, int64_t seq_len, int64_t num_seqs, bool interleaved, bool backward,
                    Storage storage, int device) {
  const auto [kernel, elems_per_thread, threads_per_block, memcode, algocode] = args;  // in range: check_kernel_args
  const auto kind = static_cast<KernelKind>(kernel);
  if (kind == KernelKind::kAuto)
    return choose_kernel(storage, seq_len, num_seqs, interleaved, backward, device, cuda_sm_count(device));
  const char* name = kernel_kind_name(kind);
  STD_TORCH_CHECK(cuda_compiled(storage, kind), "linrec: the ", name, " kernels are not compiled for these dtypes");
  const TileConfig config{static_cast<int>(elems_per_thread), static_cast<int>(threads_per_block),
                          static_cast<MemCode>(memcode), static_cast<AlgoCode>(algocode)};
  if (kind == KernelKind::kRef) return {kind, config};
  bool compiled = false;
  for (const TileConfig& c : cuda_compiled_configs(storage, kind)) compiled = compiled || c == config;
  STD_TORCH_CHECK(compiled, "linrec: the ", name, " kernels are not compiled for ", config.to_string(),
                  " at these dtypes; see linrec.compiled_configs(", name, ", dtype)");
  if (kind == KernelKind::kTile)
    STD_TORCH_CHECK(seq_len <= config.tile_len(), "linrec: the tile kernel scans at most elems_per_thread * "
                    "threads_per_block = ", config.tile_len(), " elements, but the sequence has ", seq_len,
                    "; use the pipe kernel or a larger config");
  if (kind == KernelKind::kPacked)
    STD_TORCH_CHECK(seq_len <= 32 * config.elems_per_thread, "linrec: the packed kernel holds at most 32 * "
                    "elems_per_thread = ", 32 * config.elems_per_thread, " elements, but the sequence has ", seq_len);
  return {kind, config};
}

// The workspace of the chained and strided kernels, if `c` needs one (the launch clears it); kept
// alive by the caller.
std::optional<Tensor> chain_workspace(const Tensor& like, int64_t bytes) {
  if (bytes == 0) return std::nullopt;
  return torch::stable::new_empty(like, std::vector<int64_t>{bytes}, ScalarType::Byte);
}

// The tile, pipe and staged chained kernels read packed sequences' cuts as bits (memio.h,
// PrefetchedCutBits), which the launch packs into this (kernels/primitives/cut_bits.cuh;
// chained calls at register-tile configs, which read the bytes, get it too); kept alive by
// the caller.
std::optional<Tensor> cut_bits(const Tensor& like, const uint8_t* cuts, int64_t seq_len, KernelKind kind) {
  if (cuts == nullptr || (kind != KernelKind::kTile && kind != KernelKind::kPipe && kind != KernelKind::kChained))
    return std::nullopt;
  return torch::stable::new_empty(like, std::vector<int64_t>{cut_bit_words(seq_len)}, ScalarType::Int);
}

// Picks the kernel for p's shape (`interleaved`: sequences lie nearer each other in memory
// than a sequence's own elements), allocates its workspace and launches it (`launch`: cuda_fwd
// or cuda_bwd) on torch's current stream of `like`'s device.
template <typename Params>
using CudaLaunch = void (*)(const Params&, Storage, KernelKind, const TileConfig&, int64_t workspace_bytes,
                            void* stream);

template <typename Params>
void launch_on_current_stream(const Tensor& like, Params& p, Storage storage, const KernelArgs& args, bool interleaved,
                              bool backward, CudaLaunch<Params> launch) {
  torch::stable::accelerator::DeviceGuard guard(like.get_device_index());
  const KernelChoice c = choose(args, p.seq_len, p.num_seqs, interleaved, backward, storage, like.get_device_index());
  const int64_t workspace_bytes = cuda_workspace_bytes(storage, c.kind, p.num_seqs, p.seq_len, c.config);
  const std::optional<Tensor> workspace = chain_workspace(like, workspace_bytes);
  if (workspace) p.chain_workspace = workspace->mutable_data_ptr();
  const std::optional<Tensor> bits = cut_bits(like, p.cuts, p.seq_len, c.kind);
  if (bits) p.cut_bits = static_cast<uint32_t*>(bits->mutable_data_ptr());
  launch(p, storage, c.kind, c.config, workspace_bytes, current_stream(like));
}

Tensor linrec_fwd_cuda(Tensor inputs, Tensor coeffs, std::optional<Tensor> initial, int64_t dim, int64_t reverse,
                       int64_t kernel, int64_t elems_per_thread, int64_t threads_per_block, int64_t memcode,
                       int64_t algocode, bool log_coeffs, std::optional<Tensor> cuts) {
  check_kernel_args(reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode);
  ForwardCall call = prepare_fwd(inputs, coeffs, initial, dim, reverse != 0, log_coeffs, cuts);
  if (call.empty) return call.outputs;
  const bool interleaved =
      seqs_interleaved(call.p.index, kFwdInputs) || seqs_interleaved(call.p.index, kFwdOutputs);
  launch_on_current_stream(inputs, call.p, call.storage,
                           {kernel, elems_per_thread, threads_per_block, memcode, algocode}, interleaved, false,
                           &cuda_fwd);
  return call.result();
}

std::tuple<Tensor, Tensor, Tensor> linrec_bwd_cuda(Tensor d_outputs, Tensor coeffs, Tensor outputs,
                                                   std::optional<Tensor> initial, int64_t dim, int64_t reverse,
                                                   int64_t kernel, int64_t elems_per_thread,
                                                   int64_t threads_per_block, int64_t memcode, int64_t algocode, bool log_coeffs, std::optional<Tensor> cuts) {
  check_kernel_args(reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode);
  BackwardCall call = prepare_bwd(d_outputs, coeffs, outputs, initial, dim, reverse != 0, log_coeffs, cuts);
  if (call.empty) return call.grads();
  const bool interleaved =
      seqs_interleaved(call.p.index, kBwdDOutputs) || seqs_interleaved(call.p.index, kBwdDInputs);
  launch_on_current_stream(d_outputs, call.p, call.storage,
                           {kernel, elems_per_thread, threads_per_block, memcode, algocode}, interleaved, true,
                           &cuda_bwd);
  return call.grads();
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  m.impl("linrec_fwd", TORCH_BOX(&linrec::linrec_fwd_cuda));
  m.impl("_linrec_fwd", TORCH_BOX(&linrec::linrec_fwd_cuda));
  m.impl("linrec_bwd", TORCH_BOX(&linrec::linrec_bwd_cuda));
}

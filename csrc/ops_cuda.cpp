// The ops' CUDA kernels: the module linrec._C_cuda. Its schemas come from
// linrec._C (ops.cpp), loaded first; this module links torch's CUDA library and
// the CUDA runtime, so Python loads it only where torch's CUDA version matches
// the build's (python/linrec/__init__.py). Argument checks are ops.cpp's
// (op_args.h); here a shape becomes a kernel choice, a workspace and a launch
// on torch's current stream.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include <optional>
#include <tuple>

#include "dispatch.h"
#include "kernels/launch.h"
#include "op_args.h"

namespace linrec {
namespace {

// The ops' last five arguments, as the schema passes them (ops.cpp): which kernel, and its config.
struct KernelArgs {
  int64_t kernel, elems_per_thread, threads_per_block, memcode, algocode;
};

struct LaunchChoice {
  KernelKind kind;
  TileConfig config;
};

LaunchChoice choose(const KernelArgs& args, int64_t seq_len, int64_t num_seqs, bool interleaved, bool backward,
                    Storage storage, int device) {
  const DType dtype = storage.values;
  const auto [kernel, elems_per_thread, threads_per_block, memcode, algocode] = args;
  STD_TORCH_CHECK(kernel >= 0 && kernel <= 6,
                  "linrec: kernel must be 0 (auto), 1 (ref), 2 (tile), 3 (pipe), 4 (chained), 5 (strided) or 6 "
                  "(packed), got ", kernel);
  const auto kind = static_cast<KernelKind>(kernel);
  if (kind == KernelKind::kAuto && is_complex(dtype)) {
    const KernelChoice c = select_complex_config(seq_len, interleaved, dtype == DType::kComplex128 ? 16 : 8);
    return {c.kind, c.config};
  }
  STD_TORCH_CHECK(!is_complex(dtype) || kind != KernelKind::kPipe,
                  "linrec: complex recurrences run on the ref (1), tile (2, vector configs), chained (4, staged "
                  "configs), strided (5) and packed (6) CUDA kernels; the pipe kernel (3) is not compiled for them");
  if (kind == KernelKind::kAuto) {
    // Mixed storage takes the rule of its 16-bit values.
    const int elem_bytes = dtype == DType::kFloat64 ? 8 : dtype == DType::kFloat32 ? 4 : 2;
    const KernelChoice c =
        select_config(seq_len, num_seqs, interleaved, backward, elem_bytes, cuda_sm_count(device));
    return {c.kind, c.config};
  }
  STD_TORCH_CHECK(!is_complex(dtype) || kind != KernelKind::kTile || memcode == 1,
                  "linrec: complex recurrences take the tile kernel's vector configs only (memcode 1), got memcode ",
                  memcode);
  STD_TORCH_CHECK(!is_complex(dtype) || kind != KernelKind::kChained || memcode == 3,
                  "linrec: complex recurrences take the chained kernel's staged configs only (memcode 3), got "
                  "memcode ", memcode);
  const bool may_stage = kind == KernelKind::kChained || kind == KernelKind::kStrided;
  const int64_t max_memcode = may_stage ? 3 : 2;  // 3: MemCode::kStaged, chained and strided only
  STD_TORCH_CHECK(memcode >= 0 && memcode <= max_memcode, "linrec: memcode must be 0, 1, 2",
                  may_stage ? " or 3" : " (3 is for the chained and strided kernels only)", ", got ", memcode);
  STD_TORCH_CHECK(algocode >= 0 && algocode <= 3, "linrec: algocode must be 0, 1, 2 or 3, got ", algocode);
  const TileConfig config{static_cast<int>(elems_per_thread), static_cast<int>(threads_per_block),
                          static_cast<MemCode>(memcode), static_cast<AlgoCode>(algocode)};
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
std::optional<Tensor> chain_workspace(const Tensor& like, Storage storage, const LaunchChoice& c, int64_t num_seqs,
                                      int64_t seq_len) {
  const int64_t bytes = cuda_workspace_bytes(storage, c.kind, num_seqs, seq_len, c.config);
  if (bytes == 0) return std::nullopt;
  return torch::stable::new_empty(like, std::vector<int64_t>{bytes}, ScalarType::Byte);
}

void* current_stream(const Tensor& t) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream) == 0,
                  "linrec: could not get the current CUDA stream");
  return stream;
}

// Picks the kernel for p's shape (`interleaved`: sequences lie nearer each other in memory
// than a sequence's own elements), allocates its workspace and launches it (`launch`: cuda_fwd
// or cuda_bwd) on torch's current stream of `like`'s device.
template <typename Params>
using CudaLaunch = void (*)(const Params&, Storage, KernelKind, const TileConfig&, void* stream);

template <typename Params>
void launch_on_current_stream(const Tensor& like, Params& p, Storage storage, const KernelArgs& args, bool interleaved,
                              bool backward, CudaLaunch<Params> launch) {
  torch::stable::accelerator::DeviceGuard guard(like.get_device_index());
  const LaunchChoice c = choose(args, p.seq_len, p.num_seqs, interleaved, backward, storage, like.get_device_index());
  const std::optional<Tensor> workspace = chain_workspace(like, storage, c, p.num_seqs, p.seq_len);
  if (workspace) p.chain_workspace = workspace->mutable_data_ptr();
  launch(p, storage, c.kind, c.config, current_stream(like));
}

Tensor linrec_fwd_cuda(Tensor inputs, Tensor coeffs, std::optional<Tensor> initial, int64_t dim, bool reverse,
                       int64_t kernel, int64_t elems_per_thread, int64_t threads_per_block, int64_t memcode,
                       int64_t algocode) {
  ForwardCall call = prepare_fwd(inputs, coeffs, initial, dim, reverse);
  if (call.empty) return call.outputs;
  const bool interleaved =
      seqs_interleaved(call.p.index, kFwdInputs) || seqs_interleaved(call.p.index, kFwdOutputs);
  launch_on_current_stream(inputs, call.p, call.storage,
                           {kernel, elems_per_thread, threads_per_block, memcode, algocode}, interleaved, false,
                           &cuda_fwd);
  return call.outputs;
}

std::tuple<Tensor, Tensor, Tensor> linrec_bwd_cuda(Tensor d_outputs, Tensor coeffs, Tensor outputs,
                                                   std::optional<Tensor> initial, int64_t dim, bool reverse,
                                                   int64_t kernel, int64_t elems_per_thread,
                                                   int64_t threads_per_block, int64_t memcode, int64_t algocode) {
  BackwardCall call = prepare_bwd(d_outputs, coeffs, outputs, initial, dim, reverse);
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

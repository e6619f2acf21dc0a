// Host-side entry points of every kernel. Implemented in csrc/cpu/ and csrc/kernels/*.cu;
// called by csrc/ops/. Torch-free on purpose: only params.h and config.h types.
#pragma once
#include <optional>
#include <vector>

#include "../config.h"
#include "../params.h"
#include "../selective_params.h"

namespace linrec {

// CPU: sequential scan per sequence, sequences in parallel (csrc/cpu/cpu_kernels.cpp).
void cpu_fwd(const ForwardParams& p, Storage storage);
void cpu_bwd(const BackwardParams& p, Storage storage);
// The fused selective scan (csrc/cpu/selective_scan.cpp). The backward adds into d_A, d_B,
// d_C, d_D and d_delta_bias, which the caller zeroes.
void cpu_selective_fwd(const SelectiveParams& p, SelectiveStorage storage);
void cpu_selective_bwd(const SelectiveGradParams& p, SelectiveStorage storage);

#if defined(LINREC_WITH_CUDA)
// CUDA (kernels/*.cu): `kind` names a family of csrc/registry.toml compiled for `storage`.
// `stream` is a cudaStream_t. The TileConfig is ignored by ref. A kind with a workspace
// (chained, strided) needs p.chain_workspace of `workspace_bytes` (cuda_workspace_bytes),
// which the launch clears on the stream before the scan (workspace.cuh).
void cuda_fwd(const ForwardParams& p, Storage storage, KernelKind kind, const TileConfig& config,
              int64_t workspace_bytes, void* stream);
void cuda_bwd(const BackwardParams& p, Storage storage, KernelKind kind, const TileConfig& config,
              int64_t workspace_bytes, void* stream);
// The fused selective scan (kernels/selective_scan.cuh) at a compiled config
// (cuda_selective_configs); the backward adds into zeroed accumulators, as the CPU's.
void cuda_selective_fwd(const SelectiveParams& p, SelectiveStorage storage, const SelectiveConfig& config,
                        void* stream);
void cuda_selective_bwd(const SelectiveGradParams& p, SelectiveStorage storage, const SelectiveConfig& config,
                        void* stream);
std::vector<SelectiveConfig> cuda_selective_configs();
// The automatic config of the forward or the backward of a sequence length.
SelectiveConfig cuda_selective_default(bool backward, int64_t seq_len);
// Bytes of workspace a kernel needs for this call (see lookback.cuh); 0 if none.
int64_t cuda_workspace_bytes(Storage storage, KernelKind kind, int64_t num_seqs, int64_t seq_len,
                             const TileConfig& config);
// Whether family `kind` is compiled for `storage`, and at which configs.
bool cuda_compiled(Storage storage, KernelKind kind);
std::vector<TileConfig> cuda_compiled_configs(Storage storage, KernelKind kind);
// Streaming multiprocessors of a device (0 if it cannot be read).
int cuda_sm_count(int device);
// Peak DRAM bandwidth of a device in bytes a nanosecond (0 if it cannot be read).
double cuda_dram_bytes_per_ns(int device);
// Registers, local (spill) and shared memory of one compiled kernel, from
// cudaFuncGetAttributes: {num_regs, local_bytes, static_shared_bytes, max_threads}.
struct FuncAttrs {
  int num_regs, local_bytes, shared_bytes, max_threads;
};
// Which kernel of a kind and config: the general one, or the aligned-rows kernel
// (rows.cuh) that the tile forward (vector loads) and the packed kernels launch when
// every tensor's rows are unit-stride and aligned, in either scan direction.
enum class KernelVariant : int { kGeneral = 0, kRowsForward = 1, kRowsReverse = 2 };
// Empty where the family has no such variant at this config.
std::optional<FuncAttrs> cuda_func_attrs(Storage storage, KernelKind kind, bool backward, KernelVariant variant,
                                         const TileConfig& config);
#endif

}  // namespace linrec

// The fused selective scan's CUDA kernels (kernels/selective_scan.cuh), in linrec._C_cuda:
// the checks and outputs of selective_args.h, then a compiled SelectiveConfig and a launch on
// torch's current stream.
#include <torch/csrc/stable/accelerator.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "../kernels/launch.h"
#include "cuda_stream.h"
#include "selective_args.h"

namespace linrec {
namespace {

std::string compiled_selective_configs() {
  std::string out;
  for (const SelectiveConfig& c : cuda_selective_configs())
    out += (out.empty() ? "" : ", ") + std::string("(") + std::to_string(c.steps_per_thread) + ", " +
           std::to_string(c.warps) + ")";
  return out;
}

// The config named by (steps_per_thread, warps), or for (0, 0) the automatic one.
SelectiveConfig choose_selective_config(int64_t steps_per_thread, int64_t warps, bool backward, int64_t seq_len) {
  if (steps_per_thread == 0 && warps == 0) return cuda_selective_default(backward, seq_len);
  for (const SelectiveConfig& c : cuda_selective_configs())
    if (steps_per_thread == c.steps_per_thread && warps == c.warps) return c;
  STD_TORCH_CHECK(false, "linrec: steps_per_thread=", steps_per_thread, ", warps=", warps, " is not a compiled "
                  "selective-scan config; the compiled (steps_per_thread, warps) are ", compiled_selective_configs());
  return cuda_selective_default(backward, seq_len);
}

// A launch has a block for every `warps` channels of each batch element.
void check_grid(const SelectiveParams& p, const SelectiveConfig& config) {
  STD_TORCH_CHECK(p.batch * ((p.dim + config.warps - 1) / config.warps) <= std::numeric_limits<int32_t>::max(),
                  "linrec: batch=", p.batch, " and dim=", p.dim,
                  " are too many channels for one selective-scan launch (split the batch)");
}

// A compiled config (the one named, or the automatic choice), then `launch` on torch's current
// stream of `out`'s device (nothing for an empty call, once the config is checked).
template <typename Call, typename Launch>
void run_selective(Call& call, const Tensor& out, int64_t steps_per_thread, int64_t warps, bool backward,
                   Launch launch) {
  const SelectiveConfig config = choose_selective_config(steps_per_thread, warps, backward, call.p.seq_len);
  if (call.empty) return;
  check_grid(call.p, config);
  torch::stable::accelerator::DeviceGuard guard(out.get_device_index());
  launch(call.p, call.inputs.storage, config, current_stream(out));
}

struct CudaSelectiveKernels {
  static void fwd(SelectiveFwdCall& call, int64_t steps_per_thread, int64_t warps) {
    run_selective(call, call.y, steps_per_thread, warps, false, cuda_selective_fwd);
  }
  static void bwd(SelectiveBwdCall& call, int64_t steps_per_thread, int64_t warps) {
    run_selective(call, call.d_u, steps_per_thread, warps, true, cuda_selective_bwd);
  }
};

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  m.impl("selective_scan_fwd", TORCH_BOX(&linrec::selective_scan_fwd_op<linrec::CudaSelectiveKernels>));
  m.impl("_selective_scan_fwd", TORCH_BOX(&linrec::selective_scan_fwd_op<linrec::CudaSelectiveKernels>));
  m.impl("selective_scan_bwd", TORCH_BOX(&linrec::selective_scan_bwd_op<linrec::CudaSelectiveKernels>));
}

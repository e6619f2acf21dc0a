// The fused selective scan's CUDA kernels (kernels/selective_scan.cuh), in linrec._C_cuda:
// the checks and outputs of selective_args.h, then a compiled SelectiveConfig and a launch on
// torch's current stream.
#include <torch/csrc/stable/accelerator.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "../kernels/launch.h"
#include "cuda_stream.h"
#include "selective_args.h"

namespace linrec {
namespace {

std::string compiled_selective_configs() {
  std::string out;
  for (const SelectiveConfig& c : cuda_selective_configs())
    out += (out.empty() ? "" : ", ") + std::string("(") + std::to_string(c.lanes) + ", " +
           std::to_string(c.states_per_lane) + ")";
  return out;
}

// The config named by (lanes, states_per_lane), or for (0, 0) the first compiled one that
// holds the call's states (the list goes from the fewest states a channel to the most).
SelectiveConfig choose_selective_config(int64_t lanes, int64_t states_per_lane, int64_t states) {
  std::optional<SelectiveConfig> chosen;
  for (const SelectiveConfig& c : cuda_selective_configs()) {
    const bool named = lanes == c.lanes && states_per_lane == c.states_per_lane;
    if (!chosen && (lanes == 0 || named) && c.max_states() >= states) chosen = c;
  }
  STD_TORCH_CHECK(chosen, "linrec: lanes=", lanes, ", states_per_lane=", states_per_lane, " is not a compiled "
                  "selective-scan config holding N=", states, " states; the compiled (lanes, states_per_lane) are ",
                  compiled_selective_configs(), ", each holding lanes * states_per_lane states");
  return *chosen;
}

// A launch has a block for every 8 (or more) channels of each batch element.
void check_grid(const SelectiveParams& p) {
  STD_TORCH_CHECK(p.batch * ((p.dim + 7) / 8) <= std::numeric_limits<int32_t>::max(), "linrec: batch=", p.batch,
                  " and dim=", p.dim, " are too many channels for one selective-scan launch (split the batch)");
}

// A compiled config (the one named, or the automatic choice), then a launch on torch's current stream.
struct CudaSelectiveKernels {
  static void fwd(SelectiveFwdCall& call, int64_t lanes, int64_t states_per_lane) {
    const SelectiveConfig config = choose_selective_config(lanes, states_per_lane, call.p.states);
    if (call.empty) return;
    check_grid(call.p);
    const Tensor& u = call.y;
    torch::stable::accelerator::DeviceGuard guard(u.get_device_index());
    cuda_selective_fwd(call.p, call.inputs.storage, config, current_stream(u));
  }
  static void bwd(SelectiveBwdCall& call, int64_t lanes, int64_t states_per_lane) {
    const SelectiveConfig config = choose_selective_config(lanes, states_per_lane, call.p.states);
    if (call.empty) return;
    check_grid(call.p);
    const Tensor& u = call.d_u;
    torch::stable::accelerator::DeviceGuard guard(u.get_device_index());
    cuda_selective_bwd(call.p, call.inputs.storage, config, current_stream(u));
  }
};

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  m.impl("selective_scan_fwd", TORCH_BOX(&linrec::selective_scan_fwd_op<linrec::CudaSelectiveKernels>));
  m.impl("selective_scan_bwd", TORCH_BOX(&linrec::selective_scan_bwd_op<linrec::CudaSelectiveKernels>));
}

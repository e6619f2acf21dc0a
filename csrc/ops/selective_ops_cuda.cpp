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

std::tuple<Tensor, Tensor, Tensor> selective_scan_fwd_cuda(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C,
                                                           std::optional<Tensor> D, std::optional<Tensor> z,
                                                           std::optional<Tensor> delta_bias,
                                                           std::optional<Tensor> initial_state, bool delta_softplus,
                                                           int64_t reverse, int64_t lanes, int64_t states_per_lane) {
  check_selective_args(reverse, lanes, states_per_lane);
  SelectiveFwdCall call =
      prepare_selective_fwd(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, reverse != 0);
  const SelectiveConfig config = choose_selective_config(lanes, states_per_lane, call.p.states);
  if (call.empty) return call.outputs();
  check_grid(call.p);
  torch::stable::accelerator::DeviceGuard guard(u.get_device_index());
  cuda_selective_fwd(call.p, call.inputs.storage, config, current_stream(u));
  return call.outputs();
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> selective_scan_bwd_cuda(
    Tensor d_y, std::optional<Tensor> d_last_state, Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C,
    std::optional<Tensor> D, std::optional<Tensor> z, std::optional<Tensor> delta_bias,
    std::optional<Tensor> initial_state, Tensor checkpoints, bool delta_softplus, int64_t reverse, int64_t lanes,
    int64_t states_per_lane) {
  check_selective_args(reverse, lanes, states_per_lane);
  SelectiveBwdCall call = prepare_selective_bwd(d_y, d_last_state, u, delta, A, B, C, D, z, delta_bias, initial_state,
                                                checkpoints, delta_softplus, reverse != 0);
  const SelectiveConfig config = choose_selective_config(lanes, states_per_lane, call.p.states);
  if (call.empty) return call.grads();
  check_grid(call.p);
  torch::stable::accelerator::DeviceGuard guard(u.get_device_index());
  cuda_selective_bwd(call.p, call.inputs.storage, config, current_stream(u));
  return call.grads();
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  m.impl("selective_scan_fwd", TORCH_BOX(&linrec::selective_scan_fwd_cuda));
  m.impl("selective_scan_bwd", TORCH_BOX(&linrec::selective_scan_bwd_cuda));
}

// The fused selective scan's CPU kernels (its schemas are in ops.cpp, beside the others; its
// CUDA kernels in selective_ops_cuda.cpp).
#include <optional>
#include <tuple>

#include "../kernels/launch.h"
#include "selective_args.h"

namespace linrec {
namespace {

std::tuple<Tensor, Tensor, Tensor> selective_scan_fwd_cpu(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C,
                                                          std::optional<Tensor> D, std::optional<Tensor> z,
                                                          std::optional<Tensor> delta_bias,
                                                          std::optional<Tensor> initial_state, bool delta_softplus,
                                                          int64_t reverse, int64_t lanes, int64_t states_per_lane) {
  check_selective_args(reverse, lanes, states_per_lane);
  SelectiveFwdCall call =
      prepare_selective_fwd(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, reverse != 0);
  if (!call.empty) cpu_selective_fwd(call.p, call.inputs.storage);
  return call.outputs();
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> selective_scan_bwd_cpu(
    Tensor d_y, std::optional<Tensor> d_last_state, Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C,
    std::optional<Tensor> D, std::optional<Tensor> z, std::optional<Tensor> delta_bias,
    std::optional<Tensor> initial_state, Tensor checkpoints, bool delta_softplus, int64_t reverse, int64_t lanes,
    int64_t states_per_lane) {
  check_selective_args(reverse, lanes, states_per_lane);
  SelectiveBwdCall call = prepare_selective_bwd(d_y, d_last_state, u, delta, A, B, C, D, z, delta_bias, initial_state,
                                                checkpoints, delta_softplus, reverse != 0);
  if (!call.empty) cpu_selective_bwd(call.p, call.inputs.storage);
  return call.grads();
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  m.impl("selective_scan_fwd", TORCH_BOX(&linrec::selective_scan_fwd_cpu));
  m.impl("selective_scan_bwd", TORCH_BOX(&linrec::selective_scan_bwd_cpu));
}

// CUDA entry points of the fused selective scan: a call's runtime storage -> the kernels
// instantiated for it (instances/selective.h, generated from csrc/registry.toml).
#include <cuda_runtime.h>

#include "instances/selective.h"
#include "launch.h"

namespace linrec {

void cuda_selective_fwd(const SelectiveParams& p, SelectiveStorage storage, const SelectiveConfig& config,
                        void* stream) {
  selective::for_storage(storage, [&]<typename V, typename BC>() {
    selective::launch<V, BC, false>(p, config, static_cast<cudaStream_t>(stream));
  });
}

void cuda_selective_bwd(const SelectiveGradParams& p, SelectiveStorage storage, const SelectiveConfig& config,
                        void* stream) {
  selective::for_storage(storage, [&]<typename V, typename BC>() {
    selective::launch<V, BC, true>(p, config, static_cast<cudaStream_t>(stream));
  });
}

std::vector<SelectiveConfig> cuda_selective_configs() {
  return {SELECTIVE_CONFIG_LIST.begin(), SELECTIVE_CONFIG_LIST.end()};
}

// The automatic choice, from `python -m tools selective-configs` on an H100
// (benchmarks/selective_configs_h100.json). The forward: 8 steps a thread everywhere. The
// backward holds about twice the forward's registers a step: at 4 steps a thread three blocks
// fit a multiprocessor instead of two, 5-15% faster at length 2048; at length 65536 fewer
// channels fill the GPU and 8 steps were 1.3x faster. Between the two lengths nothing was
// measured; the switch sits at 4096.
constexpr SelectiveConfig kForward{8, 4}, kBackwardShort{4, 4}, kBackwardLong{8, 4};
constexpr int64_t kBackwardShortMaxLength = 4096;

SelectiveConfig cuda_selective_default(bool backward, int64_t seq_len) {
  if (!backward) return kForward;
  return seq_len <= kBackwardShortMaxLength ? kBackwardShort : kBackwardLong;
}

}  // namespace linrec

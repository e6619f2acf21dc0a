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

}  // namespace linrec

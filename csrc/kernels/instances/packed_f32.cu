// Explicit instantiation: packed fwd and bwd, float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../packed.cuh"

namespace linrec {
LINREC_INSTANTIATE_PACKED(float)
}  // namespace linrec

// Explicit instantiation: packed fwd and bwd, bfloat16 values with float32 coefficients (MixedBFloat16).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../packed.cuh"

namespace linrec {
LINREC_INSTANTIATE_PACKED(MixedBFloat16)
}  // namespace linrec

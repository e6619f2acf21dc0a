// Explicit instantiation: packed fwd and bwd, float16 values with float32 coefficients (MixedHalf).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../packed.cuh"

namespace linrec {
LINREC_INSTANTIATE_PACKED(MixedHalf)
}  // namespace linrec

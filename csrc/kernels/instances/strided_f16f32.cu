// Explicit instantiation: strided fwd and bwd, float16 values with float32 coefficients (MixedHalf).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../strided_launch.cuh"

namespace linrec {
LINREC_INSTANTIATE_STRIDED(MixedHalf)
}  // namespace linrec

// Explicit instantiation: chained bwd, bfloat16 values with float32 coefficients (MixedBFloat16).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(MixedBFloat16, true, BackwardParams)
}  // namespace linrec

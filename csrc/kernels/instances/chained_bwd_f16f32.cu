// Explicit instantiation: chained bwd, float16 values with float32 coefficients (MixedHalf).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(MixedHalf, true, BackwardParams)
}  // namespace linrec

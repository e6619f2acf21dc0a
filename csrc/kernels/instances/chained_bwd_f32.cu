// Explicit instantiation: chained bwd, float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(float, true, BackwardParams)
}  // namespace linrec

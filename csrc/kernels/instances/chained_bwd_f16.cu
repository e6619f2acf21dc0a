// Explicit instantiation: chained bwd, __half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(__half, true, BackwardParams)
}  // namespace linrec

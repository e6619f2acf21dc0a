// Explicit instantiation: chained fwd, float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(float, false, ForwardParams)
}  // namespace linrec

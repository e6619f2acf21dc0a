// Explicit instantiation: chained fwd, __half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(__half, false, ForwardParams)
}  // namespace linrec

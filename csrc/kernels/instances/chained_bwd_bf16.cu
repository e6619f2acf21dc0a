// Explicit instantiation: chained bwd, __nv_bfloat16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(__nv_bfloat16, true, BackwardParams)
}  // namespace linrec

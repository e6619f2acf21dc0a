// Explicit instantiation: strided fwd and bwd, __nv_bfloat16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../strided_launch.cuh"

namespace linrec {
LINREC_INSTANTIATE_STRIDED(__nv_bfloat16)
}  // namespace linrec

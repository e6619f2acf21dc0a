// Explicit instantiation: packed fwd and bwd, __nv_bfloat16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../packed.cuh"

namespace linrec {
LINREC_INSTANTIATE_PACKED(__nv_bfloat16)
}  // namespace linrec

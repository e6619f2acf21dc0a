// Explicit instantiation: chained fwd, __nv_bfloat16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../tiled.cuh"

namespace linrec {
LINREC_INSTANTIATE_TILED(__nv_bfloat16, Schedule::kChained, false, ForwardParams)
}  // namespace linrec

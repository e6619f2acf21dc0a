// Explicit instantiation: pipe fwd, bfloat16 values with float32 coefficients (MixedBFloat16).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../tiled.cuh"

namespace linrec {
LINREC_INSTANTIATE_TILED(MixedBFloat16, Schedule::kPipe, false, ForwardParams)
}  // namespace linrec

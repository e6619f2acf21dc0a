// Explicit instantiation: pipe bwd, float16 values with float32 coefficients (MixedHalf).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../tiled.cuh"

namespace linrec {
LINREC_INSTANTIATE_TILED(MixedHalf, Schedule::kPipe, true, BackwardParams)
}  // namespace linrec

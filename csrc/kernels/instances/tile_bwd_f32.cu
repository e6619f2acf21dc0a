// Explicit instantiation: tile bwd, float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../tiled.cuh"

namespace linrec {
LINREC_INSTANTIATE_TILED(float, Schedule::kOneTile, true, BackwardParams)
}  // namespace linrec

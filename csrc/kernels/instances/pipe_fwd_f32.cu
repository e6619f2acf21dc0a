// Explicit instantiation: pipe fwd, float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../tiled.cuh"

namespace linrec {
LINREC_INSTANTIATE_TILED(float, Schedule::kPipe, false, ForwardParams)
}  // namespace linrec

// Explicit instantiation: pipe fwd, __half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../tiled.cuh"

namespace linrec {
LINREC_INSTANTIATE_TILED(__half, Schedule::kPipe, false, ForwardParams)
}  // namespace linrec

// Explicit instantiation: tile fwd, double.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../tiled.cuh"

namespace linrec {
LINREC_INSTANTIATE_TILED(double, Schedule::kOneTile, false, ForwardParams)
}  // namespace linrec

// Explicit instantiation: tile bwd, ComplexDouble (complex128; the vector configs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../tiled.cuh"

namespace linrec {
LINREC_INSTANTIATE_TILED(ComplexDouble, Schedule::kOneTile, true, BackwardParams)
}  // namespace linrec

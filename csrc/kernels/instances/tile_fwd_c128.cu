// Explicit instantiation: tile fwd, ComplexDouble (complex128; the vector configs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../tiled.cuh"

namespace linrec {
LINREC_INSTANTIATE_TILED(ComplexDouble, Schedule::kOneTile, false, ForwardParams)
}  // namespace linrec

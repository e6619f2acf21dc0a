// Explicit instantiation: strided fwd and bwd, ComplexDouble (complex128).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../strided_launch.cuh"

namespace linrec {
LINREC_INSTANTIATE_STRIDED(ComplexDouble)
}  // namespace linrec

// Explicit instantiation: packed fwd and bwd, ComplexDouble (complex128).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../packed.cuh"

namespace linrec {
LINREC_INSTANTIATE_PACKED(ComplexDouble)
}  // namespace linrec

// Explicit instantiation: chained fwd, ComplexDouble (complex128; the staged configs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(ComplexDouble, false, ForwardParams)
}  // namespace linrec

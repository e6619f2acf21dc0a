// Explicit instantiation: chained bwd, ComplexFloat (complex64; the staged configs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(ComplexFloat, true, BackwardParams)
}  // namespace linrec

// Explicit instantiation: chained fwd, double.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../chained.cuh"

namespace linrec {
LINREC_INSTANTIATE_CHAINED(double, false, ForwardParams)
}  // namespace linrec

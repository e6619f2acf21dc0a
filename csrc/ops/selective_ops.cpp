// The fused selective scan's CPU kernels (its schemas are in ops.cpp, beside the others; its
// CUDA kernels in selective_ops_cuda.cpp).
#include "../kernels/launch.h"
#include "selective_args.h"

namespace linrec {
namespace {

// The CPU kernels take no config (selective_scan_fwd_op has checked its form).
struct CpuSelectiveKernels {
  static void fwd(SelectiveFwdCall& call, int64_t, int64_t) {
    if (!call.empty) cpu_selective_fwd(call.p, call.inputs.storage);
  }
  static void bwd(SelectiveBwdCall& call, int64_t, int64_t) {
    if (!call.empty) cpu_selective_bwd(call.p, call.inputs.storage);
  }
};

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  m.impl("selective_scan_fwd", TORCH_BOX(&linrec::selective_scan_fwd_op<linrec::CpuSelectiveKernels>));
  m.impl("_selective_scan_fwd", TORCH_BOX(&linrec::selective_scan_fwd_op<linrec::CpuSelectiveKernels>));
  m.impl("selective_scan_bwd", TORCH_BOX(&linrec::selective_scan_bwd_op<linrec::CpuSelectiveKernels>));
}

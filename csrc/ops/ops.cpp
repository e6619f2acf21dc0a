// The ops' schemas (defined once, here) and the scan's CPU kernels (the selective
// scan's are in selective_ops.cpp): the module linrec._C, which needs only torch's
// CPU libraries, so it loads next to any torch >= 2.10. The CUDA kernels of the
// same ops register from their own module (ops_cuda.cpp, selective_ops_cuda.cpp:
// linrec._C_cuda), loaded where torch's CUDA matches.
// Built against the LibTorch stable ABI, so one binary serves every torch >= 2.10.
#include <optional>
#include <tuple>

#include "../kernels/launch.h"
#include "op_args.h"

namespace linrec {
namespace {

// The CPU kernels take no kernel id or config, but check them: the ops are public.
Tensor linrec_fwd_cpu(Tensor inputs, Tensor coeffs, std::optional<Tensor> initial, int64_t dim, int64_t reverse,
                      int64_t kernel, int64_t elems_per_thread, int64_t threads_per_block, int64_t memcode,
                      int64_t algocode, bool log_coeffs, std::optional<Tensor> cuts) {
  check_kernel_args(reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode);
  ForwardCall call = prepare_fwd(inputs, coeffs, initial, dim, reverse != 0, log_coeffs, cuts);
  if (!call.empty) cpu_fwd(call.p, call.storage);
  return call.result();
}

std::tuple<Tensor, Tensor, Tensor> linrec_bwd_cpu(Tensor d_outputs, Tensor coeffs, Tensor outputs,
                                                  std::optional<Tensor> initial, int64_t dim, int64_t reverse,
                                                  int64_t kernel, int64_t elems_per_thread, int64_t threads_per_block,
                                                  int64_t memcode, int64_t algocode, bool log_coeffs, std::optional<Tensor> cuts) {
  check_kernel_args(reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode);
  BackwardCall call = prepare_bwd(d_outputs, coeffs, outputs, initial, dim, reverse != 0, log_coeffs, cuts);
  if (!call.empty) cpu_bwd(call.p, call.storage);
  return call.grads();
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY(linrec, m) {
  // kernel: 0 auto (the tuned choice, csrc/tuning/) or a family id of csrc/registry.toml. The last four
  // ints select a compiled TileConfig of that family; auto and ref ignore them. reverse is an int
  // (0 or 1, checked by check_kernel_args): as a bool, torch would take reverse=2 for true unseen.
  // log_coeffs: coeffs holds log c, and the backward's d_coeffs is the gradient of log c. cuts: packed
  // sequences, one byte a step along dim, nonzero where a segment begins in scan order: the
  // recurrence is cut there (the coefficient reads as 0; see CutAt in memio.h).
  m.def(
      "linrec_fwd(Tensor inputs, Tensor coeffs, Tensor? initial, int dim, int reverse, int kernel, "
      "int elems_per_thread, int threads_per_block, int memcode, int algocode, bool log_coeffs=False, "
      "Tensor? cuts=None) -> Tensor");
  // linrec_fwd without an autograd registration, for callers that differentiate it
  // themselves (linrec.linrec's autograd.Function): torch.library's Python autograd
  // kernel of linrec_fwd costs every call host time, grad or not (5 µs on a 2-core
  // CPU, 12.5 µs on the H100 machine's; docs/design/0015-host-time-eager-calls.md).
  m.def(
      "_linrec_fwd(Tensor inputs, Tensor coeffs, Tensor? initial, int dim, int reverse, int kernel, "
      "int elems_per_thread, int threads_per_block, int memcode, int algocode, bool log_coeffs=False, "
      "Tensor? cuts=None) -> Tensor");
  m.def(
      "linrec_bwd(Tensor d_outputs, Tensor coeffs, Tensor outputs, Tensor? initial, int dim, int reverse, "
      "int kernel, int elems_per_thread, int threads_per_block, int memcode, int algocode, "
      "bool log_coeffs=False, Tensor? cuts=None) -> (Tensor, Tensor, Tensor)");
  // The fused selective scan (Mamba's S6; selective_params.h, docs/design/0023-fused-selective-scan.md),
  // CPU kernels in selective_ops.cpp. The forward returns (y, last_state, checkpoints); the backward
  // the gradients of u, delta, A, B, C, D, z, delta_bias and initial_state, those of an absent D, z
  // or delta_bias with 0 elements, d_B and d_C in the float type (float32, float64 for float64 u).
  // reverse as linrec_fwd's. steps_per_thread, warps: the CUDA kernels' SelectiveConfig, (0, 0)
  // for the automatic choice; the CPU kernel checks and ignores them. cuts: packed sequences, as
  // linrec_fwd's, each segment starting from 0; with cu_seqlens (int64 [0, ..., L]) too, a state
  // a segment: initial_state and last_state (batch, dim, segments, N). The CPU kernels take them.
  m.def(
      "selective_scan_fwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? delta_bias, Tensor? initial_state, bool delta_softplus, int reverse, "
      "int steps_per_thread, int warps, Tensor? cuts=None, Tensor? cu_seqlens=None) -> (Tensor, Tensor, Tensor)");
  // selective_scan_fwd without an autograd registration, for linrec.selective_scan's own
  // autograd.Function, as _linrec_fwd is for linrec_fwd.
  m.def(
      "_selective_scan_fwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? delta_bias, Tensor? initial_state, bool delta_softplus, int reverse, "
      "int steps_per_thread, int warps, Tensor? cuts=None, Tensor? cu_seqlens=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "selective_scan_bwd(Tensor d_y, Tensor? d_last_state, Tensor u, Tensor delta, Tensor A, Tensor B, "
      "Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, Tensor? initial_state, Tensor checkpoints, "
      "bool delta_softplus, int reverse, int steps_per_thread, int warps, Tensor? cuts=None, "
      "Tensor? cu_seqlens=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  m.impl("linrec_fwd", TORCH_BOX(&linrec::linrec_fwd_cpu));
  m.impl("_linrec_fwd", TORCH_BOX(&linrec::linrec_fwd_cpu));
  m.impl("linrec_bwd", TORCH_BOX(&linrec::linrec_bwd_cpu));
}

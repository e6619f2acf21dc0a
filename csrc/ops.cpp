// The torch-facing side: op schemas (defined once, here), argument checks,
// output allocation, and translation of tensors into the plain params structs
// of params.h. Built against the LibTorch stable ABI, so one binary serves
// every torch >= 2.10.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#if defined(LINREC_WITH_CUDA)
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#endif

#include <cstdlib>
#include <optional>
#include <tuple>
#include <vector>

#include "dispatch.h"
#include "kernels/launch.h"

namespace linrec {
namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

DType to_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return DType::kFloat32;
    case ScalarType::Double: return DType::kFloat64;
    case ScalarType::Half: return DType::kFloat16;
    case ScalarType::BFloat16: return DType::kBFloat16;
    default:
      STD_TORCH_CHECK(false, "linrec: unsupported dtype ", torch::headeronly::toString(t),
                      "; expected float32, float64, float16 or bfloat16");
  }
}

int64_t wrap_dim(int64_t dim, int64_t ndim) {
  STD_TORCH_CHECK(ndim >= 1, "linrec: inputs must have at least one dimension");
  STD_TORCH_CHECK(dim >= -ndim && dim < ndim, "linrec: dim ", dim, " is out of range for a tensor of ",
                  ndim, " dimensions");
  return dim < 0 ? dim + ndim : dim;
}

// Shape of `full` without its scan dim: the shape of `initial`.
std::vector<int64_t> state_shape(const Tensor& full, int64_t dim) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < full.dim(); ++k)
    if (k != dim) out.push_back(full.size(k));
  return out;
}

void check_same(const Tensor& ref, const Tensor& t, const char* ref_name, const char* name,
                bool is_state, int64_t dim) {
  STD_TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "linrec: ", name, " has dtype ",
                  torch::headeronly::toString(t.scalar_type()), " but ", ref_name, " has ",
                  torch::headeronly::toString(ref.scalar_type()));
  STD_TORCH_CHECK(t.device() == ref.device(), "linrec: ", name, " is on a different device than ",
                  ref_name);
  const std::vector<int64_t> want =
      is_state ? state_shape(ref, dim) : std::vector<int64_t>(ref.sizes().begin(), ref.sizes().end());
  const std::vector<int64_t> got(t.sizes().begin(), t.sizes().end());
  STD_TORCH_CHECK(got == want, "linrec: ", name, " must have the shape of ", ref_name,
                  is_state ? " without dim" : "", " (broadcast it in Python first)");
}

// One tensor as the layout builder sees it: its strides over the sequence dims
// and along the scan dim. `state` tensors (initial) have no scan dim.
struct Operand {
  const Tensor* tensor;
  bool state;
};

// Fills `index` with the merged sequence dims of all operands; see SeqIndexer.
template <int K>
void build_index(const std::vector<int64_t>& seq_sizes_full, int64_t dim,
                 const std::array<std::optional<Operand>, K>& ops, SeqIndexer<K>& index) {
  // Per-dim sizes and strides, scan dim removed, size-1 dims dropped.
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, K>> strides;
  const int64_t ndim = static_cast<int64_t>(seq_sizes_full.size());
  for (int64_t k = 0; k < ndim; ++k) {
    if (k == dim || seq_sizes_full[k] == 1) continue;
    std::array<int64_t, K> s{};
    for (int t = 0; t < K; ++t) {
      if (!ops[t]) continue;
      const Tensor& x = *ops[t]->tensor;
      s[t] = ops[t]->state ? x.stride(k < dim ? k : k - 1) : x.stride(k);
    }
    sizes.push_back(seq_sizes_full[k]);
    strides.push_back(s);
  }
  // Merge dim k into k+1 where every operand is laid out as one flat dim.
  for (int64_t k = static_cast<int64_t>(sizes.size()) - 2; k >= 0; --k) {
    bool mergeable = true;
    for (int t = 0; t < K; ++t)
      mergeable &= strides[k][t] == strides[k + 1][t] * sizes[k + 1];
    if (!mergeable) continue;
    sizes[k + 1] *= sizes[k];
    sizes.erase(sizes.begin() + k);
    strides.erase(strides.begin() + k);
  }
  STD_TORCH_CHECK(static_cast<int>(sizes.size()) <= kMaxSeqDims, "linrec: the layout of the tensors has ",
                  sizes.size(), " non-mergeable batch dimensions (at most ", kMaxSeqDims,
                  " are supported); call .contiguous() on the inputs");
  index.num_dims = static_cast<int>(sizes.size());
  for (int k = 0; k < index.num_dims; ++k) {
    index.sizes[k] = sizes[k];
    for (int t = 0; t < K; ++t) index.seq_strides[t][k] = strides[k][t];
  }
  for (int t = 0; t < K; ++t)
    index.elem_strides[t] = (ops[t] && !ops[t]->state) ? ops[t]->tensor->stride(dim) : 0;
}

// Whether, in tensor slot t, some sequence dim lies closer in memory than the
// scan dim (channel-last data scanned over T): the strided kernels then run
// lanes across neighbouring sequences. Otherwise a sequence's own elements are
// nearest (unit stride, or a view such as x[..., ::2]) and the per-sequence
// kernels read along it; the strided kernels would read one sector a lane.
// Broadcast dims (stride 0) say nothing about where sequences lie.
template <int K>
bool seqs_interleaved(const SeqIndexer<K>& index, int t) {
  const int64_t elem = std::abs(index.elem_strides[t]);
  if (elem <= 1) return false;
  for (int k = 0; k < index.num_dims; ++k) {
    const int64_t s = std::abs(index.seq_strides[t][k]);
    if (s != 0 && s < elem) return true;
  }
  return false;
}

int64_t count_seqs(const Tensor& t, int64_t dim) {
  int64_t n = 1;
  for (int64_t k = 0; k < t.dim(); ++k)
    if (k != dim) n *= t.size(k);
  return n;
}

#if defined(LINREC_WITH_CUDA)
struct LaunchChoice {
  KernelKind kind;
  TileConfig config;
};

LaunchChoice choose(int64_t kernel, int64_t elems_per_thread, int64_t threads_per_block, int64_t memcode,
                    int64_t algocode, int64_t seq_len, int64_t num_seqs, bool interleaved, bool backward,
                    DType dtype, int device) {
  STD_TORCH_CHECK(kernel >= 0 && kernel <= 6,
                  "linrec: kernel must be 0 (auto), 1 (ref), 2 (tile), 3 (pipe), 4 (chained), 5 (strided) or 6 "
                  "(packed), got ", kernel);
  const auto kind = static_cast<KernelKind>(kernel);
  if (kind == KernelKind::kAuto) {
    const int elem_bytes = dtype == DType::kFloat64 ? 8 : dtype == DType::kFloat32 ? 4 : 2;
    const KernelChoice c =
        select_config(seq_len, num_seqs, interleaved, backward, elem_bytes, cuda_sm_count(device));
    return {c.kind, c.config};
  }
  const bool may_stage = kind == KernelKind::kChained || kind == KernelKind::kStrided;
  const int64_t max_memcode = may_stage ? 3 : 2;  // 3: MemCode::kStaged, chained and strided only
  STD_TORCH_CHECK(memcode >= 0 && memcode <= max_memcode, "linrec: memcode must be 0, 1, 2",
                  may_stage ? " or 3" : " (3 is for the chained and strided kernels only)", ", got ", memcode);
  STD_TORCH_CHECK(algocode >= 0 && algocode <= 3, "linrec: algocode must be 0, 1, 2 or 3, got ", algocode);
  const TileConfig config{static_cast<int>(elems_per_thread), static_cast<int>(threads_per_block),
                          static_cast<MemCode>(memcode), static_cast<AlgoCode>(algocode)};
  if (kind == KernelKind::kTile)
    STD_TORCH_CHECK(seq_len <= config.tile_len(), "linrec: the tile kernel scans at most elems_per_thread * "
                    "threads_per_block = ", config.tile_len(), " elements, but the sequence has ", seq_len,
                    "; use the pipe kernel or a larger config");
  if (kind == KernelKind::kPacked)
    STD_TORCH_CHECK(seq_len <= 32 * config.elems_per_thread, "linrec: the packed kernel holds at most 32 * "
                    "elems_per_thread = ", 32 * config.elems_per_thread, " elements, but the sequence has ", seq_len);
  return {kind, config};
}

// The workspace of the chained and strided kernels, if `c` needs one (the launch clears it); kept
// alive by the caller.
std::optional<Tensor> chain_workspace(const Tensor& like, DType dtype, const LaunchChoice& c, int64_t num_seqs,
                                      int64_t seq_len) {
  const int64_t bytes = cuda_workspace_bytes(dtype, c.kind, num_seqs, seq_len, c.config);
  if (bytes == 0) return std::nullopt;
  return torch::stable::new_empty(like, std::vector<int64_t>{bytes}, ScalarType::Byte);
}

void* current_stream(const Tensor& t) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream) == 0,
                  "linrec: could not get the current CUDA stream");
  return stream;
}
#endif

Tensor linrec_fwd(Tensor inputs, Tensor coeffs, std::optional<Tensor> initial, int64_t dim, bool reverse,
                  int64_t kernel, int64_t elems_per_thread, int64_t threads_per_block, int64_t memcode,
                  int64_t algocode) {
  dim = wrap_dim(dim, inputs.dim());
  const DType dtype = to_dtype(inputs.scalar_type());
  check_same(inputs, coeffs, "inputs", "coeffs", false, dim);
  if (initial) check_same(inputs, *initial, "inputs", "initial", true, dim);

  Tensor outputs = torch::stable::empty_like(inputs);
  ForwardParams p;
  p.num_seqs = count_seqs(inputs, dim);
  p.seq_len = inputs.size(dim);
  p.reverse = reverse;
  if (inputs.numel() == 0) return outputs;
  std::array<std::optional<Operand>, kNumFwdSlots> ops;
  ops[kFwdInputs] = Operand{&inputs, false};
  ops[kFwdCoeffs] = Operand{&coeffs, false};
  ops[kFwdOutputs] = Operand{&outputs, false};
  if (initial) ops[kFwdInitial] = Operand{&*initial, true};
  const std::vector<int64_t> sizes(inputs.sizes().begin(), inputs.sizes().end());
  build_index<kNumFwdSlots>(sizes, dim, ops, p.index);
  p.inputs = inputs.const_data_ptr();
  p.coeffs = coeffs.const_data_ptr();
  p.initial = initial ? initial->const_data_ptr() : nullptr;
  p.outputs = outputs.mutable_data_ptr();

  if (inputs.is_cpu()) {
    cpu_fwd(p, dtype);
    return outputs;
  }
#if defined(LINREC_WITH_CUDA)
  torch::stable::accelerator::DeviceGuard guard(inputs.get_device_index());
  const bool interleaved = seqs_interleaved(p.index, kFwdInputs) || seqs_interleaved(p.index, kFwdOutputs);
  const LaunchChoice c = choose(kernel, elems_per_thread, threads_per_block, memcode, algocode, p.seq_len,
                                p.num_seqs, interleaved, false, dtype, inputs.get_device_index());
  const std::optional<Tensor> workspace = chain_workspace(inputs, dtype, c, p.num_seqs, p.seq_len);
  if (workspace) p.chain_workspace = workspace->mutable_data_ptr();
  cuda_fwd(p, dtype, c.kind, c.config, current_stream(inputs));
  return outputs;
#else
  STD_TORCH_CHECK(false, "linrec: this build has no CUDA kernels");
#endif
}

std::tuple<Tensor, Tensor, Tensor> linrec_bwd(Tensor d_outputs, Tensor coeffs, Tensor outputs,
                                              std::optional<Tensor> initial, int64_t dim, bool reverse,
                                              int64_t kernel, int64_t elems_per_thread,
                                              int64_t threads_per_block, int64_t memcode, int64_t algocode) {
  dim = wrap_dim(dim, d_outputs.dim());
  const DType dtype = to_dtype(d_outputs.scalar_type());
  check_same(d_outputs, coeffs, "d_outputs", "coeffs", false, dim);
  check_same(d_outputs, outputs, "d_outputs", "outputs", false, dim);
  if (initial) check_same(d_outputs, *initial, "d_outputs", "initial", true, dim);

  Tensor d_inputs = torch::stable::empty_like(d_outputs);
  Tensor d_coeffs = torch::stable::empty_like(d_outputs);
  Tensor d_initial = torch::stable::new_empty(d_outputs, state_shape(d_outputs, dim));
  BackwardParams p;
  p.num_seqs = count_seqs(d_outputs, dim);
  p.seq_len = d_outputs.size(dim);
  p.reverse = reverse;
  if (p.seq_len == 0) {  // no step: the state passes through untouched
    torch::stable::zero_(d_initial);
    return {d_inputs, d_coeffs, d_initial};
  }
  if (p.num_seqs == 0) return {d_inputs, d_coeffs, d_initial};
  std::array<std::optional<Operand>, kNumBwdSlots> ops;
  ops[kBwdDOutputs] = Operand{&d_outputs, false};
  ops[kBwdCoeffs] = Operand{&coeffs, false};
  ops[kBwdOutputs] = Operand{&outputs, false};
  if (initial) ops[kBwdInitial] = Operand{&*initial, true};
  ops[kBwdDInputs] = Operand{&d_inputs, false};
  ops[kBwdDCoeffs] = Operand{&d_coeffs, false};
  ops[kBwdDInitial] = Operand{&d_initial, true};
  const std::vector<int64_t> sizes(d_outputs.sizes().begin(), d_outputs.sizes().end());
  build_index<kNumBwdSlots>(sizes, dim, ops, p.index);
  p.d_outputs = d_outputs.const_data_ptr();
  p.coeffs = coeffs.const_data_ptr();
  p.outputs = outputs.const_data_ptr();
  p.initial = initial ? initial->const_data_ptr() : nullptr;
  p.d_inputs = d_inputs.mutable_data_ptr();
  p.d_coeffs = d_coeffs.mutable_data_ptr();
  p.d_initial = d_initial.mutable_data_ptr();

  if (d_outputs.is_cpu()) {
    cpu_bwd(p, dtype);
    return {d_inputs, d_coeffs, d_initial};
  }
#if defined(LINREC_WITH_CUDA)
  torch::stable::accelerator::DeviceGuard guard(d_outputs.get_device_index());
  const bool interleaved = seqs_interleaved(p.index, kBwdDOutputs) || seqs_interleaved(p.index, kBwdDInputs);
  const LaunchChoice c = choose(kernel, elems_per_thread, threads_per_block, memcode, algocode, p.seq_len,
                                p.num_seqs, interleaved, true, dtype, d_outputs.get_device_index());
  const std::optional<Tensor> workspace = chain_workspace(d_outputs, dtype, c, p.num_seqs, p.seq_len);
  if (workspace) p.chain_workspace = workspace->mutable_data_ptr();
  cuda_bwd(p, dtype, c.kind, c.config, current_stream(d_outputs));
  return {d_inputs, d_coeffs, d_initial};
#else
  STD_TORCH_CHECK(false, "linrec: this build has no CUDA kernels");
#endif
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY(linrec, m) {
  // kernel: 0 auto (dispatch.h chooses), 1 ref, 2 tile, 3 pipe, 4 chained, 5 strided, 6 packed. The last four
  // ints select a compiled TileConfig for the other kernels; auto and ref ignore them.
  m.def(
      "linrec_fwd(Tensor inputs, Tensor coeffs, Tensor? initial, int dim, bool reverse, int kernel, "
      "int elems_per_thread, int threads_per_block, int memcode, int algocode) -> Tensor");
  // linrec_fwd without an autograd registration, for callers that differentiate it
  // themselves (linrec.linrec's autograd.Function): torch.library's Python autograd
  // kernel of linrec_fwd costs every call host time, grad or not (5 µs on a 2-core
  // CPU, 12.5 µs on the H100 machine's; benchmarks/NOTES.md).
  m.def(
      "_linrec_fwd(Tensor inputs, Tensor coeffs, Tensor? initial, int dim, bool reverse, int kernel, "
      "int elems_per_thread, int threads_per_block, int memcode, int algocode) -> Tensor");
  m.def(
      "linrec_bwd(Tensor d_outputs, Tensor coeffs, Tensor outputs, Tensor? initial, int dim, bool reverse, "
      "int kernel, int elems_per_thread, int threads_per_block, int memcode, int algocode) "
      "-> (Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  m.impl("linrec_fwd", TORCH_BOX(&linrec::linrec_fwd));
  m.impl("_linrec_fwd", TORCH_BOX(&linrec::linrec_fwd));
  m.impl("linrec_bwd", TORCH_BOX(&linrec::linrec_bwd));
}

#if defined(LINREC_WITH_CUDA)
STABLE_TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  m.impl("linrec_fwd", TORCH_BOX(&linrec::linrec_fwd));
  m.impl("_linrec_fwd", TORCH_BOX(&linrec::linrec_fwd));
  m.impl("linrec_bwd", TORCH_BOX(&linrec::linrec_bwd));
}
#endif

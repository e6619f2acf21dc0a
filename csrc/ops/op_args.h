// From the ops' tensor arguments to the kernels' params structs (params.h): the
// checks every op runs, output allocation, and the layout of each tensor as
// sequence and element strides. Shared by the CPU ops (ops.cpp, linrec._C) and
// the CUDA ops (ops_cuda.cpp, linrec._C_cuda), which are separate modules so
// that the CPU one loads next to any torch (setup.py).
#pragma once
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <array>
#include <cstdlib>
#include <optional>
#include <tuple>
#include <vector>

#include "../config.h"
#include "../registry.h"
#include "../params.h"
#include "new_tensor.h"

namespace linrec {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// `name`: the argument whose dtype this is, for the error.
inline DType to_dtype(ScalarType t, const char* name) {
  switch (t) {
    case ScalarType::Float: return DType::kFloat32;
    case ScalarType::Double: return DType::kFloat64;
    case ScalarType::Half: return DType::kFloat16;
    case ScalarType::BFloat16: return DType::kBFloat16;
    case ScalarType::ComplexFloat: return DType::kComplex64;
    case ScalarType::ComplexDouble: return DType::kComplex128;
    default:
      STD_TORCH_CHECK(false, "linrec: ", name, " has dtype ", torch::headeronly::toString(t),
                      "; expected float32, float64, float16, bfloat16, complex64 or complex128");
  }
}

// The ops' arguments past the tensors and dim, as the schema takes them (ops.cpp): reverse an
// int so that 2 is refused, not read as true; the kernel id (KernelKind, csrc/registry.toml)
// and the TileConfig that picks a compiled instance of it. Auto and the families without
// configs take none: linrec passes zeros there. Every op calls this first, on any device,
// so a bad argument fails the same way whether or not a kernel reads it.
inline void check_kernel_args(int64_t reverse, int64_t kernel, int64_t elems_per_thread, int64_t threads_per_block,
                              int64_t memcode, int64_t algocode) {
  STD_TORCH_CHECK(reverse == 0 || reverse == 1, "linrec: reverse must be a bool (or 0 / 1), got ", reverse);
  STD_TORCH_CHECK(kernel >= 0 && kernel <= kMaxKernelKind, "linrec: kernel=", kernel, " is not a kernel id (",
                  kKernelIds, ")");
  const int64_t least = takes_config(static_cast<KernelKind>(kernel)) ? 1 : 0;  // the others ignore it: 0 there
  STD_TORCH_CHECK(elems_per_thread >= least && threads_per_block >= least, "linrec: elems_per_thread=",
                  elems_per_thread, " and threads_per_block=", threads_per_block, " must be ",
                  least ? "positive" : "non-negative", " for kernel=", kernel);
  STD_TORCH_CHECK(memcode >= 0 && memcode <= 3, "linrec: memcode=", memcode, " must be in 0..3");
  STD_TORCH_CHECK(algocode >= 0 && algocode <= 3, "linrec: algocode=", algocode, " must be in 0..3");
}

// An argument of schema type Tensor that Python passed as None reaches the kernel undefined.
inline void check_defined(const Tensor& t, const char* name) {
  STD_TORCH_CHECK(t.defined(), "linrec: ", name, " must be a tensor, got None");
}

inline int64_t wrap_dim(int64_t dim, int64_t ndim) {
  STD_TORCH_CHECK(ndim >= 1, "linrec: inputs must have at least one dimension");
  STD_TORCH_CHECK(dim >= -ndim && dim < ndim, "linrec: dim ", dim, " is out of range for a tensor of ",
                  ndim, " dimensions");
  return dim < 0 ? dim + ndim : dim;
}

// Shape of `full` without its scan dim: the shape of `initial`.
inline std::vector<int64_t> state_shape(const Tensor& full, int64_t dim) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < full.dim(); ++k)
    if (k != dim) out.push_back(full.size(k));
  return out;
}

// The storage of a call whose scanned tensors are `values` and coefficients
// `coeffs`: one dtype, or float32 coefficients beside 16-bit values (Storage),
// with coefficients in log space if `log_coeffs`.
inline Storage storage_of(const Tensor& values, const Tensor& coeffs, const char* values_name, bool log_coeffs) {
  const ScalarType v = values.scalar_type(), c = coeffs.scalar_type();
  const Storage storage{to_dtype(v, values_name), to_dtype(c, "coeffs"), log_coeffs};
  STD_TORCH_CHECK(c == v || is_registered_storage({storage.values, storage.coeffs}), "linrec: coeffs has dtype ",
                  torch::headeronly::toString(c), " but ", values_name, " has ", torch::headeronly::toString(v),
                  "; coeffs may differ only as float32 beside float16 or bfloat16 ", values_name);
  STD_TORCH_CHECK(is_registered_storage(storage), "linrec: log_coeffs=True takes float32, float16 and bfloat16 ",
                  values_name, " (coeffs of the same dtype, or float32), not ", torch::headeronly::toString(v),
                  " and ", torch::headeronly::toString(c), ": pass exp(coeffs) with log_coeffs=False");
  return storage;
}

// `t` has ref's device and shape (without dim if is_state), and its dtype unless
// `any_dtype` (coefficients: storage_of checks theirs).
inline void check_same(const Tensor& ref, const Tensor& t, const char* ref_name, const char* name,
                       bool is_state, int64_t dim, bool any_dtype = false) {
  STD_TORCH_CHECK(any_dtype || t.scalar_type() == ref.scalar_type(), "linrec: ", name, " has dtype ",
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
// Returns false, leaving `index` unfilled, where they merge into more than
// kMaxSeqDims (high-rank views: the caller scans contiguous copies then).
template <int K>
bool build_index(const std::vector<int64_t>& seq_sizes_full, int64_t dim,
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
  if (static_cast<int>(sizes.size()) > kMaxSeqDims) return false;
  index.num_dims = static_cast<int>(sizes.size());
  for (int k = 0; k < index.num_dims; ++k) {
    index.sizes[k] = sizes[k];
    for (int t = 0; t < K; ++t) index.seq_strides[t][k] = strides[k][t];
  }
  for (int t = 0; t < K; ++t)
    index.elem_strides[t] = (ops[t] && !ops[t]->state) ? ops[t]->tensor->stride(dim) : 0;
  return true;
}

// For layouts build_index cannot index, a call reads row-major copies of its
// tensors and writes row-major outputs (this, of t's shape): their batch dims
// then merge into at most two, those before the scan dim and those after it.
inline Tensor row_major_like(const Tensor& t, std::optional<ScalarType> dtype = std::nullopt) {
  return new_row_major(t, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), dtype);
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

inline int64_t count_seqs(const Tensor& t, int64_t dim) {
  int64_t n = 1;
  for (int64_t k = 0; k < t.dim(); ++k)
    if (k != dim) n *= t.size(k);
  return n;
}

// cu_seqlens as the kernels take it (CutAt in memio.h): one byte a position along the scan dim,
// nonzero where a segment begins in scan order (linrec/_segments.py builds it). The state
// entering a segment comes in through the inputs, so no initial state goes with it.
inline const uint8_t* cuts_of(const std::optional<Tensor>& cuts, const Tensor& like, const char* like_name,
                              int64_t dim, bool has_initial) {
  if (!cuts) return nullptr;
  const ScalarType t = cuts->scalar_type();
  STD_TORCH_CHECK(t == ScalarType::Bool || t == ScalarType::Byte, "linrec: cuts must be a bool or uint8 tensor, got ",
                  torch::headeronly::toString(t));
  STD_TORCH_CHECK(cuts->dim() == 1 && cuts->size(0) == like.size(dim), "linrec: cuts must be 1-D, one element a step: ",
                  like.size(dim), " (", like_name, ".shape[dim])");
  STD_TORCH_CHECK(cuts->size(0) <= 1 || cuts->stride(0) == 1, "linrec: cuts must be contiguous");
  STD_TORCH_CHECK(cuts->device() == like.device(), "linrec: cuts is on a different device than ", like_name);
  STD_TORCH_CHECK(!has_initial, "linrec: cuts and initial exclude each other (the state entering a segment comes in "
                                "through the inputs)");
  return static_cast<const uint8_t*>(cuts->const_data_ptr());
}

// One forward call with its arguments checked: the output, allocated, and the
// params that describe it, complete but for the kernel's workspace. `empty`: no
// element to compute (the output is returned as it is).
struct ForwardCall {
  torch::stable::Tensor outputs;
  ForwardParams p;
  Storage storage;
  bool empty;
  std::vector<Tensor> copies;  // what p reads in place of the arguments, if build_index needed copies
  std::optional<Tensor> laid_out;  // with copies: the result, laid out as empty_like(inputs)

  // The op's result, after the kernel: the outputs, or where the kernel wrote row-major ones (the
  // copies' path), those copied into empty_like's layout, which the fake kernels promise to
  // traced graphs (inductor checks it).
  Tensor result() {
    if (!laid_out) return outputs;
    torch::stable::copy_(*laid_out, outputs);
    return *laid_out;
  }
};

inline ForwardCall prepare_fwd(const Tensor& inputs, const Tensor& coeffs, const std::optional<Tensor>& initial,
                               int64_t dim, bool reverse, bool log_coeffs, const std::optional<Tensor>& cuts) {
  check_defined(inputs, "inputs");
  check_defined(coeffs, "coeffs");
  dim = wrap_dim(dim, inputs.dim());
  check_same(inputs, coeffs, "inputs", "coeffs", false, dim, /*any_dtype=*/true);
  const Storage storage = storage_of(inputs, coeffs, "inputs", log_coeffs);
  if (initial) check_same(inputs, *initial, "inputs", "initial", true, dim);

  ForwardCall call{new_like(inputs), ForwardParams{}, storage, inputs.numel() == 0, {}};
  ForwardParams& p = call.p;
  p.cuts = cuts_of(cuts, inputs, "inputs", dim, initial.has_value());
  p.num_seqs = count_seqs(inputs, dim);
  p.seq_len = inputs.size(dim);
  p.reverse = reverse;
  if (call.empty) return call;
  const Tensor* x = &inputs;
  const Tensor* c = &coeffs;
  const Tensor* h0 = initial ? &*initial : nullptr;
  const std::vector<int64_t> sizes(inputs.sizes().begin(), inputs.sizes().end());
  auto index = [&] {
    std::array<std::optional<Operand>, kNumFwdSlots> ops;
    ops[kFwdInputs] = Operand{x, false};
    ops[kFwdCoeffs] = Operand{c, false};
    ops[kFwdOutputs] = Operand{&call.outputs, false};
    if (h0) ops[kFwdInitial] = Operand{h0, true};
    return build_index<kNumFwdSlots>(sizes, dim, ops, p.index);
  };
  if (!index()) {
    call.copies = {torch::stable::contiguous(inputs), torch::stable::contiguous(coeffs)};
    if (h0) call.copies.push_back(torch::stable::contiguous(*h0));
    x = &call.copies[0], c = &call.copies[1], h0 = h0 ? &call.copies[2] : nullptr;
    call.laid_out = call.outputs;
    call.outputs = row_major_like(inputs);
    STD_TORCH_CHECK(index(), "linrec: internal error: contiguous tensors must merge into two batch dims");
  }
  p.inputs = x->const_data_ptr();
  p.coeffs = c->const_data_ptr();
  p.initial = h0 ? h0->const_data_ptr() : nullptr;
  p.outputs = call.outputs.mutable_data_ptr();
  return call;
}

// One backward call, likewise: the three gradients and their params.
struct BackwardCall {
  torch::stable::Tensor d_inputs, d_coeffs, d_initial;
  BackwardParams p;
  Storage storage;
  bool empty;
  std::vector<Tensor> copies;  // as ForwardCall's
  std::optional<Tensor> laid_out_d_inputs, laid_out_d_coeffs;  // as ForwardCall's laid_out

  // The op's result, after the kernel, as ForwardCall::result (d_initial is row-major either way).
  std::tuple<Tensor, Tensor, Tensor> grads() {
    if (!laid_out_d_inputs) return {d_inputs, d_coeffs, d_initial};
    torch::stable::copy_(*laid_out_d_inputs, d_inputs);
    torch::stable::copy_(*laid_out_d_coeffs, d_coeffs);
    return {*laid_out_d_inputs, *laid_out_d_coeffs, d_initial};
  }
};

inline BackwardCall prepare_bwd(const Tensor& d_outputs, const Tensor& coeffs, const Tensor& outputs,
                                const std::optional<Tensor>& initial, int64_t dim, bool reverse, bool log_coeffs,
                                const std::optional<Tensor>& cuts) {
  check_defined(d_outputs, "d_outputs");
  check_defined(coeffs, "coeffs");
  check_defined(outputs, "outputs");
  dim = wrap_dim(dim, d_outputs.dim());
  check_same(d_outputs, coeffs, "d_outputs", "coeffs", false, dim, /*any_dtype=*/true);
  const Storage storage = storage_of(d_outputs, coeffs, "d_outputs", log_coeffs);
  check_same(d_outputs, outputs, "d_outputs", "outputs", false, dim);
  if (initial) check_same(d_outputs, *initial, "d_outputs", "initial", true, dim);

  // d_coeffs laid out as d_outputs, in the coefficients' dtype.
  const std::optional<ScalarType> d_coeffs_dtype =
      storage.mixed() ? std::optional<ScalarType>(ScalarType::Float) : std::nullopt;
  BackwardCall call{new_like(d_outputs), new_like(d_outputs, d_coeffs_dtype),
                    new_row_major(d_outputs, state_shape(d_outputs, dim)), BackwardParams{}, storage, false, {}};
  BackwardParams& p = call.p;
  p.cuts = cuts_of(cuts, d_outputs, "d_outputs", dim, initial.has_value());
  p.num_seqs = count_seqs(d_outputs, dim);
  p.seq_len = d_outputs.size(dim);
  p.reverse = reverse;
  if (p.seq_len == 0) {  // no step: the state passes through untouched
    torch::stable::zero_(call.d_initial);
    call.empty = true;
    return call;
  }
  call.empty = p.num_seqs == 0;
  if (call.empty) return call;
  const Tensor* dy = &d_outputs;
  const Tensor* c = &coeffs;
  const Tensor* y = &outputs;
  const Tensor* h0 = initial ? &*initial : nullptr;
  const std::vector<int64_t> sizes(d_outputs.sizes().begin(), d_outputs.sizes().end());
  auto index = [&] {
    std::array<std::optional<Operand>, kNumBwdSlots> ops;
    ops[kBwdDOutputs] = Operand{dy, false};
    ops[kBwdCoeffs] = Operand{c, false};
    ops[kBwdOutputs] = Operand{y, false};
    if (h0) ops[kBwdInitial] = Operand{h0, true};
    ops[kBwdDInputs] = Operand{&call.d_inputs, false};
    ops[kBwdDCoeffs] = Operand{&call.d_coeffs, false};
    ops[kBwdDInitial] = Operand{&call.d_initial, true};
    return build_index<kNumBwdSlots>(sizes, dim, ops, p.index);
  };
  if (!index()) {
    call.copies = {torch::stable::contiguous(d_outputs), torch::stable::contiguous(coeffs), torch::stable::contiguous(outputs)};
    if (h0) call.copies.push_back(torch::stable::contiguous(*h0));
    dy = &call.copies[0], c = &call.copies[1], y = &call.copies[2], h0 = h0 ? &call.copies[3] : nullptr;
    call.laid_out_d_inputs = call.d_inputs;
    call.laid_out_d_coeffs = call.d_coeffs;
    call.d_inputs = row_major_like(d_outputs);
    call.d_coeffs = row_major_like(d_outputs, d_coeffs_dtype);
    STD_TORCH_CHECK(index(), "linrec: internal error: contiguous tensors must merge into two batch dims");
  }
  p.d_outputs = dy->const_data_ptr();
  p.coeffs = c->const_data_ptr();
  p.outputs = y->const_data_ptr();
  p.initial = h0 ? h0->const_data_ptr() : nullptr;
  p.d_inputs = call.d_inputs.mutable_data_ptr();
  p.d_coeffs = call.d_coeffs.mutable_data_ptr();
  p.d_initial = call.d_initial.mutable_data_ptr();
  return call;
}

}  // namespace linrec

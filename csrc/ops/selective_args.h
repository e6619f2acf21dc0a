// From the selective scan's tensor arguments to its kernels' params (selective_params.h): the
// checks both ops run, output allocation, and each tensor's layout as strides. Shared by the
// CPU ops (selective_ops.cpp, linrec._C) and the CUDA ops (selective_ops_cuda.cpp,
// linrec._C_cuda). The (batch, dim, L) tensors and per-step B and C are read through their
// strides, any strides; the small float tensors (A, D, delta_bias, the states, checkpoints)
// are read contiguous, copied where they are not.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "../selective_params.h"
#include "op_args.h"

namespace linrec {

// What the two ops take past the tensors: reverse an int (0 / 1, so that 2 is refused, not
// read as true) and the CUDA config, (0, 0) for automatic. The CPU kernel ignores the config
// but checks it too: the ops are public.
inline void check_selective_args(int64_t reverse, int64_t steps_per_thread, int64_t warps) {
  STD_TORCH_CHECK(reverse == 0 || reverse == 1, "linrec: reverse must be a bool (or 0 / 1), got ", reverse);
  STD_TORCH_CHECK(steps_per_thread >= 0 && warps >= 0 && (steps_per_thread == 0) == (warps == 0),
                  "linrec: steps_per_thread=", steps_per_thread, " and warps=", warps,
                  " must both be 0 (automatic) or both positive");
}

inline std::string shape_text(const Tensor& t) {
  std::ostringstream out;
  out << "(";
  for (int64_t k = 0; k < t.dim(); ++k) out << (k ? ", " : "") << t.size(k);
  out << (t.dim() == 1 ? ",)" : ")");
  return out.str();
}

inline bool has_shape(const Tensor& t, const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()) == shape;
}

// `t` is a tensor on u's device of dtype `dtype` and shape `shape`; `expected` names that shape.
inline void check_arg(const Tensor& t, const char* name, const Tensor& u, ScalarType dtype,
                      const std::vector<int64_t>& shape, const char* expected) {
  check_defined(t, name);
  STD_TORCH_CHECK(t.device() == u.device(), "linrec: ", name, " is on a different device than u");
  STD_TORCH_CHECK(has_shape(t, shape), "linrec: ", name, " has shape ", shape_text(t), "; expected ", expected);
  STD_TORCH_CHECK(t.scalar_type() == dtype, "linrec: ", name, " has dtype ",
                  torch::headeronly::toString(t.scalar_type()), "; expected ", torch::headeronly::toString(dtype));
}

inline Strides3 strides3(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// B or C as the kernels read it: per channel (dim, N) in the float type, or per step
// (batch, groups, N, L) in u's dtype or float32 beside 16-bit u.
struct BCArg {
  bool per_step = false;
  int64_t groups = 0;  // per step only
  StridesBC strides;
};

inline BCArg check_bc(const Tensor& t, const char* name, const Tensor& u, ScalarType acc, int64_t states) {
  check_defined(t, name);
  STD_TORCH_CHECK(t.device() == u.device(), "linrec: ", name, " is on a different device than u");
  const int64_t batch = u.size(0), dim = u.size(1), length = u.size(2);
  if (t.dim() == 2) {
    check_arg(t, name, u, acc, {dim, states}, "(dim, N) as u and A have them, or per step (batch, groups, N, L)");
    return {false, 0, {0, t.stride(0), t.stride(1), 0}};
  }
  STD_TORCH_CHECK(t.dim() == 4 && t.size(0) == batch && t.size(2) == states && t.size(3) == length, "linrec: ",
                  name, " has shape ", shape_text(t), "; expected (dim, N) or per step (batch, groups, N, L) as u "
                  "and A have them");
  const int64_t groups = t.size(1);
  STD_TORCH_CHECK(groups >= 1 && dim % groups == 0, "linrec: ", name, " has ", groups,
                  " groups, which do not divide dim=", dim);
  // A size-1 dim's stride is never stepped over: as 0 it cannot spoil the kernels' alignment check.
  const auto stride = [&](int64_t k) { return t.size(k) == 1 ? int64_t(0) : t.stride(k); };
  return {true, groups, {stride(0), stride(1), stride(2), t.stride(3)}};
}

// The checked forward arguments, as the params of either op read them.
struct SelectiveInputs {
  ScalarType values, acc;
  BCArg b, c;
  SelectiveStorage storage;
  std::vector<Tensor> copies;  // contiguous copies that p points into, kept alive with the call
  std::vector<int64_t> state_shape;  // (batch, dim, N), or (batch, dim, segments, N) with cu_seqlens
  std::vector<int64_t> segment_of;   // with cu_seqlens on the CPU: each position's segment
};

// cu_seqlens of packed sequences with a state each: 1-D int64 [0, e1, ..., L] on u's device
// (linrec.selective_scan converts it), with cuts. Sets p.segments and p.cu_seqlens (into a
// contiguous copy kept in `copies`); on the CPU also each position's segment, into
// `segment_of` (the values checked: the kernels index by them). On other devices the values
// stay unchecked (that would wait for the device); a segment the kernels look up is always
// one of 0 .. segments - 1.
inline void check_cu_seqlens(SelectiveParams& p, const std::optional<Tensor>& cu_seqlens,
                             const std::optional<Tensor>& cuts, const Tensor& u, std::vector<Tensor>& copies,
                             std::vector<int64_t>& segment_of) {
  if (!cu_seqlens) return;
  const Tensor& cu = *cu_seqlens;
  STD_TORCH_CHECK(cuts.has_value(), "linrec: cu_seqlens comes with cuts");
  STD_TORCH_CHECK(cu.scalar_type() == ScalarType::Long && cu.dim() == 1 && cu.size(0) >= 2,
                  "linrec: cu_seqlens must be a 1-D int64 tensor of at least 2 elements");
  STD_TORCH_CHECK(cu.device() == u.device(), "linrec: cu_seqlens is on a different device than u");
  // The CUDA kernels keep a step's segment in 32 bits.
  STD_TORCH_CHECK(cu.size(0) <= std::numeric_limits<int32_t>::max(), "linrec: cu_seqlens has ", cu.size(0) - 1,
                  " segments; at most 2^31 - 2");
  const int64_t segments = cu.size(0) - 1, length = u.size(2);
  const Tensor& dense = copies.emplace_back(torch::stable::contiguous(cu));
  p.segments = segments;
  p.cu_seqlens = static_cast<const int64_t*>(dense.const_data_ptr());
  if (u.device().is_cpu()) {
    const int64_t* bounds = p.cu_seqlens;
    STD_TORCH_CHECK(bounds[0] == 0 && bounds[segments] == length, "linrec: cu_seqlens must run from 0 to ", length,
                    " (u.shape[2])");
    // All of them before any write: from 0 to length without a decrease, each bound is in range.
    for (int64_t k = 0; k < segments; ++k) {
      STD_TORCH_CHECK(bounds[k] <= bounds[k + 1], "linrec: cu_seqlens must not decrease");
    }
    segment_of.resize(length);
    for (int64_t k = 0; k < segments; ++k) {
      std::fill(segment_of.begin() + bounds[k], segment_of.begin() + bounds[k + 1], k);
    }
  }
}

// Checks the forward's arguments and fills p's sizes, flags and input pointers.
inline SelectiveInputs check_selective_inputs(SelectiveParams& p, const Tensor& u, const Tensor& delta, const Tensor& A,
                                              const Tensor& B, const Tensor& C, const std::optional<Tensor>& D,
                                              const std::optional<Tensor>& z,
                                              const std::optional<Tensor>& delta_bias,
                                              const std::optional<Tensor>& initial_state, bool delta_softplus,
                                              bool reverse, const std::optional<Tensor>& cuts,
                                              const std::optional<Tensor>& cu_seqlens) {
  check_defined(u, "u");
  STD_TORCH_CHECK(u.dim() == 3, "linrec: u has shape ", shape_text(u), "; expected (batch, dim, L)");
  SelectiveInputs in;
  in.values = u.scalar_type();
  STD_TORCH_CHECK(in.values == ScalarType::Float || in.values == ScalarType::Double ||
                      in.values == ScalarType::Half || in.values == ScalarType::BFloat16,
                  "linrec: u has dtype ", torch::headeronly::toString(in.values),
                  "; expected float32, float64, float16 or bfloat16");
  in.acc = in.values == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  const int64_t batch = u.size(0), dim = u.size(1), length = u.size(2);
  const std::vector<int64_t> seq_shape{batch, dim, length};
  check_arg(delta, "delta", u, in.values, seq_shape, "u's shape (batch, dim, L)");
  if (z) check_arg(*z, "z", u, in.values, seq_shape, "u's shape (batch, dim, L)");
  check_defined(A, "A");
  STD_TORCH_CHECK(A.dim() == 2 && A.size(0) == dim, "linrec: A has shape ", shape_text(A), "; expected (dim=", dim,
                  ", N)");
  const int64_t states = A.size(1);
  STD_TORCH_CHECK(states <= 256, "linrec: A has N=", states, " states; the selective scan takes at most 256");
  check_arg(A, "A", u, in.acc, {dim, states}, "(dim, N)");
  if (D) check_arg(*D, "D", u, in.acc, {dim}, "(dim,)");
  if (delta_bias) check_arg(*delta_bias, "delta_bias", u, in.acc, {dim}, "(dim,)");
  std::vector<int64_t> segment_of;
  check_cu_seqlens(p, cu_seqlens, cuts, u, in.copies, segment_of);
  in.state_shape = cu_seqlens ? std::vector<int64_t>{batch, dim, p.segments, states}
                              : std::vector<int64_t>{batch, dim, states};
  if (initial_state)
    check_arg(*initial_state, "initial_state", u, in.acc, in.state_shape,
              cu_seqlens ? "(batch, dim, segments, N)" : "(batch, dim, N)");
  in.b = check_bc(B, "B", u, in.acc, states);
  in.c = check_bc(C, "C", u, in.acc, states);
  if (in.b.per_step && in.c.per_step) {
    STD_TORCH_CHECK(in.b.groups == in.c.groups, "linrec: C has ", in.c.groups, " groups but B has ", in.b.groups);
    STD_TORCH_CHECK(B.scalar_type() == C.scalar_type(), "linrec: C has dtype ",
                    torch::headeronly::toString(C.scalar_type()), " but B has ",
                    torch::headeronly::toString(B.scalar_type()), "; per-step B and C share one dtype");
  }
  // The storage: u's dtype, and that of per-step B and C (u's where neither is per step).
  const Tensor* per_step = in.b.per_step ? &B : in.c.per_step ? &C : nullptr;
  const char* per_step_name = in.b.per_step ? "B" : "C";
  const DType values = to_dtype(in.values, "u");
  in.storage = {values, per_step ? to_dtype(per_step->scalar_type(), per_step_name) : values};
  STD_TORCH_CHECK(is_registered_selective_storage(in.storage), "linrec: ", per_step_name, " has dtype ",
                  torch::headeronly::toString(per_step->scalar_type()), " but u has ",
                  torch::headeronly::toString(in.values),
                  "; per-step B and C are in u's dtype, or float32 beside float16 or bfloat16 u");

  p.batch = batch, p.dim = dim, p.states = states, p.seq_len = length;
  p.groups = in.b.per_step ? in.b.groups : in.c.per_step ? in.c.groups : dim;
  p.b_per_step = in.b.per_step, p.c_per_step = in.c.per_step;
  // With no states, B and C hold nothing: as per channel, no kernel reads them, and the
  // kernels still compute D * u and the gate.
  if (states == 0) p.b_per_step = p.c_per_step = false, p.groups = dim;
  p.delta_softplus = delta_softplus, p.reverse = reverse;
  p.u = u.const_data_ptr(), p.u_strides = strides3(u);
  p.delta = delta.const_data_ptr(), p.delta_strides = strides3(delta);
  if (z) p.z = z->const_data_ptr(), p.z_strides = strides3(*z);
  p.B = B.const_data_ptr(), p.b_strides = in.b.strides;
  p.C = C.const_data_ptr(), p.c_strides = in.c.strides;
  const auto contiguous = [&](const Tensor& t) {
    in.copies.push_back(torch::stable::contiguous(t));
    return in.copies.back().const_data_ptr();
  };
  p.A = contiguous(A);
  if (D) p.D = contiguous(*D);
  if (delta_bias) p.delta_bias = contiguous(*delta_bias);
  if (initial_state) p.initial = contiguous(*initial_state);
  p.cuts = cuts_of(cuts, u, "u", 2, false);
  STD_TORCH_CHECK(!cuts || !initial_state || cu_seqlens, "linrec: cuts and initial_state exclude each other "
                                                         "unless cu_seqlens gives a state a segment");
  in.segment_of = std::move(segment_of);  // moving the inputs keeps its buffer, which p points into
  if (!in.segment_of.empty()) p.segment_of = in.segment_of.data();
  return in;
}

// One forward call with its arguments checked: the outputs, allocated, and the params that
// describe it. `empty`: no step to take (no sequence or no steps); the outputs are final.
struct SelectiveFwdCall {
  Tensor y, last_state, checkpoints;
  SelectiveParams p;
  SelectiveInputs inputs;
  bool empty = false;
  std::tuple<Tensor, Tensor, Tensor> outputs() const { return {y, last_state, checkpoints}; }
};

inline SelectiveFwdCall prepare_selective_fwd(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                              const Tensor& C, const std::optional<Tensor>& D,
                                              const std::optional<Tensor>& z,
                                              const std::optional<Tensor>& delta_bias,
                                              const std::optional<Tensor>& initial_state, bool delta_softplus,
                                              bool reverse, const std::optional<Tensor>& cuts,
                                              const std::optional<Tensor>& cu_seqlens) {
  SelectiveFwdCall call;
  SelectiveParams& p = call.p;
  call.inputs = check_selective_inputs(p, u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, reverse,
                                       cuts, cu_seqlens);
  const ScalarType acc = call.inputs.acc;
  call.y = new_row_major(u, {p.batch, p.dim, p.seq_len});
  call.last_state = new_row_major(u, call.inputs.state_shape, acc);
  call.checkpoints = new_row_major(u, {p.batch, p.dim, num_checkpoints(p.seq_len), p.states}, acc);
  call.empty = p.batch * p.dim == 0 || p.seq_len == 0;
  // No step, or a state a segment: the state passes through (an empty segment keeps it; the
  // kernels write the others').
  if (call.empty || cu_seqlens) {
    if (initial_state) torch::stable::copy_(call.last_state, *initial_state);
    else torch::stable::zero_(call.last_state);
  }
  if (call.empty) return call;
  p.y = call.y.mutable_data_ptr();
  p.last_state = call.last_state.mutable_data_ptr();
  p.checkpoints = call.checkpoints.mutable_data_ptr();
  return call;
}

// One backward call, likewise: the nine gradients and their params. The accumulators (d_A,
// d_B, d_C, d_D, d_delta_bias) start at zero; an absent D, z or delta_bias has a 0-element
// gradient.
struct SelectiveBwdCall {
  Tensor d_u, d_delta, d_A, d_B, d_C, d_D, d_z, d_delta_bias, d_initial;
  SelectiveGradParams p;
  SelectiveInputs inputs;
  bool empty = false;
  std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> grads() const {
    return {d_u, d_delta, d_A, d_B, d_C, d_D, d_z, d_delta_bias, d_initial};
  }
};

inline SelectiveBwdCall prepare_selective_bwd(const Tensor& d_y, const std::optional<Tensor>& d_last_state,
                                              const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                              const Tensor& C, const std::optional<Tensor>& D,
                                              const std::optional<Tensor>& z,
                                              const std::optional<Tensor>& delta_bias,
                                              const std::optional<Tensor>& initial_state, const Tensor& checkpoints,
                                              bool delta_softplus, bool reverse, const std::optional<Tensor>& cuts,
                                              const std::optional<Tensor>& cu_seqlens) {
  SelectiveBwdCall call;
  SelectiveGradParams& p = call.p;
  call.inputs = check_selective_inputs(p, u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, reverse,
                                       cuts, cu_seqlens);
  const ScalarType values = call.inputs.values, acc = call.inputs.acc;
  const int64_t batch = p.batch, dim = p.dim, states = p.states, length = p.seq_len;
  check_arg(d_y, "d_y", u, values, {batch, dim, length}, "u's shape (batch, dim, L)");
  if (d_last_state)
    check_arg(*d_last_state, "d_last_state", u, acc, call.inputs.state_shape,
              cu_seqlens ? "(batch, dim, segments, N)" : "(batch, dim, N)");
  check_arg(checkpoints, "checkpoints", u, acc, {batch, dim, num_checkpoints(length), states},
            "(batch, dim, ceil(L / 128), N), as the forward returns it");

  const auto empty_grad = [&](ScalarType dtype) { return new_row_major(u, {0}, dtype); };
  const auto bc_grad = [&](const BCArg& bc) {
    return bc.per_step ? new_zeros_row_major(u, {batch, bc.groups, states, length}, acc)
                       : new_zeros_row_major(u, {dim, states}, acc);
  };
  call.d_u = new_row_major(u, {batch, dim, length});
  call.d_delta = new_row_major(u, {batch, dim, length});
  call.d_z = z ? new_row_major(u, {batch, dim, length}) : empty_grad(values);
  call.d_A = new_zeros_row_major(u, {dim, states}, acc);
  call.d_B = bc_grad(call.inputs.b);
  call.d_C = bc_grad(call.inputs.c);
  call.d_D = D ? new_zeros_row_major(u, {dim}, acc) : empty_grad(acc);
  call.d_delta_bias = delta_bias ? new_zeros_row_major(u, {dim}, acc) : empty_grad(acc);
  call.d_initial = new_row_major(u, call.inputs.state_shape, acc);
  call.empty = batch * dim == 0 || length == 0;
  // No step, or a state a segment: the state's gradient passes through (an empty segment's).
  if (call.empty || cu_seqlens) {
    if (d_last_state) torch::stable::copy_(call.d_initial, *d_last_state);
    else torch::stable::zero_(call.d_initial);
  }
  if (call.empty) return call;
  p.d_y = d_y.const_data_ptr(), p.d_y_strides = strides3(d_y);
  p.checkpoints = call.inputs.copies.emplace_back(torch::stable::contiguous(checkpoints)).mutable_data_ptr();
  if (d_last_state)
    p.d_last_state = call.inputs.copies.emplace_back(torch::stable::contiguous(*d_last_state)).const_data_ptr();
  p.d_u = call.d_u.mutable_data_ptr();
  p.d_delta = call.d_delta.mutable_data_ptr();
  if (z) p.d_z = call.d_z.mutable_data_ptr();
  p.d_initial = call.d_initial.mutable_data_ptr();
  p.d_A = call.d_A.mutable_data_ptr();
  p.d_B = call.d_B.mutable_data_ptr();
  p.d_C = call.d_C.mutable_data_ptr();
  if (D) p.d_D = call.d_D.mutable_data_ptr();
  if (delta_bias) p.d_delta_bias = call.d_delta_bias.mutable_data_ptr();
  return call;
}

// The two ops' bodies for one device's kernels: Kernels::fwd(call, steps_per_thread, warps) and
// Kernels::bwd(...) check the config and run the kernels on a call (empty too: the CUDA ones
// check the config before they see that nothing is to be done). Each device registers these.
template <typename Kernels>
std::tuple<Tensor, Tensor, Tensor> selective_scan_fwd_op(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C,
                                                         std::optional<Tensor> D, std::optional<Tensor> z,
                                                         std::optional<Tensor> delta_bias,
                                                         std::optional<Tensor> initial_state, bool delta_softplus,
                                                         int64_t reverse, int64_t steps_per_thread, int64_t warps,
                                                         std::optional<Tensor> cuts,
                                                         std::optional<Tensor> cu_seqlens) {
  check_selective_args(reverse, steps_per_thread, warps);
  SelectiveFwdCall call = prepare_selective_fwd(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus,
                                                reverse != 0, cuts, cu_seqlens);
  Kernels::fwd(call, steps_per_thread, warps);
  return call.outputs();
}

template <typename Kernels>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> selective_scan_bwd_op(
    Tensor d_y, std::optional<Tensor> d_last_state, Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C,
    std::optional<Tensor> D, std::optional<Tensor> z, std::optional<Tensor> delta_bias,
    std::optional<Tensor> initial_state, Tensor checkpoints, bool delta_softplus, int64_t reverse,
    int64_t steps_per_thread, int64_t warps, std::optional<Tensor> cuts, std::optional<Tensor> cu_seqlens) {
  check_selective_args(reverse, steps_per_thread, warps);
  SelectiveBwdCall call = prepare_selective_bwd(d_y, d_last_state, u, delta, A, B, C, D, z, delta_bias, initial_state,
                                                checkpoints, delta_softplus, reverse != 0, cuts, cu_seqlens);
  Kernels::bwd(call, steps_per_thread, warps);
  return call.grads();
}

}  // namespace linrec

// CPU kernels: sequences split over threads, neighbouring sequences scanned in
// lockstep. 16-bit storage types are computed in float32, everything else in
// its own type. Complex storage runs the same walks; its backward conjugates
// (PyTorch's convention for complex gradients, see kernels/primitives/complex.cuh).
//
// Where consecutive sequences are neighbours in memory (channel-last data, such
// as (B, T, D) scanned over T), a thread walks a run of them together: one step
// of the run is then a contiguous row of each tensor, which the compiler
// vectorises, and the whole walk reads and writes rows in order, as an
// elementwise op does. Walking one such sequence at a time would stride through
// memory a row per element.
//
// Sequences stored as rows are walked kRowLanes at a time, each lane its own
// row: one sequence alone is a chain of dependent multiply-adds, which waits on
// the previous one's latency every step; independent lanes fill that wait.
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>
#include <torch/headeronly/util/complex.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "../kernels/launch.h"
#include "storages.h"

namespace linrec {
namespace {

template <typename T> struct AccType { using type = T; };
template <> struct AccType<c10::Half> { using type = float; };
template <> struct AccType<c10::BFloat16> { using type = float; };

template <typename T> inline T conj(T v) { return v; }
template <typename R> inline c10::complex<R> conj(c10::complex<R> v) { return {v.real(), -v.imag()}; }

// A coefficient as the scan takes it: the stored value, or exp of a log-coefficient (LogOf).
template <typename Acc, typename Tc> inline Acc coeff_value(Tc v) { return static_cast<Acc>(v); }
template <typename Acc, typename R> inline Acc coeff_value(LogOf<R> v) { return std::exp(static_cast<Acc>(v.log)); }

// The stored gradient of a coefficient of value c whose d/dc is `grad`: grad, or for a
// log-coefficient the gradient of log c, grad * c.
template <typename Tc, typename Acc> struct CoeffGrad {
  static Tc of(Acc grad, Acc) { return static_cast<Tc>(grad); }
};
template <typename R, typename Acc> struct CoeffGrad<LogOf<R>, Acc> {
  static LogOf<R> of(Acc grad, Acc c) { return {static_cast<R>(grad * c)}; }
};

constexpr int kMaxLanes = 512;
constexpr int kRowLanes = 4;

// Consecutive sequences n0 .. n0 + lanes - 1 (the lanes), scanned together:
// step i of lane k of tensor t is element first[t] + k * lane_stride[t] +
// i * step[t], in scan order (from the last element when reverse). The state
// tensors (initial, d_initial) have no steps.
template <int kTensors>
struct SeqRun {
  int64_t first[kTensors];
  int64_t step[kTensors];
  int64_t lane_stride[kTensors];
  int lanes;
};

// The run that starts at sequence n0, within the fastest-varying sequence dim
// (SeqIndexer), whose sequences lie lane_stride apart in each tensor, and not
// past `end`. Where that stride is 1 in every tensor with steps (has_steps[t]),
// the sequences are neighbours: the run takes up to kMaxLanes of them.
// Otherwise it takes kRowLanes, or one where fewer are left.
template <int kTensors, typename Params>
SeqRun<kTensors> find_run(const Params& p, int64_t n0, int64_t end, const bool (&has_steps)[kTensors]) {
  const auto& index = p.index;
  const int inner = index.num_dims - 1;
  bool neighbours = inner >= 0;
  for (int t = 0; t < kTensors; ++t) neighbours = neighbours && (!has_steps[t] || index.seq_strides[t][inner] == 1);
  const int64_t left = inner >= 0 ? std::min(end - n0, index.sizes[inner] - n0 % index.sizes[inner]) : 1;
  SeqRun<kTensors> r;
  r.lanes = neighbours ? static_cast<int>(std::min(left, static_cast<int64_t>(kMaxLanes)))
                       : (left >= kRowLanes ? kRowLanes : 1);
  int64_t off[kTensors];
  index.offsets(n0, off);
  for (int t = 0; t < kTensors; ++t) {
    const int64_t stride = index.elem_strides[t];
    r.step[t] = p.reverse ? -stride : stride;
    r.first[t] = off[t] + (p.reverse ? (p.seq_len - 1) * stride : 0);
    r.lane_stride[t] = inner >= 0 ? index.seq_strides[t][inner] : 0;
  }
  return r;
}

// A run's lane count for the walk, fixed at compile time where it can be: 1
// (one sequence), kRowLanes (rows, or as many neighbours), or kNeighbourLanes,
// r.lanes neighbours (lane stride 1). With one lane, a loop of run-time length
// took 2.5x the time (2-core CPU, (64, 65536)).
constexpr int kNeighbourLanes = 0;

// Runs fn.template operator()<kLanes>(run) over runs that cover every sequence,
// the sequences split over threads.
template <int kTensors, typename Params, typename Fn>
void for_each_run(const Params& p, const bool (&has_steps)[kTensors], Fn fn) {
  // Enough sequences per task that the parallel overhead stays small.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(p.seq_len, 1));
  torch::stable::parallel_for(0, p.num_seqs, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n0 = begin; n0 < end;) {
      const SeqRun<kTensors> r = find_run(p, n0, end, has_steps);
      if (r.lanes == 1) fn.template operator()<1>(r);
      else if (r.lanes == kRowLanes) fn.template operator()<kRowLanes>(r);
      else fn.template operator()<kNeighbourLanes>(r);
      n0 += r.lanes;
    }
  });
}

// Where lane k's element of tensor t lies from lane 0's.
template <int kLanes, int kTensors>
inline int64_t lane_offset(const SeqRun<kTensors>& r, int t, int k) {
  return kLanes == kNeighbourLanes ? k : k * r.lane_stride[t];
}

// Whether scan step i is cut (packed sequences: params.h, CutAt in memio.h).
template <typename Params>
inline bool is_cut(const Params& p, int64_t i) {
  return p.cuts != nullptr && p.cuts[p.reverse ? p.seq_len - 1 - i : i];
}

constexpr bool kFwdHasSteps[kNumFwdSlots] = {true, true, true, false};  // by FwdSlot

// y[l] = c[l] * y[l-1] + x[l] along each lane's sequence; kLanes as in for_each_run.
// Values are stored as T, coefficients as Tc (float32 beside 16-bit values, or T; LogOf for log c).
template <typename T, typename Tc, int kLanes>
void fwd_run(const ForwardParams& p, const SeqRun<kNumFwdSlots>& r) {
  using Acc = typename AccType<T>::type;
  const auto* x = static_cast<const T*>(p.inputs);
  const auto* c = static_cast<const Tc*>(p.coeffs);
  const auto* h0 = static_cast<const T*>(p.initial);
  auto* y = static_cast<T*>(p.outputs);
  auto lane = [&](int t, int k) { return lane_offset<kLanes>(r, t, k); };
  const int lanes = kLanes == kNeighbourLanes ? r.lanes : kLanes;
  Acc state[kLanes == kNeighbourLanes ? kMaxLanes : kLanes];
  for (int k = 0; k < lanes; ++k) state[k] = h0 ? static_cast<Acc>(h0[r.first[kFwdInitial] + k * r.lane_stride[kFwdInitial]]) : Acc(0);
  for (int64_t i = 0; i < p.seq_len; ++i) {
    const T* __restrict__ xs = x + r.first[kFwdInputs] + i * r.step[kFwdInputs];
    const Tc* __restrict__ cs = c + r.first[kFwdCoeffs] + i * r.step[kFwdCoeffs];
    T* __restrict__ ys = y + r.first[kFwdOutputs] + i * r.step[kFwdOutputs];
    const bool cut = is_cut(p, i);
    for (int k = 0; k < lanes; ++k) {
      const Acc coeff = cut ? Acc(0) : coeff_value<Acc>(cs[lane(kFwdCoeffs, k)]);
      state[k] = coeff * state[k] + static_cast<Acc>(xs[lane(kFwdInputs, k)]);
      ys[lane(kFwdOutputs, k)] = static_cast<T>(state[k]);
    }
  }
}

template <typename T, typename Tc>
void fwd(const ForwardParams& p) {
  for_each_run(p, kFwdHasSteps, [&]<int kLanes>(const SeqRun<kNumFwdSlots>& r) { fwd_run<T, Tc, kLanes>(p, r); });
}

constexpr bool kBwdHasSteps[kNumBwdSlots] = {true, true, true, false, true, true, false};  // by BwdSlot

// Walks each sequence against the forward direction:
//   d_inputs[l]  = conj(coeffs[l+1]) * d_inputs[l+1] + d_outputs[l]   (coeffs[L] := 0)
//   d_coeffs[l]  = d_inputs[l] * conj(outputs[l-1])                   (outputs[-1] := initial)
//   d_initial    = d_inputs[0] * conj(coeffs[0])
// with "+1" meaning one step later in the forward direction. Step i is the
// forward's scan step i (SeqRun), walked from the last to the first. kLanes as
// in for_each_run.
template <typename T, typename Tc, int kLanes>
void bwd_run(const BackwardParams& p, const SeqRun<kNumBwdSlots>& r) {
  using Acc = typename AccType<T>::type;
  const auto* dy = static_cast<const T*>(p.d_outputs);
  const auto* c = static_cast<const Tc*>(p.coeffs);
  const auto* y = static_cast<const T*>(p.outputs);
  const auto* h0 = static_cast<const T*>(p.initial);
  auto* dx = static_cast<T*>(p.d_inputs);
  auto* dc = static_cast<Tc*>(p.d_coeffs);
  auto* dh0 = static_cast<T*>(p.d_initial);
  auto at = [&](int t, int64_t i) { return r.first[t] + i * r.step[t]; };  // lane 0's step i
  auto lane = [&](int t, int k) { return lane_offset<kLanes>(r, t, k); };
  const int lanes = kLanes == kNeighbourLanes ? r.lanes : kLanes;
  constexpr int kStateLanes = kLanes == kNeighbourLanes ? kMaxLanes : kLanes;
  Acc grad[kStateLanes], next_coeff[kStateLanes];  // d_inputs and conj(coeffs) at the step after this one
  for (int k = 0; k < lanes; ++k) grad[k] = Acc(0), next_coeff[k] = Acc(0);
  // One step of every lane; prev_out(k) is the forward's output one step before it.
  auto step = [&](int64_t i, auto prev_out) {
    const T* __restrict__ dys = dy + at(kBwdDOutputs, i);
    const Tc* __restrict__ cs = c + at(kBwdCoeffs, i);
    T* __restrict__ dxs = dx + at(kBwdDInputs, i);
    Tc* __restrict__ dcs = dc + at(kBwdDCoeffs, i);
    const bool cut = is_cut(p, i);
    for (int k = 0; k < lanes; ++k) {
      const Acc coeff = cut ? Acc(0) : coeff_value<Acc>(cs[lane(kBwdCoeffs, k)]);
      grad[k] = next_coeff[k] * grad[k] + static_cast<Acc>(dys[lane(kBwdDOutputs, k)]);
      dxs[lane(kBwdDInputs, k)] = static_cast<T>(grad[k]);
      dcs[lane(kBwdDCoeffs, k)] = CoeffGrad<Tc, Acc>::of(cut ? Acc(0) : grad[k] * conj(prev_out(k)), coeff);
      next_coeff[k] = conj(coeff);
    }
  };
  for (int64_t i = p.seq_len - 1; i > 0; --i) {
    const T* __restrict__ prev = y + at(kBwdOutputs, i - 1);
    step(i, [&](int k) { return static_cast<Acc>(prev[lane(kBwdOutputs, k)]); });
  }
  if (p.seq_len > 0)  // before the first step, the initial state
    step(0, [&](int k) {
      return h0 ? static_cast<Acc>(h0[r.first[kBwdInitial] + k * r.lane_stride[kBwdInitial]]) : Acc(0);
    });
  for (int k = 0; k < lanes; ++k)
    dh0[r.first[kBwdDInitial] + k * r.lane_stride[kBwdDInitial]] = static_cast<T>(grad[k] * next_coeff[k]);
}

template <typename T, typename Tc>
void bwd(const BackwardParams& p) {
  for_each_run(p, kBwdHasSteps, [&]<int kLanes>(const SeqRun<kNumBwdSlots>& r) { bwd_run<T, Tc, kLanes>(p, r); });
}

template <typename T, typename Tc> struct Fwd { static void run(const ForwardParams& p) { fwd<T, Tc>(p); } };
template <typename T, typename Tc> struct Bwd { static void run(const BackwardParams& p) { bwd<T, Tc>(p); } };

}  // namespace

void cpu_fwd(const ForwardParams& p, Storage storage) { for_cpu_storage<Fwd>(storage, p); }
void cpu_bwd(const BackwardParams& p, Storage storage) { for_cpu_storage<Bwd>(storage, p); }

}  // namespace linrec

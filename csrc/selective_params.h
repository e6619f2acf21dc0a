// The plain parameter structs of the fused selective scan (Mamba's S6), between its ops
// (csrc/ops/selective_ops.cpp) and its kernels (CPU: csrc/cpu/selective_scan.cpp, CUDA:
// csrc/kernels/selective_scan.cuh). Torch-free, like params.h.
//
// For batch b, channel d, state n and step t of the scan (position l = t, or L-1-t in reverse):
//   dt[t]   = delta[l] + delta_bias[d], through softplus if delta_softplus
//   h[t, n] = exp(dt[t] * A[d, n]) * h[t-1, n] + dt[t] * B[n, l] * u[l]      h[-1] = initial
//   y[l]    = (sum_n C[n, l] * h[t, n] + D[d] * u[l]) * silu(z[l])
// B and C are either per channel, (dim, N), or per step, (batch, groups, N, L) with channel d
// in group d / (dim / groups).
#pragma once
#include <cstdint>

#include "params.h"

namespace linrec {

// The state a forward saves every kCheckpointSteps steps (at t = 0, 128, ...), in scan order:
// the backward rescans each span from it, so it keeps batch * dim * N * L / 128 floats, never
// the states themselves.
constexpr int64_t kCheckpointSteps = 128;

constexpr int64_t num_checkpoints(int64_t seq_len) { return (seq_len + kCheckpointSteps - 1) / kCheckpointSteps; }

// A (batch, dim, L) tensor's element strides, and B's or C's.
struct Strides3 {
  int64_t batch = 0, channel = 0, step = 0;
};
struct StridesBC {
  int64_t batch = 0, group = 0, state = 0, step = 0;
};

// The storage of one call: `values` is the dtype of u, delta, z, y and their gradients;
// `bc` that of per-step B and C (u's, or float32 beside 16-bit u). A, D, delta_bias, the
// states, per-channel B and C and their gradients are float32 (float64 for float64 u).
struct SelectiveStorage {
  DType values;
  DType bc;
};

struct SelectiveParams {
  int64_t batch = 0, dim = 0, states = 0, seq_len = 0;
  int64_t groups = 1;               // per-step B and C: channel groups; per channel: dim
  bool b_per_step = false, c_per_step = false;
  bool delta_softplus = false, reverse = false;
  const void* u = nullptr;
  const void* delta = nullptr;
  const void* z = nullptr;          // nullptr: no gate
  Strides3 u_strides, delta_strides, z_strides;
  const void* A = nullptr;          // (dim, N), contiguous
  const void* B = nullptr;
  const void* C = nullptr;
  StridesBC b_strides, c_strides;   // per channel: (0, N, 1, 0) over (batch, group = channel, state, step)
  const void* D = nullptr;          // (dim,) or nullptr
  const void* delta_bias = nullptr; // (dim,) or nullptr
  const void* initial = nullptr;    // last_state's shape, contiguous, or nullptr: zero
  // Packed sequences: (L,), nonzero at each position where a segment begins in scan order; the
  // decay exp(dt * A) reads as 0 there, so the state restarts, and its gradients are 0. Or nullptr.
  const uint8_t* cuts = nullptr;
  // With cuts, a state a segment (cu_seqlens given): the number of segments, and their bounds
  // [0, e1, ..., L] (segments + 1, on the tensors' device). initial and last_state are then
  // (batch, dim, segments, N): a segment's first step in scan order starts from its own initial
  // state (or 0), and its last step's state is its last state. On the CPU, where the bounds are
  // checked, also each position's segment, (L,); nullptr on other devices, whose kernels look
  // a position's segment up in the bounds.
  int64_t segments = 0;
  const int64_t* cu_seqlens = nullptr;
  const int64_t* segment_of = nullptr;
  void* y = nullptr;                // (batch, dim, L) contiguous
  void* last_state = nullptr;       // (batch, dim, N) contiguous; (batch, dim, segments, N) with segments
  void* checkpoints = nullptr;      // (batch, dim, num_checkpoints(L), N) contiguous
};

// The backward reads the forward's arguments and checkpoints, and d_y (and d_last_state).
// It writes d_u, d_delta, d_z (values dtype, contiguous) and d_initial, and adds into the
// zeroed float accumulators d_A (dim, N), d_D, d_delta_bias (dim,) and d_B, d_C: per step
// (batch, groups, N, L) contiguous, per channel (dim, N).
struct SelectiveGradParams : SelectiveParams {
  const void* d_y = nullptr;
  Strides3 d_y_strides;
  const void* d_last_state = nullptr;  // last_state's shape, contiguous, or nullptr: zero
  void* d_u = nullptr;
  void* d_delta = nullptr;
  void* d_z = nullptr;                 // nullptr where z is
  void* d_initial = nullptr;           // last_state's shape, contiguous
  void* d_A = nullptr;
  void* d_B = nullptr;
  void* d_C = nullptr;
  void* d_D = nullptr;                 // nullptr where D is
  void* d_delta_bias = nullptr;        // nullptr where delta_bias is
};

}  // namespace linrec

// The strided scan of dense few-channel data: one batch of D channel-last
// channels, (T, D) with rows of D elements and nothing between them, D small
// enough for lane groups (strided.cuh). A warp's S slices of E steps are then
// S x E consecutive rows, one contiguous range of memory.
//
// The staged lane-group kernel copies each thread's own V channels a step:
// with 4 bf16 channels a 4-byte copy, and a warp's copy of one step touches its
// 16 slices' rows, 128 bytes apart. Here the warp copies its whole range with
// 16-byte copies across its lanes instead, into shared memory laid out as
// S groups of E rows (one group a slice), each group padded so that the lanes
// of consecutive slices reading the same step hit different banks. The lanes
// then fold, look back and rescan from shared memory as in the staged kernel,
// write their results over the staged inputs, and the warp stores its range
// 16 bytes a lane. The backward reads its coefficients one scan step later
// and its forward outputs one step earlier: inside the range those are a
// neighbour's rows; the one row past each end is read from global memory.
//
// The host takes this kernel only when every tensor is dense with 16-byte
// aligned data and T * D * sizeof(T) is a multiple of 16, so that no 16-byte
// piece straddles the ends of the data in either direction (strided_launch.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "strided.cuh"

namespace linrec {

// One warp's S x E rows in shared memory, per tensor.
struct FlatSpan {
  int row_bytes;    // D * sizeof(T)
  int group_bytes;  // E rows: a multiple of 16, as E * sizeof(T) is
  int pitch;        // group_bytes plus the padding: a multiple of 16
  int groups;       // S, the warp's slices
  __host__ __device__ int warp_bytes() const { return groups * pitch; }
};

// The padding is the channel lanes' width (at least 16 bytes), so with rows of
// a whole number of 128-byte lines (D * E * sizeof(T)) consecutive slices'
// lanes read consecutive banks.
template <typename T, int E, int V>
__host__ __device__ __forceinline__ FlatSpan flat_span(int64_t num_seqs, int channel_lanes) {
  FlatSpan f;
  f.row_bytes = static_cast<int>(num_seqs * sizeof(T));
  f.group_bytes = E * f.row_bytes;
  const int lanes_bytes = channel_lanes * V * static_cast<int>(sizeof(T));
  f.pitch = f.group_bytes + (lanes_bytes > 16 ? lanes_bytes : 16);
  f.groups = kWarpSize / channel_lanes;
  return f;
}

template <bool kBackward>
constexpr int flat_tensors() {
  return kBackward ? 3 : 2;  // the staged inputs: values and coefficients, and the backward's outputs
}

// The most shared memory any D takes: S x E x D x sizeof(T) <= E x 32 x V x
// sizeof(T) a warp, plus S paddings of at most max(16 S, 32 V sizeof(T)) <= 512 bytes.
template <typename T, int E, int NT, int V, bool kBackward>
constexpr int flat_max_smem_bytes() {
  return flat_tensors<kBackward>() * (NT / kWarpSize) * (E * kWarpSize * V * static_cast<int>(sizeof(T)) + 512);
}

template <typename T, int E, int NT, int V, bool kBackward>
int flat_smem_bytes(int64_t num_seqs) {
  const FlatSpan f = flat_span<T, E, V>(num_seqs, strided_channel_lanes(num_seqs, V));
  return flat_tensors<kBackward>() * (NT / kWarpSize) * f.warp_bytes();
}

template <typename T, int E, int NT, int V, bool kBackward, typename Params>
__global__ void __launch_bounds__(NT) strided_flat_kernel(const Params p) {
  using Acc = acc_t<T>;
  using Thread = StridedThread<E, NT, V, kBackward, /*kLaneGroups=*/true>;
  using Staged = StagedChannels<T, V>;
  using Vec = ChannelVec<T, V>;
  __shared__ StridedStorage<Acc, V> st;
  extern __shared__ __align__(16) unsigned char staged[];
  wait_for_prior_grid();
  const Thread t = strided_thread<E, NT, V, kBackward, true>(p);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const FlatSpan f = flat_span<T, E, V>(p.num_seqs, t.channel_lanes);
  const int slice = lane / t.channel_lanes;          // the thread's slice within its warp
  const int64_t warp_q = t.first_q - slice * E;      // the warp's first scan step
  const int64_t span_steps = static_cast<int64_t>(f.groups) * E;
  const int64_t lo = t.rev ? t.len - warp_q - span_steps : warp_q;  // the warp's first row in memory
  const int64_t data_bytes = t.len * f.row_bytes;
  const int pieces_per_group = f.group_bytes / 16;
  const int pieces = f.groups * pieces_per_group;
  auto region = [&](int s) { return staged + (s * Thread::W + warp) * f.warp_bytes(); };
  // Where scan step i of slice k lies in a region, at the thread's channels.
  const int lane_bytes = t.channel_lane * V * static_cast<int>(sizeof(T));
  auto at = [&](int s, int k, int i) {
    const int off = t.rev ? (f.groups - 1 - k) * f.pitch + (E - 1 - i) * f.row_bytes : k * f.pitch + i * f.row_bytes;
    return reinterpret_cast<Vec*>(region(s) + off + lane_bytes);
  };
  // The warp's 16-byte pieces of a tensor: piece j of the range, its place in
  // shared memory and its byte offset from row 0 (outside [0, data_bytes): no such rows).
  auto piece = [&](int j, int& smem_off, int64_t& gmem_off) {
    const int g = j / pieces_per_group, w = j % pieces_per_group;
    smem_off = g * f.pitch + w * 16;
    gmem_off = (lo + static_cast<int64_t>(g) * E) * f.row_bytes + w * 16;
  };
  auto copy_in = [&](int s, const void* data) {
    for (int j = lane; j < pieces; j += kWarpSize) {
      int so;
      int64_t go;
      piece(j, so, go);
      if (go >= 0 && go < data_bytes) cp_async<16>(region(s) + so, static_cast<const unsigned char*>(data) + go);
    }
  };
  auto copy_out = [&](void* data, int s) {
    for (int j = lane; j < pieces; j += kWarpSize) {
      int so;
      int64_t go;
      piece(j, so, go);
      if (go >= 0 && go < data_bytes) {
        const uint4 word = *reinterpret_cast<const uint4*>(region(s) + so);
        *reinterpret_cast<uint4*>(static_cast<unsigned char*>(data) + go) = word;
      }
    }
  };
  const auto& es = p.index.elem_strides;
  const T* c_ptr = static_cast<const T*>(p.coeffs) + t.off[0][Thread::kC];

  // Step 1: stage, then fold. The backward's coefficient at scan step q is at
  // q - 1: the previous row of the slice, the last of the slice before, or for
  // the warp's first step the row before its range (none before the first).
  if constexpr (kBackward) copy_in(0, p.d_outputs);
  else copy_in(0, p.inputs);
  copy_in(1, p.coeffs);
  cp_async_commit();
  Acc coeff_before[V], output_after[V];  // the backward's rows outside the range
#pragma unroll
  for (int j = 0; j < V; ++j) coeff_before[j] = Acc(1), output_after[j] = Acc(0);
  if constexpr (kBackward) {
    copy_in(2, p.outputs);
    cp_async_commit();
    if (t.active && slice == 0 && warp_q >= 1 && warp_q - 1 < t.len)
      load_channels<V>(coeff_before, c_ptr + t.pos(warp_q - 1) * es[Thread::kC]);
    const int64_t q_after = warp_q + span_steps;
    if (t.active && slice == f.groups - 1 && q_after < t.len)
      load_channels<V>(output_after, static_cast<const T*>(p.outputs) + t.off[0][kBwdOutputs] +
                                         t.pos(q_after) * es[kBwdOutputs]);
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncwarp();
  auto read_coeff = [&](int i, Acc(&a)[V]) {
    if constexpr (!kBackward) Staged::read(a, at(1, slice, i));
    else if (i > 0) Staged::read(a, at(1, slice, i - 1));
    else if (slice > 0) Staged::read(a, at(1, slice - 1, E - 1));
    else {
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = coeff_before[j];
    }
  };
  // The slice's steps inside the sequence (none for a slice past its end).
  const int64_t remaining = t.len - t.first_q;
  const int steps = !t.active || remaining <= 0 ? 0 : remaining < E ? static_cast<int>(remaining) : E;
  Acc slice_y[V], slice_c[V];
#pragma unroll
  for (int j = 0; j < V; ++j) slice_y[j] = Acc(0), slice_c[j] = Acc(1);
  // Step i's coefficients and values, from shared memory.
  auto read_step = [&](int i, Acc(&a)[V], Acc(&v)[V]) {
    Staged::read(v, at(0, slice, i));
    read_coeff(i, a);
  };
#pragma unroll 4
  for (int i = 0; i < steps; ++i) {
    Acc v[V], a[V];
    read_step(i, a, v);
    fold_step(slice_y, slice_c, a, v);
  }

  // Step 2.
  Acc initial[V], state[V];
  resolve_chunk<T>(st, p, t, slice_y, slice_c, initial, state);

  // Step 3: rescan, each result written over its own staged value, then the
  // warp stores its range.
#pragma unroll 4
  for (int i = 0; i < steps; ++i) {
    Acc v[V], a[V];
    read_step(i, a, v);
    scan_step(state, a, v);
    store_channels<V>(reinterpret_cast<T*>(at(0, slice, i)), state);
  }
  if constexpr (!kBackward) {
    __syncwarp();
    copy_out(p.outputs, 0);
  } else {
    // d_initial = the last step's d_inputs * the first coefficient.
    if (steps > 0 && t.first_q + steps == t.len) {
      Acc first_coeff[V];
      load_channels<V>(first_coeff, c_ptr + t.pos(t.len - 1) * es[Thread::kC]);
#pragma unroll
      for (int j = 0; j < V; ++j)
        static_cast<T*>(p.d_initial)[t.off[j][kBwdDInitial]] = from_acc<T>(state[j] * first_coeff[j]);
    }
    // d_coeffs = d_inputs * the forward's previous output (scan step q + 1;
    // before the forward's first, the initial state), written over the
    // coefficients once every lane has read them.
    cp_async_wait<0>();
    __syncwarp();
#pragma unroll 4
    for (int i = 0; i < steps; ++i) {
      Acc dx[V], y_prev[V];
      Staged::read(dx, at(0, slice, i));
      if (t.first_q + i == t.len - 1) {
#pragma unroll
        for (int j = 0; j < V; ++j) y_prev[j] = initial[j];
      } else if (i + 1 < E) {
        Staged::read(y_prev, at(2, slice, i + 1));
      } else if (slice + 1 < f.groups) {
        Staged::read(y_prev, at(2, slice + 1, 0));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) y_prev[j] = output_after[j];
      }
#pragma unroll
      for (int j = 0; j < V; ++j) y_prev[j] *= dx[j];
      store_channels<V>(reinterpret_cast<T*>(at(1, slice, i)), y_prev);
    }
    __syncwarp();
    copy_out(p.d_inputs, 0);
    copy_out(p.d_coeffs, 1);
  }
}

}  // namespace linrec

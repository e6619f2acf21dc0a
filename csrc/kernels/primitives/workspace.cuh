// Clearing the look-back workspace (lookback.cuh) of the chained and strided kernels.
//
// The statuses must read kNotReady when the scan starts.
// A zero fill from torch would be a node of its own in the stream, with the full
// gap of a kernel launch before the scan. Cleared here instead, as a programmatic
// dependent launch (grid_launch.cuh), the clear kernel lets the scan launch at
// once: the scan's blocks start while the clear runs, and wait for its completion
// (and its stores) in wait_for_prior_grid before their first access.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "grid_launch.cuh"

namespace linrec {

// Workspace sizes are whole 16-byte words (see cuda_workspace_bytes).
constexpr int64_t kWorkspaceWordBytes = 16;

__global__ void __launch_bounds__(256) clear_workspace_kernel(uint4* words, int64_t num_words) {
  // Before the wait: the scan after this kernel may launch now (it waits for this one to end).
  allow_dependents_to_launch();
  // The allocator may hand out memory that the kernel before this one still reads.
  wait_for_prior_grid();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < num_words; i += stride)
    words[i] = make_uint4(0, 0, 0, 0);
}

// Zeroes `bytes` (a multiple of kWorkspaceWordBytes) at `workspace` on `stream`.
inline void clear_workspace(void* workspace, int64_t bytes, cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 1024;  // a grid-stride loop past this: workspaces are small
  const int64_t num_words = bytes / kWorkspaceWordBytes;
  if (num_words == 0) return;
  const int64_t blocks = std::min((num_words + kThreads - 1) / kThreads, kMaxBlocks);
  launch_kernel<clear_workspace_kernel>(dim3(static_cast<unsigned>(blocks)), kThreads, 0, stream,
                                        static_cast<uint4*>(workspace), num_words);
  check_launch("linrec_clear_workspace");
}

}  // namespace linrec

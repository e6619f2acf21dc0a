// Kernel launches, with programmatic dependent launch where the device has it.
//
// A kernel that lasts a few µs pays, on top of its own work, for its launch: the
// blocks of a kernel start only once every block of the kernel before it in the
// stream has ended and its writes are flushed. From Hopper (sm_90) on, a launch
// can instead let the kernel start as soon as the kernel before it has ended its
// last blocks (the programmatic stream serialization attribute); the kernel then
// runs its prologue (arguments, indices) and waits, with `wait_for_prior_grid`,
// for the earlier grid's completion and memory before its first global access.
// Every linrec kernel calls `wait_for_prior_grid` before it reads or writes global
// memory. The workspace clear (workspace.cuh) lets its dependent, the scan that
// uses the workspace, start early, and so do the chained scans (chained.cuh),
// once their last wave is resident; the kernel after any other scan starts when
// it ends. A dependent launched with the attribute must wait before it touches
// memory, as every linrec kernel does; a kernel launched without it is unaffected.
//
// The attribute is set only when the kernel as loaded on the device was compiled
// for sm_90 or later (cudaFuncAttributes::ptxVersion): a kernel built for an older
// architecture and run on a newer device through its PTX has no wait in it.
// LINREC_PDL=0 in the environment turns dependent launches off.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace linrec {

// Waits for the grids this one depends on to complete and their writes to be visible.
// A no-op where the kernel was not launched as a dependent, and below sm_90.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the grids launched after this one as dependents start before it ends (they still
// wait for its completion in wait_for_prior_grid). A no-op below sm_90.
__device__ __forceinline__ void allow_dependents_to_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The attributes of `kernel` as loaded on the current device (registers, local
// and shared memory); throws if the query fails.
template <typename Kernel>
cudaFuncAttributes kernel_attributes(Kernel kernel) {
  cudaFuncAttributes attrs{};
  const cudaError_t err = cudaFuncGetAttributes(&attrs, kernel);
  if (err != cudaSuccess) throw std::runtime_error(std::string("linrec: cudaFuncGetAttributes: ") + cudaGetErrorString(err));
  return attrs;
}

inline void check_launch(const char* name) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("linrec: ") + name + " failed: " + cudaGetErrorString(err));
}

namespace detail {
constexpr int kMaxDevices = 64;

// LINREC_PDL=0 in the environment turns dependent launches off (A/B timing, debugging).
inline bool dependent_launch_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("LINREC_PDL");
    return v == nullptr || v[0] != '0';
  }();
  return enabled;
}

// Whether `kernel`, as loaded on `device`, waits for its prior grid (compiled for sm_90+).
// Queried once per kernel and device; a failed query answers no and clears its error.
template <auto kKernel>
bool waits_for_prior_grid(int device) {
  static std::atomic<signed char> known[kMaxDevices] = {};  // 0 unknown, 1 yes, -1 no
  if (device < 0 || device >= kMaxDevices) return false;
  signed char state = known[device].load(std::memory_order_relaxed);
  if (state == 0) {
    cudaFuncAttributes attrs{};
    const bool ok = cudaFuncGetAttributes(&attrs, kKernel) == cudaSuccess;
    if (!ok) cudaGetLastError();
    state = ok && attrs.ptxVersion >= 90 ? 1 : -1;
    known[device].store(state, std::memory_order_relaxed);
  }
  return state > 0;
}
}  // namespace detail

// kKernel<<<grid, threads, smem, stream>>>(args...), as a programmatic dependent
// launch where the kernel supports it (see above). Errors are left for check_launch.
template <auto kKernel, typename... Args>
void launch_kernel(dim3 grid, unsigned threads, int smem, cudaStream_t stream, const Args&... args) {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) cudaGetLastError();
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = detail::dependent_launch_enabled() && detail::waits_for_prior_grid<kKernel>(device) ? 1 : 0;
  cudaLaunchKernelEx(&config, kKernel, args...);
}

}  // namespace linrec

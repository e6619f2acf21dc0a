// CUDA entry points: runtime dtype and kernel kind -> the templates that
// implement them. Their instantiations come from kernels/instances/.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <stdexcept>

#include "chained.cuh"
#include "launch.h"
#include "packed.cuh"
#include "ref.cuh"
#include "strided_launch.cuh"
#include "tiled.cuh"
#include "workspace.cuh"

namespace linrec {

// Declared here, instantiated in kernels/instances/*.cu.
#define LINREC_DECLARE_LAUNCH(LAUNCH, ...)                                                                     \
  extern template void LAUNCH<__VA_ARGS__, false, ForwardParams>(const ForwardParams&, const TileConfig&,      \
                                                                 cudaStream_t);                                \
  extern template void LAUNCH<__VA_ARGS__, true, BackwardParams>(const BackwardParams&, const TileConfig&,     \
                                                                 cudaStream_t);
// tiled_func_attrs and packed_func_attrs also report the aligned-rows kernels (KernelVariant).
#define LINREC_DECLARE_SCHEDULE(T, S)                                                                 \
  LINREC_DECLARE_LAUNCH(launch_tiled, T, S)                                                           \
  extern template cudaFuncAttributes tiled_func_attrs<T, S, false>(const TileConfig&, KernelVariant); \
  extern template cudaFuncAttributes tiled_func_attrs<T, S, true>(const TileConfig&, KernelVariant);
#define LINREC_DECLARE_TILED(T)                   \
  LINREC_DECLARE_SCHEDULE(T, Schedule::kOneTile)  \
  LINREC_DECLARE_SCHEDULE(T, Schedule::kPipe)
// A kernel family whose launch and attribute templates take <T, kBackward>.
#define LINREC_DECLARE_FAMILY(T, LAUNCH, ATTRS)                          \
  LINREC_DECLARE_LAUNCH(LAUNCH, T)                                       \
  extern template cudaFuncAttributes ATTRS<T, false>(const TileConfig&); \
  extern template cudaFuncAttributes ATTRS<T, true>(const TileConfig&);
#define LINREC_DECLARE_PACKED(T)                                                                     \
  LINREC_DECLARE_LAUNCH(launch_packed, T)                                                            \
  extern template cudaFuncAttributes packed_func_attrs<T, false>(const TileConfig&, KernelVariant); \
  extern template cudaFuncAttributes packed_func_attrs<T, true>(const TileConfig&, KernelVariant);
#define LINREC_DECLARE_ALL(T)                                  \
  LINREC_DECLARE_TILED(T)                                      \
  LINREC_DECLARE_FAMILY(T, launch_chained, chained_func_attrs) \
  LINREC_DECLARE_FAMILY(T, launch_strided, strided_func_attrs) \
  LINREC_DECLARE_PACKED(T)
LINREC_DECLARE_ALL(float)
LINREC_DECLARE_ALL(double)
LINREC_DECLARE_ALL(__half)
LINREC_DECLARE_ALL(__nv_bfloat16)
// Mixed storage: 16-bit values beside float32 coefficients (dtype.cuh).
LINREC_DECLARE_ALL(MixedHalf)
LINREC_DECLARE_ALL(MixedBFloat16)
// Complex storage: every family but pipe (and the ref kernels, instantiated here); the chained
// kernels at their staged configs, the tile kernel at its vector ones (dispatch.h).
#define LINREC_DECLARE_COMPLEX(T)                              \
  LINREC_DECLARE_SCHEDULE(T, Schedule::kOneTile)               \
  LINREC_DECLARE_FAMILY(T, launch_chained, chained_func_attrs) \
  LINREC_DECLARE_FAMILY(T, launch_strided, strided_func_attrs) \
  LINREC_DECLARE_PACKED(T)
LINREC_DECLARE_COMPLEX(ComplexFloat)
LINREC_DECLARE_COMPLEX(ComplexDouble)

namespace {

template <typename Fn>
void by_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn.template operator()<float>();
    case DType::kFloat64: return fn.template operator()<double>();
    case DType::kFloat16: return fn.template operator()<__half>();
    case DType::kBFloat16: return fn.template operator()<__nv_bfloat16>();
    case DType::kComplex64: return fn.template operator()<ComplexFloat>();
    case DType::kComplex128: return fn.template operator()<ComplexDouble>();
  }
}

// Calls fn.template operator()<S>() for the kernels' storage parameter S of a call.
template <typename Fn>
void by_storage(Storage storage, Fn&& fn) {
  if (!storage.mixed()) return by_dtype(storage.values, fn);
  if (storage.coeffs == DType::kFloat32 && storage.values == DType::kFloat16)
    return fn.template operator()<MixedHalf>();
  if (storage.coeffs == DType::kFloat32 && storage.values == DType::kBFloat16)
    return fn.template operator()<MixedBFloat16>();
  throw std::invalid_argument("linrec: coefficients of another dtype than the inputs' are float32 beside "
                              "float16 or bfloat16 inputs only");
}

template <typename T, bool kBackward, typename Params>
void launch_ref(const Params& p, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((p.num_seqs + kRefThreadsPerBlock - 1) / kRefThreadsPerBlock);
  if constexpr (kBackward) launch_kernel<ref_bwd_kernel<T>>(blocks, kRefThreadsPerBlock, 0, stream, p);
  else launch_kernel<ref_fwd_kernel<T>>(blocks, kRefThreadsPerBlock, 0, stream, p);
  check_launch(kBackward ? "linrec_ref_bwd" : "linrec_ref_fwd");
}

template <bool kBackward, typename Params>
void launch(const Params& p, Storage storage, KernelKind kind, const TileConfig& config, cudaStream_t stream) {
  if (p.chain_workspace != nullptr)
    clear_workspace(p.chain_workspace, cuda_workspace_bytes(storage, kind, p.num_seqs, p.seq_len, config), stream);
  by_storage(storage, [&]<typename T>() {
    if (kind == KernelKind::kRef) return launch_ref<T, kBackward>(p, stream);
    if (kind == KernelKind::kChained) return launch_chained<T, kBackward>(p, config, stream);
    if (kind == KernelKind::kStrided) return launch_strided<T, kBackward>(p, config, stream);
    if (kind == KernelKind::kTile) return launch_tiled<T, Schedule::kOneTile, kBackward>(p, config, stream);
    if (kind == KernelKind::kPacked) return launch_packed<T, kBackward>(p, config, stream);
    if constexpr (!kIsComplex<T>) {  // the pipe kernel is not compiled for complex storage
      if (kind == KernelKind::kPipe) return launch_tiled<T, Schedule::kPipe, kBackward>(p, config, stream);
    }
    throw std::invalid_argument("linrec: no kernel chosen");
  });
}

template <typename T, Schedule S>
cudaFuncAttributes attrs_of(bool backward, KernelVariant variant, const TileConfig& config) {
  return backward ? tiled_func_attrs<T, S, true>(config, variant) : tiled_func_attrs<T, S, false>(config, variant);
}

}  // namespace

int64_t cuda_workspace_bytes(Storage storage, KernelKind kind, int64_t num_seqs, int64_t seq_len,
                             const TileConfig& config) {
  int64_t bytes = 0;
  by_storage(storage, [&]<typename T>() {
    if (kind == KernelKind::kChained) bytes = chained_workspace_bytes<T>(num_seqs, seq_len, config);
    if (kind == KernelKind::kStrided) bytes = strided_workspace_bytes<T>(num_seqs, seq_len, config);
  });
  return (bytes + kWorkspaceWordBytes - 1) / kWorkspaceWordBytes * kWorkspaceWordBytes;
}

namespace {
// A device attribute, read once per device and kept: one query of the memory
// clock took 361-514 µs (H100, driver 580, CUDA 13; the SM count about 1 µs),
// and every chained launch of more than one wave needs it. 0, and not cached,
// if the query fails.
template <cudaDeviceAttr kAttr>
int device_attribute(int device) {
  static std::atomic<int> cache[detail::kMaxDevices] = {};
  const bool cacheable = device >= 0 && device < detail::kMaxDevices;
  if (cacheable) {
    if (const int known = cache[device].load(std::memory_order_relaxed)) return known;
  }
  int value = 0;
  if (cudaDeviceGetAttribute(&value, kAttr, device) != cudaSuccess) {
    cudaGetLastError();  // a failed query is answered with 0, not left for the next launch check to report
    return 0;
  }
  if (cacheable) cache[device].store(value, std::memory_order_relaxed);
  return value;
}
}  // namespace

int cuda_sm_count(int device) { return device_attribute<cudaDevAttrMultiProcessorCount>(device); }

double cuda_dram_bytes_per_ns(int device) {
  const int clock_khz = device_attribute<cudaDevAttrMemoryClockRate>(device);
  const int bus_bits = device_attribute<cudaDevAttrGlobalMemoryBusWidth>(device);
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8) * 1e-9;  // double data rate; 0 if either query failed
}

void cuda_fwd(const ForwardParams& p, Storage storage, KernelKind kind, const TileConfig& config, void* stream) {
  launch<false>(p, storage, kind, config, static_cast<cudaStream_t>(stream));
}

void cuda_bwd(const BackwardParams& p, Storage storage, KernelKind kind, const TileConfig& config, void* stream) {
  launch<true>(p, storage, kind, config, static_cast<cudaStream_t>(stream));
}

FuncAttrs cuda_func_attrs(DType dtype, KernelKind kind, bool backward, KernelVariant variant,
                          const TileConfig& config) {
  if (variant != KernelVariant::kGeneral && kind != KernelKind::kTile && kind != KernelKind::kPacked)
    throw std::invalid_argument("linrec: only the tile and packed kernels have aligned-rows variants");
  cudaFuncAttributes a{};
  by_dtype(dtype, [&]<typename T>() {
    if (kind == KernelKind::kRef) {
      a = backward ? kernel_attributes(ref_bwd_kernel<T>) : kernel_attributes(ref_fwd_kernel<T>);
      return;
    }
    if (kind == KernelKind::kStrided) {
      a = backward ? strided_func_attrs<T, true>(config) : strided_func_attrs<T, false>(config);
      return;
    }
    if (kind == KernelKind::kChained) {
      a = backward ? chained_func_attrs<T, true>(config) : chained_func_attrs<T, false>(config);
      return;
    }
    if (kind == KernelKind::kTile) {
      a = attrs_of<T, Schedule::kOneTile>(backward, variant, config);
      return;
    }
    if (kind == KernelKind::kPacked) {
      a = backward ? packed_func_attrs<T, true>(config, variant) : packed_func_attrs<T, false>(config, variant);
      return;
    }
    if constexpr (!kIsComplex<T>) {  // the pipe kernel is not compiled for complex storage
      if (kind == KernelKind::kPipe) {
        a = attrs_of<T, Schedule::kPipe>(backward, variant, config);
        return;
      }
    }
    throw std::invalid_argument("linrec: func_attrs needs a kernel kind compiled for this dtype");
  });
  return {a.numRegs, static_cast<int>(a.localSizeBytes), static_cast<int>(a.sharedSizeBytes), a.maxThreadsPerBlock};
}

}  // namespace linrec

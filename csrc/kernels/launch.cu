// CUDA entry points: a call's runtime storage and kernel kind -> the family
// templates that implement them (instances/families.h, generated from
// csrc/registry.toml; their instantiations are the files in instances/).
#include <cuda_runtime.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "instances/families.h"
#include "launch.h"
#include "primitives/cut_bits.cuh"
#include "primitives/workspace.cuh"

namespace linrec {

namespace {

// Calls fn.template operator()<K, S>() for family `kind` at storage `storage`, if compiled.
template <typename Fn>
void for_compiled(Storage storage, KernelKind kind, Fn&& fn) {
  for_storage(storage, [&]<typename S>() {
    for_family(kind, [&]<KernelKind K>() {
      if constexpr (kCompiled<K, S>) fn.template operator()<K, S>();
      else throw std::invalid_argument(std::string("linrec: the ") + Family<K>::kName +
                                       " kernels are not compiled for these dtypes (csrc/registry.toml)");
    });
  });
}

template <bool kBackward>
void launch(const ParamsOf<kBackward>& p, Storage storage, KernelKind kind, const TileConfig& config,
            int64_t workspace_bytes, cudaStream_t stream) {
  if (p.chain_workspace != nullptr) clear_workspace(p.chain_workspace, workspace_bytes, stream);
  if (p.cut_bits != nullptr) pack_cut_bits(p.cuts, p.cut_bits, p.seq_len, stream);
  for_compiled(storage, kind, [&]<KernelKind K, typename S>() {
    Family<K>::template launch<S, kBackward>(p, config, stream);
  });
}

}  // namespace

int64_t cuda_workspace_bytes(Storage storage, KernelKind kind, int64_t num_seqs, int64_t seq_len,
                             const TileConfig& config) {
  int64_t bytes = 0;
  for_compiled(storage, kind, [&]<KernelKind K, typename S>() {
    bytes = Family<K>::template workspace_bytes<S>(num_seqs, seq_len, config);
  });
  return (bytes + kWorkspaceWordBytes - 1) / kWorkspaceWordBytes * kWorkspaceWordBytes;
}

bool cuda_compiled(Storage storage, KernelKind kind) {
  if (kind == KernelKind::kAuto || !is_registered_storage(storage)) return false;
  bool compiled = false;
  for_storage(storage, [&]<typename S>() {
    for_family(kind, [&]<KernelKind K>() { compiled = kCompiled<K, S>; });
  });
  return compiled;
}

std::vector<TileConfig> cuda_compiled_configs(Storage storage, KernelKind kind) {
  std::vector<TileConfig> out;
  if (!cuda_compiled(storage, kind)) return out;
  for_compiled(storage, kind, [&]<KernelKind K, typename S>() {
    for (const TileConfig& c : Family<K>::template configs<S>()) out.push_back(c);
  });
  return out;
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

void cuda_fwd(const ForwardParams& p, Storage storage, KernelKind kind, const TileConfig& config,
              int64_t workspace_bytes, void* stream) {
  launch<false>(p, storage, kind, config, workspace_bytes, static_cast<cudaStream_t>(stream));
}

void cuda_bwd(const BackwardParams& p, Storage storage, KernelKind kind, const TileConfig& config,
              int64_t workspace_bytes, void* stream) {
  launch<true>(p, storage, kind, config, workspace_bytes, static_cast<cudaStream_t>(stream));
}

std::optional<FuncAttrs> cuda_func_attrs(Storage storage, KernelKind kind, bool backward, KernelVariant variant,
                                         const TileConfig& config) {
  std::optional<cudaFuncAttributes> a;
  for_compiled(storage, kind, [&]<KernelKind K, typename S>() {
    a = backward ? Family<K>::template attributes<S, true>(config, variant)
                 : Family<K>::template attributes<S, false>(config, variant);
  });
  if (!a) return std::nullopt;
  return FuncAttrs{a->numRegs, static_cast<int>(a->localSizeBytes), static_cast<int>(a->sharedSizeBytes),
                   a->maxThreadsPerBlock};
}

}  // namespace linrec

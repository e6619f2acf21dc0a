// Tuning tables, one per device, read on every auto-dispatched CUDA call.
#include "kernel_choice.h"

#include <atomic>
#include <stdexcept>
#include <string>
#include <utility>

namespace linrec {
namespace {

constexpr int kMaxDevices = 64;

// Slot 0: the default table; slot d + 1: device d's. A replaced table is kept (never
// freed): tables are set once a device, and readers take no lock.
std::atomic<const std::vector<TuningRow>*> tables[kMaxDevices + 1] = {};

StorageClass storage_class(Storage s) {
  switch (s.values) {
    case DType::kFloat16:
    case DType::kBFloat16: return StorageClass::k16Bit;
    case DType::kFloat32: return StorageClass::k32Bit;
    case DType::kFloat64: return StorageClass::k64Bit;
    case DType::kComplex64: return StorageClass::kComplex64;
    case DType::kComplex128: return StorageClass::kComplex128;
  }
  throw std::invalid_argument("linrec: no tuning for this dtype");
}

bool matches(const TuningRow& r, uint32_t storage_bit, int64_t seq_len, int64_t num_seqs, bool interleaved,
             bool backward, int sm_count) {
  if (!(r.storages & storage_bit) || r.interleaved != interleaved) return false;
  if (r.direction != Direction::kAny && (r.direction == Direction::kBackward) != backward) return false;
  if (seq_len < r.min_len || (r.max_len >= 0 && seq_len > r.max_len)) return false;
  if (r.max_seqs_per_sm > 0 && num_seqs >= r.max_seqs_per_sm * sm_count) return false;
  return r.min_tiles <= 0 || seq_len >= r.min_tiles * r.config.tile_len();
}

}  // namespace

void set_tuning_table(int device, std::vector<TuningRow> rows) {
  if (device >= kMaxDevices) throw std::invalid_argument("linrec: device index out of range for tuning tables");
  tables[device < 0 ? 0 : device + 1].store(new std::vector<TuningRow>(std::move(rows)));
}

KernelChoice choose_kernel(Storage storage, int64_t seq_len, int64_t num_seqs, bool interleaved, bool backward,
                           int device, int sm_count) {
  const std::vector<TuningRow>* table = nullptr;
  if (device >= 0 && device < kMaxDevices) table = tables[device + 1].load(std::memory_order_acquire);
  if (table == nullptr) table = tables[0].load(std::memory_order_acquire);
  if (table == nullptr)
    throw std::runtime_error("linrec: no tuning table is loaded (it loads with `import linrec`)");
  const uint32_t bit = 1u << static_cast<int>(storage_class(storage));
  for (const TuningRow& r : *table) {
    if (matches(r, bit, seq_len, num_seqs, interleaved, backward, sm_count)) return {r.kind, r.config};
  }
  throw std::runtime_error("linrec: the tuning table has no row for this call (seq_len " + std::to_string(seq_len) +
                           ", " + std::to_string(num_seqs) + " sequences)");
}

}  // namespace linrec

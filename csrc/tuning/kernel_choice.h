// The tuned choice of a kernel for a call's shape (the op's kernel 0, "auto").
//
// The rule is data: rows of a tuning table that Python loads from the package's
// per-device JSON files (python/linrec/tuning/) and hands over once per device.
// The first row whose conditions hold gives the family and its config. Host code
// only: changing a table recompiles nothing.
#pragma once
#include <cstdint>
#include <vector>

#include "../config.h"
#include "../params.h"

namespace linrec {

// Storage classes a row applies to, as bits of TuningRow::storages. Mixed storage
// takes its values' class (16-bit).
enum class StorageClass : int { k16Bit = 0, k32Bit = 1, k64Bit = 2, kComplex64 = 3, kComplex128 = 4 };
enum class Direction : int { kAny = 0, kForward = 1, kBackward = 2 };

struct TuningRow {
  uint32_t storages;          // bit (1 << StorageClass)
  Direction direction;
  bool interleaved;           // channel-last layout: sequences nearer each other than their own elements
  int64_t min_len, max_len;   // inclusive; max_len < 0: unbounded
  int64_t max_seqs_per_sm;    // > 0: only for fewer sequences than this times the SM count
  int64_t min_tiles;          // > 0: only for sequences of at least this many of the config's tiles
  KernelKind kind;
  TileConfig config;
};

struct KernelChoice {
  KernelKind kind;
  TileConfig config;
};

// Sets the table of a device (device < 0: the default, for devices with none of their own).
void set_tuning_table(int device, std::vector<TuningRow> rows);

// The first matching row of the device's table; throws if no table or row matches.
KernelChoice choose_kernel(Storage storage, int64_t seq_len, int64_t num_seqs, bool interleaved, bool backward,
                           int device, int sm_count);

}  // namespace linrec

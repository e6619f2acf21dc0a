// Plain parameter structs between the torch-facing op (ops.cpp) and the kernels.
// Kernels never see torch types: everything they need is in these structs.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define LINREC_HD __host__ __device__ __forceinline__
#define LINREC_UNROLL _Pragma("unroll")
#else
#define LINREC_HD inline
#define LINREC_UNROLL
#endif

namespace linrec {

// 32-bit words of cut bits (ForwardParams::cut_bits) for `len` steps: whole 64-bit words, which
// the kernels may read. The op allocates them; the launch packs them (kernels/primitives/cut_bits.cuh).
constexpr int64_t cut_bit_words(int64_t len) { return (len + 63) / 64 * 2; }

// Sequence dimensions left after merging adjacent dims whose strides allow it.
// More than this after merging is an exotic layout: the op copies it instead.
constexpr int kMaxSeqDims = 6;

// Maps a sequence number n in [0, num_seqs) to an element offset in each of
// kTensors tensors that share one shape but may have different strides
// (broadcast tensors have stride 0). The scan dim is not among `sizes`: the
// element l of sequence n of tensor t is at offset(n)[t] + l * elem_strides[t].
template <int kTensors>
struct SeqIndexer {
  int num_dims = 0;
  int64_t sizes[kMaxSeqDims] = {};
  int64_t seq_strides[kTensors][kMaxSeqDims] = {};
  int64_t elem_strides[kTensors] = {};

  // kOneDimFastPath: sequences along one dim (or none: a single sequence, n = 0)
  // are the common case and need no division, which short-sequence kernels wait
  // on before their first load (H100, 13200 x 16 fp32: 3.3 -> 2.7 us forward).
  // The strided kernels leave it out: there the branch measured slower
  // (channel-last bf16 forward+backward 0.49 -> 0.45 of copy).
  template <bool kOneDimFastPath = true>
  LINREC_HD void offsets(int64_t n, int64_t (&out)[kTensors]) const {
    if (kOneDimFastPath && num_dims <= 1) {
LINREC_UNROLL
      for (int t = 0; t < kTensors; ++t) out[t] = n * seq_strides[t][0];
      return;
    }
LINREC_UNROLL
    for (int t = 0; t < kTensors; ++t) out[t] = 0;
LINREC_UNROLL
    for (int k = kMaxSeqDims - 1; k >= 0; --k) {
      if (k < num_dims) {
        const int64_t i = n % sizes[k];
        n /= sizes[k];
LINREC_UNROLL
        for (int t = 0; t < kTensors; ++t) out[t] += i * seq_strides[t][k];
      }
    }
  }
};

// Tensor slots of the forward: y[l] = c[l] * y[l-1] + x[l], y[-1] = initial.
enum FwdSlot : int { kFwdInputs, kFwdCoeffs, kFwdOutputs, kFwdInitial, kNumFwdSlots };

// Tensor slots of the fused backward.
enum BwdSlot : int {
  kBwdDOutputs, kBwdCoeffs, kBwdOutputs, kBwdInitial,  // read
  kBwdDInputs, kBwdDCoeffs, kBwdDInitial,              // written
  kNumBwdSlots
};

// The aligned-rows fast path (kernels/primitives/rows.cuh), taken by the packed kernels and
// the one-tile forward: every tensor holds its sequences as rows of whole,
// aligned vectors. Small on purpose: a kernel of a few µs waits on each
// constant-cache line of its arguments before its first load.
template <int kTensors>
struct AlignedRows {
  void* data[kTensors] = {};          // by FwdSlot / BwdSlot; the initial state's may be null
  int64_t row_stride[kTensors] = {};  // elements from one sequence to the next
  int64_t num_seqs = 0;
  int64_t seq_len = 0;                // a multiple of the kernel's elements per thread
  int width_shift = 0;                // packed kernels: 2^width_shift lanes a sequence
};

// How a chained launch schedules its tiles. In the first wave (see wait_for_turn
// in lookback.cuh), tile n starts loading no sooner than n * pace_ps
// picoseconds after its block starts, and tiles numbered from `lead` up to
// `first_wave` only once the tile `lead` numbers before them has published its
// aggregate. first_wave = 0 (the launch's tiles fit in one wave): no waiting.
// Once its own inputs have landed, a forward tile asks L2 to prefetch those of
// the tile `prefetch_ahead` numbers after it (0: none; see prefetch_later_tile).
// Tiles are numbered across the sequences if `interleaved`, else sequence by
// sequence (TileNumbering in chained.cuh).
struct ChainSchedule {
  int64_t lead = 0;
  int64_t first_wave = 0;
  int64_t pace_ps = 0;
  int64_t prefetch_ahead = 0;
  bool interleaved = false;
  constexpr bool many_waves() const { return first_wave > 0; }
};

struct ForwardParams {
  SeqIndexer<kNumFwdSlots> index;
  int64_t num_seqs = 0;
  int64_t seq_len = 0;
  bool reverse = false;
  const void* inputs = nullptr;
  const void* coeffs = nullptr;
  const void* initial = nullptr;  // nullptr: the state starts at zero
  void* outputs = nullptr;
  const uint8_t* cuts = nullptr;    // nullptr: no cut (see CutAt in memio.h)
  uint32_t* cut_bits = nullptr;     // tile, pipe, chained kernels, with cuts: packed by the launch (PrefetchedCutBits)
  void* chain_workspace = nullptr;  // chained and strided kernels: cleared by the launch, see lookback.cuh
  ChainSchedule chain_schedule;     // chained kernels only: see lookback.cuh
};

struct BackwardParams {
  SeqIndexer<kNumBwdSlots> index;
  int64_t num_seqs = 0;
  int64_t seq_len = 0;
  bool reverse = false;
  const void* d_outputs = nullptr;
  const void* coeffs = nullptr;
  const void* outputs = nullptr;
  const void* initial = nullptr;  // nullptr: the state started at zero
  void* d_inputs = nullptr;
  void* d_coeffs = nullptr;
  void* d_initial = nullptr;
  const uint8_t* cuts = nullptr;  // as ForwardParams'
  uint32_t* cut_bits = nullptr;   // as ForwardParams'
  void* chain_workspace = nullptr;  // chained and strided kernels: cleared by the launch, see lookback.cuh
  ChainSchedule chain_schedule;     // chained kernels only: see lookback.cuh
};

// Storage dtypes; arithmetic is float32 for the 16-bit types. The complex ones
// run on the CPU and on the ref, staged chained and strided CUDA kernels only.
enum class DType : int { kFloat32, kFloat64, kFloat16, kBFloat16, kComplex64, kComplex128 };

constexpr bool is_complex(DType d) { return d == DType::kComplex64 || d == DType::kComplex128; }

// The dtypes of one call: `values` of the scanned tensors (inputs, outputs,
// their gradients and the initial state), `coeffs` of the coefficients and
// their gradient. They differ only in mixed storage: float32 coefficients
// beside 16-bit values (kernels/primitives/dtype.cuh, Mixed). With
// `log_coeffs` the coefficient tensor holds log c, and its gradient is that of log c.
struct Storage {
  DType values;
  DType coeffs;
  bool log_coeffs = false;
  constexpr bool mixed() const { return values != coeffs; }
};

// The element type of a log-coefficient tensor of dtype R: the kernels read exp(log)
// (to_acc in kernels/primitives/dtype.cuh, coeff_value in cpu/cpu_kernels.cpp).
template <typename R>
struct LogOf {
  R log;
};

}  // namespace linrec

// The ops' output allocations, through the stable C shim (aoti_torch_empty_strided, aoti_torch_zero_).
// torch::stable::empty_like and new_empty are dispatcher calls that look the aten op up
// by its name on every call; on a small eager call that lookup was a measurable part of
// the op's host time (docs/design/0015-host-time-eager-calls.md).
#pragma once
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

namespace linrec {

// The shim's dtype code of `dtype`, like's dtype when nullopt.
inline int32_t shim_dtype(const torch::stable::Tensor& like, std::optional<torch::headeronly::ScalarType> dtype) {
  using torch::headeronly::ScalarType;
  if (!dtype || *dtype == like.scalar_type()) {
    int32_t code;
    STD_TORCH_CHECK(aoti_torch_get_dtype(like.get(), &code) == AOTI_TORCH_SUCCESS, "linrec: reading a dtype failed");
    return code;
  }
  switch (*dtype) {
    case ScalarType::Float: return aoti_torch_dtype_float32();
    case ScalarType::Double: return aoti_torch_dtype_float64();
    case ScalarType::Half: return aoti_torch_dtype_float16();
    case ScalarType::BFloat16: return aoti_torch_dtype_bfloat16();
    case ScalarType::ComplexFloat: return aoti_torch_dtype_complex64();
    case ScalarType::ComplexDouble: return aoti_torch_dtype_complex128();
    case ScalarType::Byte: return aoti_torch_dtype_uint8();
    default: STD_TORCH_CHECK(false, "linrec: internal error: an output dtype the ops do not allocate");
  }
}

// An uninitialised tensor of `sizes` and `strides` on like's device, in `dtype` (like's when nullopt).
inline torch::stable::Tensor new_strided(const torch::stable::Tensor& like, const std::vector<int64_t>& sizes,
                                         const std::vector<int64_t>& strides,
                                         std::optional<torch::headeronly::ScalarType> dtype = std::nullopt) {
  int32_t device_type, device_index;
  STD_TORCH_CHECK(aoti_torch_get_device_type(like.get(), &device_type) == AOTI_TORCH_SUCCESS &&
                      aoti_torch_get_device_index(like.get(), &device_index) == AOTI_TORCH_SUCCESS,
                  "linrec: reading a device failed");
  AtenTensorHandle handle;
  STD_TORCH_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(),
                                           shim_dtype(like, dtype), device_type, device_index,
                                           &handle) == AOTI_TORCH_SUCCESS,
                  "linrec: allocating an output failed");
  return torch::stable::Tensor(handle);
}

inline std::vector<int64_t> row_major_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t next = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    strides[k] = next;
    next *= std::max<int64_t>(sizes[k], 1);
  }
  return strides;
}

// Whether strides lay the elements out without gaps or overlap, in some order of the dims:
// sorted by stride (dims of size 1 aside), each stride is the product of the sizes before it.
inline bool dense_without_overlap(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  std::vector<size_t> order;
  for (size_t k = 0; k < sizes.size(); ++k)
    if (sizes[k] != 1) order.push_back(k);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t want = 1;
  for (size_t k : order) {
    if (strides[k] != want) return false;
    want *= sizes[k];
  }
  return true;
}

// empty_like(self, dtype=dtype) through the dispatcher: the layouts the shim path leaves to it.
inline torch::stable::Tensor dispatch_empty_like(const torch::stable::Tensor& self,
                                                 std::optional<torch::headeronly::ScalarType> dtype) {
  std::array<StableIValue, 6> stack{torch::stable::detail::from(self), torch::stable::detail::from(dtype),
                                    torch::stable::detail::from(std::nullopt), torch::stable::detail::from(std::nullopt),
                                    torch::stable::detail::from(std::nullopt), torch::stable::detail::from(std::nullopt)};
  STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher("aten::empty_like", "", stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<torch::stable::Tensor>(stack[0]);
}

// empty_like(self, dtype=dtype), as the ops' fake kernels allocate (linrec/_ops.py), so that traced
// graphs see the real layout: where self is dense without overlap, that is self's strides, taken
// through the shim; other layouts (gaps, broadcasts, no element) keep empty_like's own rule.
inline torch::stable::Tensor new_like(const torch::stable::Tensor& self,
                                      std::optional<torch::headeronly::ScalarType> dtype = std::nullopt) {
  const std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end());
  const std::vector<int64_t> strides(self.strides().begin(), self.strides().end());
  if (self.numel() == 0 || !dense_without_overlap(sizes, strides)) return dispatch_empty_like(self, dtype);
  return new_strided(self, sizes, strides, dtype);
}

// A row-major tensor of `sizes` on like's device, in `dtype` (like's when nullopt).
inline torch::stable::Tensor new_row_major(const torch::stable::Tensor& like, const std::vector<int64_t>& sizes,
                                           std::optional<torch::headeronly::ScalarType> dtype = std::nullopt) {
  return new_strided(like, sizes, row_major_strides(sizes), dtype);
}

// new_row_major, filled with zeros (aoti_torch_zero_: no lookup by name either).
inline torch::stable::Tensor new_zeros_row_major(const torch::stable::Tensor& like, const std::vector<int64_t>& sizes,
                                                 std::optional<torch::headeronly::ScalarType> dtype = std::nullopt) {
  torch::stable::Tensor t = new_row_major(like, sizes, dtype);
  STD_TORCH_CHECK(aoti_torch_zero_(t.get()) == AOTI_TORCH_SUCCESS, "linrec: zeroing an output failed");
  return t;
}

}  // namespace linrec

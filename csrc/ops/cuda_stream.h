// torch's current CUDA stream, on which the CUDA ops launch (ops_cuda.cpp, selective_ops_cuda.cpp).
#pragma once
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

namespace linrec {

// A cudaStream_t: the current stream of t's device.
inline void* current_stream(const torch::stable::Tensor& t) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream) == 0,
                  "linrec: could not get the current CUDA stream");
  return stream;
}

}  // namespace linrec

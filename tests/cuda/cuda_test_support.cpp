// CUDA test helpers: the backend under test (or a visible skip), device buffers, comparisons.
#include "cuda_test_support.h"

#include <exception>

namespace lily::testing {

std::unique_ptr<Backend> cuda_backend_or_null(std::string* why) {
  return cuda_backend_or_null(CudaOptions{}, why);
}

std::unique_ptr<Backend> cuda_backend_or_null(const CudaOptions& options, std::string* why) {
  if (!cuda_available(why)) return nullptr;
  try {
    return make_cuda_backend(0, options);
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
}

float* to_device(Backend& be, std::span<const float> host) {
  float* device = be.alloc(host.size());
  be.copy_from_host(host.data(), host.size(), device);
  return device;
}

int32_t* to_device(Backend& be, std::span<const int32_t> host) {
  int32_t* device = be.alloc_i32(host.size());
  be.copy_from_host(host.data(), host.size(), device);
  return device;
}

std::vector<float> to_host(Backend& be, const float* device, size_t count) {
  std::vector<float> host(count);
  be.copy_to_host(device, count, host.data());
  return host;
}

std::vector<int32_t> to_host(Backend& be, const int32_t* device, size_t count) {
  std::vector<int32_t> host(count);
  be.copy_to_host_i32(device, count, host.data());
  return host;
}

GatedDeltaNetWeights mixer_weights(const DenseTensor& conv1d, const DenseTensor& a_log,
                                   const DenseTensor& dt_bias, const DenseTensor& norm,
                                   const QuantWeight& out_proj) {
  GatedDeltaNetWeights w;
  w.conv1d = conv1d.view();
  w.a_log = a_log.view();
  w.dt_bias = dt_bias.view();
  w.norm = norm.view();
  w.out_proj = out_proj.view();
  return w;
}

ErrorFigures compare_f32(std::span<const float> got, std::span<const float> want) {
  std::vector<double> wide(want.begin(), want.end());
  return compare(got, wide);
}

}  // namespace lily::testing

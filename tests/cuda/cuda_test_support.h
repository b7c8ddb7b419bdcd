// CUDA test helpers: the backend under test (or a visible skip), device buffers, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_options.h"
#include "backend_test_support.h"

namespace lily::testing {

// The CUDA backend (default options, or `options`), or nullptr with the reason in `why` (no
// GPU, built without CUDA).
std::unique_ptr<Backend> cuda_backend_or_null(std::string* why);
std::unique_ptr<Backend> cuda_backend_or_null(const CudaOptions& options, std::string* why);

// The counts of the CUDA backend `be` (cuda_options.h): which kernel paths its ops took.
inline const CudaPathCounts& path_counts(const Backend& be) { return cuda_path_counts(be); }

// Declares `be` as the CUDA backend, or marks the test SKIPPED (visibly) when there is none.
#define LILY_CUDA_BACKEND_OR_SKIP(be)                                   \
  std::string lily_skip_reason_;                                        \
  std::unique_ptr<::lily::Backend> be =                                 \
      ::lily::testing::cuda_backend_or_null(&lily_skip_reason_);        \
  if (!be) GTEST_SKIP() << "no usable CUDA device: " << lily_skip_reason_

// Host <-> backend memory through the Backend interface (works for CPU and CUDA alike).
float* to_device(Backend& be, std::span<const float> host);
int32_t* to_device(Backend& be, std::span<const int32_t> host);
std::vector<float> to_host(Backend& be, const float* device, size_t count);
std::vector<int32_t> to_host(Backend& be, const int32_t* device, size_t count);

// Figures of `got` against `want` (f32 vs f32, e.g. CUDA against the CPU backend).
ErrorFigures compare_f32(std::span<const float> got, std::span<const float> want);

// The Gated DeltaNet mixer's weights as views of test tensors (they must outlive the result).
GatedDeltaNetWeights mixer_weights(const DenseTensor& conv1d, const DenseTensor& a_log,
                                   const DenseTensor& dt_bias, const DenseTensor& norm,
                                   const QuantWeight& out_proj);

}  // namespace lily::testing

// make_cuda_backend for builds without CUDA (-DLILY_WITH_CUDA=OFF or no nvcc): a clear refusal.
#include <stdexcept>

#include "backend/backend.h"
#include "backend/cuda/cuda_options.h"

namespace lily {

namespace {
constexpr const char* kWhy =
    "this lily was built without CUDA (no nvcc found, or -DLILY_WITH_CUDA=OFF); rebuild with "
    "CUDA 12+ to use --device cuda";
}

bool cuda_available(std::string* why) {
  if (why != nullptr) *why = kWhy;
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(uint64_t /*required_bytes*/,
                                           const CudaOptions& /*options*/) {
  throw std::runtime_error(kWhy);
}

const CudaPathCounts& cuda_path_counts(const Backend& backend) {
  throw std::invalid_argument("cuda_path_counts: the " + backend.name() +
                              " backend is not the CUDA backend (" + kWhy + ")");
}

}  // namespace lily

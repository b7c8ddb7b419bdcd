// make_cuda_backend for builds without CUDA (-DLILY_WITH_CUDA=OFF or no nvcc): a clear refusal.
#include <stdexcept>

#include "backend/backend.h"

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

std::unique_ptr<Backend> make_cuda_backend(uint64_t /*required_bytes*/) {
  throw std::runtime_error(kWhy);
}

}  // namespace lily

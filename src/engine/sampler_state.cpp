// One sequence's sampler buffers in backend memory, and their upload at the start of a request.
#include "engine/sampler_state.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace lily {

SamplerState::SamplerState(Backend& backend, int64_t vocab) : backend_(backend) {
  const auto v = static_cast<size_t>(vocab);
  buffers_.params = backend_.alloc_i32(static_cast<size_t>(kSamplerParamWords));
  buffers_.counts = backend_.alloc_i32(v);
  buffers_.prompt_seen = backend_.alloc_i32(v);
  buffers_.step = backend_.alloc_i32(1);
  host_seen_.assign(v, 0);
}

void SamplerState::upload(const SamplerParams& params, bool sampling,
                          std::span<const int32_t> prompt) {
  // A device backend reads the params where it cannot check them: they are checked here.
  if (const std::string error = sampler_params_error(params, static_cast<int64_t>(host_seen_.size()));
      !error.empty()) {
    throw std::invalid_argument("sampler parameters: " + error);
  }
  backend_.copy_from_host(reinterpret_cast<const int32_t*>(&params),
                          static_cast<size_t>(kSamplerParamWords), buffers_.params);
  if (!sampling) return;
  std::fill(host_seen_.begin(), host_seen_.end(), 0);
  backend_.copy_from_host(host_seen_.data(), host_seen_.size(), buffers_.counts);
  const int32_t zero = 0;
  backend_.copy_from_host(&zero, 1, buffers_.step);
  for (int32_t id : prompt) {
    if (id >= 0 && static_cast<size_t>(id) < host_seen_.size()) {
      host_seen_[static_cast<size_t>(id)] = 1;
    }
  }
  backend_.copy_from_host(host_seen_.data(), host_seen_.size(), buffers_.prompt_seen);
}

}  // namespace lily

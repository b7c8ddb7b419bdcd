// One sequence's sampler buffers in backend memory, and their upload at the start of a request.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace lily {

// Owns (through the backend, which never frees) the SamplerBuffers of one running sequence:
// params [kSamplerParamWords], counts [vocab] i32, prompt_seen [vocab] i32, step [1] i32.
class SamplerState {
 public:
  SamplerState(Backend& backend, int64_t vocab);

  const SamplerBuffers& buffers() const { return buffers_; }

  // Before a sequence's first token: writes `params` (top_logprobs included), and when
  // `sampling`, zero counts and step and marks the ids of `prompt` (the whole prompt, cached
  // prefix included: the repetition penalty covers it) in prompt_seen. Logprobs with the
  // argmax read only the params. Throws std::invalid_argument for parameters outside the
  // contract (sampler_params_error).
  void upload(const SamplerParams& params, bool sampling, std::span<const int32_t> prompt);

 private:
  Backend& backend_;
  SamplerBuffers buffers_;
  std::vector<int32_t> host_seen_;  // [vocab] staging for prompt_seen and the zeroed counts
};

}  // namespace lily

// Deterministic pseudo-random numbers for synthetic checkpoints (same bytes on any machine).
#pragma once

#include <cstdint>
#include <string_view>

namespace lily {

// SplitMix64: tiny, fast, and fully specified by integer arithmetic, so a seed gives the
// same stream everywhere. Floats are built from integers without libm calls.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits (exact in float).
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  // Uniform integer in [0, n), n > 0 (modulo bias is irrelevant here).
  uint64_t below(uint64_t n) { return next() % n; }
  // Approximately standard normal: Irwin-Hall sum of 4 uniforms, rescaled (variance 1).
  float normalish() {
    const float sum = uniform() + uniform() + uniform() + uniform();
    return (sum - 2.0f) * 1.7320508f;  // sqrt(12 / 4)
  }

 private:
  uint64_t state_;
};

// FNV-1a 64 of a string, mixed with a seed: one independent stream per tensor name.
uint64_t stream_seed(uint64_t seed, std::string_view name);

}  // namespace lily

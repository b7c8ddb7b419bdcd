// Sampler test helpers: random logits and parameter sets per stage, checks against the reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/sampling.h"
#include "backend_test_support.h"
#include "ref/reference_sampler.h"

namespace lily::testing {

// One draw's inputs: logits [vocab], counts and prompt_seen [vocab] as in SamplerBuffers.
struct SamplerCase {
  std::string label;
  std::vector<float> logits;
  std::vector<int32_t> counts;
  std::vector<int32_t> prompt_seen;
  SamplerParams params;
  uint32_t step = 0;
  int64_t vocab() const { return static_cast<int64_t>(logits.size()); }
  double u() const {
    return static_cast<double>(sampler_uniform(params.seed_lo, params.seed_hi, step));
  }
  ref::SampleResult reference() const { return ref::sample(logits, params, counts, prompt_seen, u()); }
};

// Logit shapes: normal with spikes, small integers (ties everywhere), wide uniform, one
// dominant logit, non-finite values and signed zeros, all equal.
enum LogitKind : int { kNormal, kTies, kWide, kPeaked, kSpecial, kConstant, kLogitKinds };
// Stages to switch on (bits): each draws a random non-neutral value.
enum StageBits : int {
  kRepetition = 1,
  kFreqPresence = 2,
  kBias = 4,
  kTopK = 8,
  kTopP = 16,
  kMinP = 32,
  kGreedy = 64,  // temperature 0
  kAllSampled = kRepetition | kFreqPresence | kBias | kTopK | kTopP | kMinP,
};

std::vector<float> random_logits(Rng& rng, int64_t vocab, int kind);
SamplerCase random_case(Rng& rng, int64_t vocab, int kind, int stages);
// Every stage alone, pairs with top_k / top_p, all of them, and greedy; each logit kind;
// `per` random cases of each.
std::vector<SamplerCase> stage_cases(Rng& rng, int64_t vocab, int per);

// A decision within this distance (probability units: a share of the survivors' mass) of
// flipping may go either way between backends and the reference: f32 masses are good to
// ~4e-6 relative at d = -30 (the rounding of (l - M) / T), e^d to 2 ulp, the 2^-40 mass grid
// to ~1e-7 summed over a vocabulary; 1e-5 covers them with room.
inline constexpr double kBoundaryTol = 1e-5;

enum class Agreement { exact, boundary };
// Checks a backend's token (and its drawable survivors in id order, when given) against the
// reference: equal, or differing only across a decision the reference marks as within
// kBoundaryTol (then `boundary`). Anything else is a test failure naming the case.
Agreement check_draw(const SamplerCase& c, const ref::SampleResult& want, int32_t token,
                     const std::vector<int32_t>* survivors);

// The upper tail P(X >= x) of a chi-square distribution with `df` degrees of freedom.
double chi_square_p_value(double x, double df);

}  // namespace lily::testing

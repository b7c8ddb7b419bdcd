// Float64 reference of the sampler ops (sample, token_logprobs), written from sampling.h (test-only).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/sampling.h"

// Plain and slow on purpose: a full sort of the vocabulary, double-precision probabilities
// e^((l - M) / T) / Z with nothing quantised or pruned. Stages 1-3 are f32 operations by the
// contract (sampling.h), so they are done in f32 here too and match a backend bit for bit;
// everything after them is double. Nothing here shares code with src/backend.
namespace lily::ref {

struct SampleResult {
  std::vector<float> processed;  // [vocab] the logits after stages 1-3 (NaN -> -inf, inf -> FLT_MAX)
  bool greedy = false;           // stage 4 decided (T == 0 or every processed logit -inf)
  int32_t token = -1;
  // Stage 5's order of the whole vocabulary and the number of tokens each stage kept.
  std::vector<int32_t> order;  // [vocab] ids, processed logit descending, then id ascending
  int64_t kept_top_k = 0;
  int64_t kept_top_p = 0;
  // The final survivors in id order with their probabilities (summing to 1), and each one's
  // cumulative probability F (the draw picks the first with F > u).
  std::vector<int32_t> survivors;
  std::vector<double> probs;
  std::vector<double> cumulative;
  // How far each float decision was from flipping, in probability units (1: not decided by a
  // comparison): top_p's |S(c) / Z - top_p| at the cut and just before it, min_p's
  // |p / p_max - min_p| over the tokens it judged, the draw's |F - u| over every boundary.
  double top_p_margin = 1;
  double min_p_margin = 1;
  double draw_margin = 1;
};

// One draw with the uniform u (sampler_uniform(seed, step) for the backend's draw). counts and
// prompt_seen [vocab] as in SamplerBuffers.
SampleResult sample(std::span<const float> logits, const SamplerParams& params,
                    std::span<const int32_t> counts, std::span<const int32_t> prompt_seen,
                    double u);

struct LogprobRecord {
  int32_t token = -1;
  double logprob = 0;               // log_softmax(raw logits)[token]
  std::vector<int32_t> top_ids;     // the n largest raw logits, descending, ties: lower id
  std::vector<double> top_logprobs;
};
// token_logprobs of raw logits (NaN counts as -inf, +inf as FLT_MAX, as for sample); n = 0..20.
LogprobRecord token_logprobs(std::span<const float> logits, int32_t token, int n);

// The Random123 reference formulation of Philox4x32-10 (a different writing of the same
// function: the key is bumped before rounds 2..10), for the known-answer tests.
std::vector<uint32_t> philox4x32_10(const uint32_t counter[4], const uint32_t key[2]);

}  // namespace lily::ref

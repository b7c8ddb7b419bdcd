// Float64 reference of the sampler ops (sample, token_logprobs), written from sampling.h (test-only).
#include "ref/reference_sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace lily::ref {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// NaN counts as -inf and +inf as the largest float (sampling.h).
float sanitize(float l) {
  if (std::isnan(l)) return -kInf;
  return l > FLT_MAX ? FLT_MAX : l;
}

// Stage 5's order: larger logit first, then lower id (as floats: -0 == +0).
std::vector<int32_t> sorted_ids(std::span<const float> logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)];
    const float lb = logits[static_cast<size_t>(b)];
    return la != lb ? la > lb : a < b;
  });
  return ids;
}

}  // namespace

SampleResult sample(std::span<const float> logits, const SamplerParams& params,
                    std::span<const int32_t> counts, std::span<const int32_t> prompt_seen,
                    double u) {
  const size_t V = logits.size();
  if (V == 0 || counts.size() != V || prompt_seen.size() != V) {
    throw std::invalid_argument("ref::sample: logits, counts and prompt_seen need one entry per id");
  }
  SampleResult r;
  // Stages 1-3, f32 operations in the contract's order.
  r.processed.assign(logits.begin(), logits.end());
  for (size_t i = 0; i < V; ++i) {
    float& l = r.processed[i];
    const int32_t count = counts[i];
    if (params.repetition_penalty != 1.0f && (prompt_seen[i] != 0 || count > 0)) {
      l = l > 0.0f ? l / params.repetition_penalty : l * params.repetition_penalty;
    }
    if (count > 0) {
      l = l - (params.frequency_penalty * static_cast<float>(count) + params.presence_penalty);
    }
  }
  for (int32_t j = 0; j < params.bias_count; ++j) {
    const auto at = static_cast<size_t>(j);
    r.processed[static_cast<size_t>(params.bias_ids[at])] += params.bias_values[at];
  }
  for (float& l : r.processed) l = sanitize(l);

  const float max = *std::max_element(r.processed.begin(), r.processed.end());
  if (params.temperature == 0.0f || max == -kInf) {
    r.greedy = true;
    r.token = static_cast<int32_t>(std::find(r.processed.begin(), r.processed.end(), max) -
                                   r.processed.begin());
    return r;
  }

  // Stage 5 over the whole vocabulary, sorted.
  r.order = sorted_ids(r.processed);
  const int64_t vocab = static_cast<int64_t>(V);
  const int64_t k = params.top_k <= 0 || params.top_k >= vocab ? vocab : params.top_k;
  r.kept_top_k = k;
  // Stage 6: masses relative to the maximum, in double (the maximum's is 1).
  const auto T = static_cast<double>(params.temperature);
  std::vector<double> mass(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    const auto l = static_cast<double>(r.processed[static_cast<size_t>(r.order[static_cast<size_t>(j)])]);
    mass[static_cast<size_t>(j)] = std::exp((l - static_cast<double>(max)) / T);
  }
  const double z = std::accumulate(mass.begin(), mass.end(), 0.0);
  // Stage 7: the shortest prefix whose share of z reaches top_p.
  int64_t kept = k;
  if (params.top_p < 1.0f) {
    double running = 0;
    for (int64_t c = 1; c <= k; ++c) {
      const double before = running / z;
      running += mass[static_cast<size_t>(c - 1)];
      if (running >= static_cast<double>(params.top_p) * z || c == k) {
        kept = c;
        r.top_p_margin = std::abs(running / z - static_cast<double>(params.top_p));
        if (c > 1) {
          r.top_p_margin =
              std::min(r.top_p_margin, std::abs(before - static_cast<double>(params.top_p)));
        }
        break;
      }
    }
  }
  r.kept_top_p = kept;
  // Stage 8: p / p_max = mass / mass[0] = mass.
  std::vector<int32_t> survivors;
  for (int64_t j = 0; j < kept; ++j) {
    const double m = mass[static_cast<size_t>(j)];
    if (params.min_p > 0.0f) {
      r.min_p_margin = std::min(r.min_p_margin, std::abs(m - static_cast<double>(params.min_p)));
      if (m < static_cast<double>(params.min_p)) continue;
    }
    survivors.push_back(r.order[static_cast<size_t>(j)]);
  }
  // Stage 9 in id order.
  std::sort(survivors.begin(), survivors.end());
  double total = 0;
  for (int32_t id : survivors) {
    total += std::exp((static_cast<double>(r.processed[static_cast<size_t>(id)]) -
                       static_cast<double>(max)) / T);
  }
  double running = 0;
  for (size_t j = 0; j < survivors.size(); ++j) {
    const int32_t id = survivors[j];
    const double p = std::exp((static_cast<double>(r.processed[static_cast<size_t>(id)]) -
                               static_cast<double>(max)) / T) / total;
    running += p;
    r.survivors.push_back(id);
    r.probs.push_back(p);
    r.cumulative.push_back(running);
    if (j + 1 < survivors.size()) r.draw_margin = std::min(r.draw_margin, std::abs(running - u));
    if (r.token < 0 && running > u) r.token = id;
  }
  if (r.token < 0) r.token = r.survivors.back();  // u within rounding of 1
  return r;
}

LogprobRecord token_logprobs(std::span<const float> logits, int32_t token, int n) {
  if (logits.empty() || token < 0 || static_cast<size_t>(token) >= logits.size() || n < 0 ||
      n > kMaxTopLogprobs) {
    throw std::invalid_argument("ref::token_logprobs: bad token or n");
  }
  std::vector<float> l(logits.size());
  std::transform(logits.begin(), logits.end(), l.begin(), sanitize);
  const auto max = static_cast<double>(*std::max_element(l.begin(), l.end()));
  double sum = 0;
  for (float v : l) sum += std::exp(static_cast<double>(v) - max);
  const double lse = max + std::log(sum);
  LogprobRecord r;
  r.token = token;
  r.logprob = static_cast<double>(l[static_cast<size_t>(token)]) - lse;
  const std::vector<int32_t> order = sorted_ids(l);
  for (int j = 0; j < n && static_cast<size_t>(j) < order.size(); ++j) {
    const int32_t id = order[static_cast<size_t>(j)];
    r.top_ids.push_back(id);
    r.top_logprobs.push_back(static_cast<double>(l[static_cast<size_t>(id)]) - lse);
  }
  return r;
}

std::vector<uint32_t> philox4x32_10(const uint32_t counter[4], const uint32_t key[2]) {
  uint64_t ctr[4] = {counter[0], counter[1], counter[2], counter[3]};
  uint64_t k0 = key[0];
  uint64_t k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key schedule: add the Weyl constants before every later round
      k0 = (k0 + 0x9E3779B9u) & 0xFFFFFFFFu;
      k1 = (k1 + 0xBB67AE85u) & 0xFFFFFFFFu;
    }
    const uint64_t p0 = 0xD2511F53u * ctr[0];  // 32 x 32 -> 64 bits
    const uint64_t p1 = 0xCD9E8D57u * ctr[2];
    const uint64_t next[4] = {((p1 >> 32) ^ ctr[1] ^ k0) & 0xFFFFFFFFu, p1 & 0xFFFFFFFFu,
                              ((p0 >> 32) ^ ctr[3] ^ k1) & 0xFFFFFFFFu, p0 & 0xFFFFFFFFu};
    std::copy(next, next + 4, ctr);
  }
  return {static_cast<uint32_t>(ctr[0]), static_cast<uint32_t>(ctr[1]),
          static_cast<uint32_t>(ctr[2]), static_cast<uint32_t>(ctr[3])};
}

}  // namespace lily::ref

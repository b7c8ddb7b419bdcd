// Sampler test helpers: random logits and parameter sets per stage, checks against the reference.
#include "sampler_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <numbers>
#include <set>

namespace lily::testing {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

template <typename T, size_t N>
T pick(Rng& rng, const T (&options)[N]) {
  return options[static_cast<size_t>(rng.below(static_cast<int32_t>(N)))];
}

float normal(Rng& rng, float sigma) {
  const double u1 = static_cast<double>(rng.uniform(1e-7f, 1.0f));
  const double u2 = static_cast<double>(rng.uniform(0.0f, 1.0f));
  return sigma * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace

std::vector<float> random_logits(Rng& rng, int64_t vocab, int kind) {
  const auto V = static_cast<size_t>(vocab);
  std::vector<float> l(V);
  const auto any_id = [&] { return static_cast<size_t>(rng.below(static_cast<int32_t>(vocab))); };
  switch (kind) {
    case kNormal:
      for (float& v : l) v = normal(rng, 3.0f);
      for (int s = 0; s < 3; ++s) l[any_id()] = rng.uniform(10.0f, 20.0f);
      break;
    case kTies:  // five values: every stage cuts through runs of equal logits
      for (float& v : l) v = static_cast<float>(rng.below(5)) - 1.0f;
      break;
    case kWide:
      for (float& v : l) v = rng.uniform(-50.0f, 50.0f);
      break;
    case kPeaked:
      for (float& v : l) v = normal(rng, 1.0f);
      l[any_id()] = 40.0f;
      break;
    case kSpecial: {
      for (float& v : l) v = normal(rng, 3.0f);
      const float specials[] = {-kInf, -kInf, -kInf, std::numeric_limits<float>::quiet_NaN(),
                                -0.0f, 0.0f, FLT_MAX, -FLT_MAX, 1e-40f, -1e-40f};
      for (size_t i = 0; i < V; ++i) {
        if (rng.below(8) == 0) l[i] = pick(rng, specials);
      }
      if (rng.below(3) == 0) l[any_id()] = kInf;  // then only the +inf ids (as FLT_MAX) have mass
      break;
    }
    default:
      std::fill(l.begin(), l.end(), 1.5f);
      break;
  }
  return l;
}

SamplerCase random_case(Rng& rng, int64_t vocab, int kind, int stages) {
  SamplerCase c;
  c.logits = random_logits(rng, vocab, kind);
  const auto V = static_cast<size_t>(vocab);
  c.counts.assign(V, 0);
  c.prompt_seen.assign(V, 0);
  // Counts and prompt ids are always there: with neutral penalties they must change nothing.
  for (size_t i = 0; i < V; ++i) {
    if (rng.below(10) == 0) c.counts[i] = 1 + rng.below(5);
    if (rng.below(10) == 0) c.prompt_seen[i] = 1;
  }
  SamplerParams& p = c.params;
  const float temperatures[] = {0.25f, 0.7f, 1.0f, 1.3f, 2.0f};
  p.temperature = (stages & kGreedy) != 0 ? 0.0f : pick(rng, temperatures);
  if ((stages & kRepetition) != 0) {
    const float r[] = {0.5f, 0.8f, 1.25f, 2.0f};
    p.repetition_penalty = pick(rng, r);
  }
  if ((stages & kFreqPresence) != 0) {
    const float f[] = {-2.0f, -0.5f, 0.4f, 2.0f};
    const float pr[] = {-2.0f, -0.3f, 1.0f, 2.0f};
    p.frequency_penalty = pick(rng, f);
    p.presence_penalty = pick(rng, pr);
  }
  if ((stages & kBias) != 0) {
    const int32_t counts[] = {1, 3, 40, kMaxLogitBias};
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(vocab, pick(rng, counts)));
    std::set<int32_t> ids;
    while (static_cast<int32_t>(ids.size()) < n) ids.insert(rng.below(static_cast<int32_t>(vocab)));
    p.bias_count = n;
    int32_t j = 0;
    for (int32_t id : ids) {
      const float values[] = {rng.uniform(-100.0f, 100.0f), 100.0f, -100.0f, 0.5f};
      p.bias_ids[static_cast<size_t>(j)] = id;
      p.bias_values[static_cast<size_t>(j)] = pick(rng, values);
      ++j;
    }
  }
  if ((stages & kTopK) != 0) {
    const int64_t ks[] = {1, 2, 3, 7, 20, 64, 100, 1024, 1025, 3000, vocab - 1, vocab, vocab + 3};
    p.top_k = static_cast<int32_t>(std::max<int64_t>(1, pick(rng, ks)));
  }
  if ((stages & kTopP) != 0) {
    const float ps[] = {0.999999f, 0.99f, 0.95f, 0.9f, 0.6f, 0.3f, 0.01f, 1e-30f};
    p.top_p = pick(rng, ps);
  }
  if ((stages & kMinP) != 0) {
    const float ms[] = {0.001f, 0.02f, 0.05f, 0.1f, 0.5f, 0.99f, 1.0f};
    p.min_p = pick(rng, ms);
  }
  p.seed_lo = rng.next_u32();
  p.seed_hi = rng.next_u32();
  p.top_logprobs = rng.below(kMaxTopLogprobs + 2) - 1;
  c.step = rng.next_u32();
  c.label = "vocab=" + std::to_string(vocab) + " kind=" + std::to_string(kind) +
            " stages=" + std::to_string(stages) + " T=" + std::to_string(p.temperature) +
            " k=" + std::to_string(p.top_k) + " top_p=" + std::to_string(p.top_p) +
            " min_p=" + std::to_string(p.min_p) + " bias=" + std::to_string(p.bias_count) +
            " step=" + std::to_string(c.step);
  return c;
}

std::vector<SamplerCase> stage_cases(Rng& rng, int64_t vocab, int per) {
  const int masks[] = {0,
                       kRepetition,
                       kFreqPresence,
                       kBias,
                       kTopK,
                       kTopP,
                       kMinP,
                       kTopK | kTopP,
                       kTopP | kMinP,
                       kTopK | kMinP,
                       kAllSampled,
                       kGreedy,
                       kGreedy | kRepetition | kFreqPresence | kBias};
  std::vector<SamplerCase> cases;
  for (int kind = 0; kind < kLogitKinds; ++kind) {
    for (int mask : masks) {
      for (int i = 0; i < per; ++i) cases.push_back(random_case(rng, vocab, kind, mask));
    }
  }
  return cases;
}

Agreement check_draw(const SamplerCase& c, const ref::SampleResult& want, int32_t token,
                     const std::vector<int32_t>* survivors) {
  if (want.greedy) {
    EXPECT_EQ(token, want.token) << c.label << " (greedy)";
    return Agreement::exact;
  }
  // A survivor set may differ only where top_p or min_p was decided within the tolerance.
  const bool set_boundary = want.top_p_margin < kBoundaryTol || want.min_p_margin < kBoundaryTol;
  if (survivors != nullptr && !set_boundary) {
    // The reference keeps every id with p > 0; a backend drops masses below 2^-41 of the
    // maximum's (q = 0). Ids above 2^-38 must be there, and nothing the reference dropped.
    const auto max =
        static_cast<double>(*std::max_element(want.processed.begin(), want.processed.end()));
    const auto T = static_cast<double>(c.params.temperature);
    std::set<int32_t> got(survivors->begin(), survivors->end());
    std::set<int32_t> kept(want.survivors.begin(), want.survivors.end());
    for (int32_t id : *survivors) {
      EXPECT_TRUE(kept.count(id) != 0) << c.label << ": id " << id << " survived, the reference dropped it";
    }
    for (int32_t id : want.survivors) {
      const double m = std::exp((static_cast<double>(want.processed[static_cast<size_t>(id)]) - max) / T);
      if (m >= 0x1p-38) {
        EXPECT_TRUE(got.count(id) != 0) << c.label << ": id " << id << " (mass " << m << ") was dropped";
      }
    }
    EXPECT_TRUE(std::is_sorted(survivors->begin(), survivors->end())) << c.label;
  }
  if (token == want.token) return Agreement::exact;
  const double u = c.u();
  const auto at = std::find(want.survivors.begin(), want.survivors.end(), token);
  if (at == want.survivors.end()) {
    // Only a survivor set decided at a boundary can give a token the reference dropped, and it
    // is still among stage 5's survivors.
    const auto in_top_k = std::find(want.order.begin(), want.order.begin() + want.kept_top_k, token);
    EXPECT_TRUE(set_boundary && in_top_k != want.order.begin() + want.kept_top_k)
        << c.label << ": token " << token << " is no survivor of the reference (which drew "
        << want.token << ", top_p margin " << want.top_p_margin << ", min_p margin "
        << want.min_p_margin << ")";
    return Agreement::boundary;
  }
  if (set_boundary) return Agreement::boundary;
  // The same survivors: u must lie within the tolerance of the token's share [F_before, F).
  const auto j = static_cast<size_t>(at - want.survivors.begin());
  const double before = j == 0 ? 0.0 : want.cumulative[j - 1];
  EXPECT_TRUE(before - kBoundaryTol <= u && u < want.cumulative[j] + kBoundaryTol)
      << c.label << ": token " << token << " owns [" << before << ", " << want.cumulative[j]
      << ") but u = " << u << " (the reference drew " << want.token << ")";
  return Agreement::boundary;
}

namespace {

// Regularised lower incomplete gamma P(a, x) by its series (x < a + 1).
double gamma_p_series(double a, double x) {
  double term = 1.0 / a;
  double sum = term;
  for (int n = 1; n < 100000; ++n) {
    term *= x / (a + n);
    sum += term;
    if (std::abs(term) < std::abs(sum) * 1e-16) break;
  }
  return sum * std::exp(-x + a * std::log(x) - std::lgamma(a));
}

// Regularised upper incomplete gamma Q(a, x) by its continued fraction (x >= a + 1; Lentz).
double gamma_q_fraction(double a, double x) {
  constexpr double kTiny = 1e-300;
  double b = x + 1.0 - a;
  double c = 1.0 / kTiny;
  double d = 1.0 / b;
  double h = d;
  for (int i = 1; i < 100000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::abs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(-x + a * std::log(x) - std::lgamma(a)) * h;
}

}  // namespace

double chi_square_p_value(double x, double df) {
  const double a = df / 2.0;
  const double half = x / 2.0;
  if (half <= 0) return 1.0;
  return half < a + 1.0 ? 1.0 - gamma_p_series(a, half) : gamma_q_fraction(a, half);
}

}  // namespace lily::testing

// Sampler statistics: CPU draws from the tiny model's next-token logits follow the reference's probabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "ref/reference_sampler.h"
#include "sampler_test_support.h"
#include "tiny_model_fixture.h"

namespace lily::testing {
namespace {

// 20,000 draws per parameter set, each a fresh sequence (counts 0, step 0) with seed
// (d, 0x5eed5eed) for draw d; the seeds are fixed, so the test is deterministic. The counts
// are compared with the reference's survivor probabilities by Pearson's chi-square (bins
// with an expectation below 5 merged); it fails when the p-value is below alpha = 1e-6: a
// correct sampler would fail it for one seed set in a million.
constexpr int kDraws = 20'000;
constexpr double kAlpha = 1e-6;

struct ChiSquare {
  double statistic = 0;
  int bins = 0;
  double p_value = 1;
};

ChiSquare chi_square(const ref::SampleResult& want, const std::vector<int>& observed) {
  struct Bin {
    double expected;
    double seen;
  };
  std::vector<Bin> bins;
  Bin rest{0, 0};
  for (size_t j = 0; j < want.survivors.size(); ++j) {
    const Bin b{want.probs[j] * kDraws, static_cast<double>(observed[static_cast<size_t>(want.survivors[j])])};
    if (b.expected >= 5) {
      bins.push_back(b);
    } else {
      rest.expected += b.expected;
      rest.seen += b.seen;
    }
  }
  std::sort(bins.begin(), bins.end(), [](const Bin& a, const Bin& b) { return a.expected > b.expected; });
  if (rest.expected >= 5 || bins.empty()) {
    bins.push_back(rest);
  } else {
    bins.back().expected += rest.expected;  // too small alone: into the smallest bin
    bins.back().seen += rest.seen;
  }
  ChiSquare r;
  r.bins = static_cast<int>(bins.size());
  for (const Bin& b : bins) {
    if (b.expected > 0) r.statistic += (b.seen - b.expected) * (b.seen - b.expected) / b.expected;
  }
  r.p_value = r.bins > 1 ? chi_square_p_value(r.statistic, r.bins - 1) : 1.0;
  return r;
}

TEST(SamplerStatistics, TinyModelDrawsFollowTheReferenceProbabilities) {
  TinyModel& tiny = tiny_model();
  Backend& be = *tiny.backend;
  DecodeState state(be, tiny.checkpoint.config.shape, 64);
  const std::vector<int32_t> prompt = {1, 17, 300, 42, 2048, 7, 3999, 17};
  tiny.model.forward(state, prompt);
  std::vector<float> logits;
  tiny.model.logits_to_host(logits);
  const auto vocab = static_cast<int64_t>(logits.size());
  ASSERT_EQ(vocab, 4096);

  SamplerBuffers buf;
  buf.params = be.alloc_i32(static_cast<size_t>(kSamplerParamWords));
  buf.counts = be.alloc_i32(static_cast<size_t>(vocab));
  buf.prompt_seen = be.alloc_i32(static_cast<size_t>(vocab));
  buf.step = be.alloc_i32(1);
  std::vector<int32_t> seen(static_cast<size_t>(vocab), 0);
  for (int32_t id : prompt) seen[static_cast<size_t>(id)] = 1;
  be.copy_from_host(seen.data(), seen.size(), buf.prompt_seen);
  const std::vector<int32_t> zeros(static_cast<size_t>(vocab), 0);
  int32_t* token = be.alloc_i32(1);

  struct Set {
    std::string name;
    SamplerParams params;
  };
  std::vector<Set> sets(5);
  sets[0].name = "T=1";
  sets[1].name = "T=0.7 top_k=20";
  sets[1].params.temperature = 0.7f;
  sets[1].params.top_k = 20;
  sets[2].name = "top_p=0.9";
  sets[2].params.top_p = 0.9f;
  sets[3].name = "min_p=0.05";
  sets[3].params.min_p = 0.05f;
  sets[4].name = "all: T=0.8 top_k=40 top_p=0.95 min_p=0.02 repetition=1.3 presence=0.5 bias";
  SamplerParams& all = sets[4].params;
  all.temperature = 0.8f;
  all.top_k = 40;
  all.top_p = 0.95f;
  all.min_p = 0.02f;
  all.repetition_penalty = 1.3f;
  all.presence_penalty = 0.5f;
  all.bias_count = 2;
  all.bias_ids[0] = 5;
  all.bias_values[0] = 3.0f;
  all.bias_ids[1] = 6;
  all.bias_values[1] = -100.0f;

  for (Set& set : sets) {
    const ref::SampleResult want = ref::sample(logits, set.params, zeros, seen, 0.5);
    // The survivor set must be unambiguous for the counts to be judged against it.
    ASSERT_GT(want.top_p_margin, kBoundaryTol) << set.name;
    ASSERT_GT(want.min_p_margin, kBoundaryTol) << set.name;
    std::vector<int> observed(static_cast<size_t>(vocab), 0);
    for (int d = 0; d < kDraws; ++d) {
      set.params.seed_lo = static_cast<uint32_t>(d);
      set.params.seed_hi = 0x5eed5eedu;
      std::memcpy(buf.params, static_cast<const void*>(&set.params), sizeof set.params);
      be.copy_from_host(zeros.data(), zeros.size(), buf.counts);
      const int32_t step0 = 0;
      be.copy_from_host(&step0, 1, buf.step);
      be.sample(logits.data(), vocab, buf, token);
      int32_t drawn = -1;
      be.copy_to_host_i32(token, 1, &drawn);
      ASSERT_TRUE(drawn >= 0 && drawn < vocab);
      ++observed[static_cast<size_t>(drawn)];
    }
    const std::set<int32_t> kept(want.survivors.begin(), want.survivors.end());
    for (int64_t id = 0; id < vocab; ++id) {
      if (observed[static_cast<size_t>(id)] > 0) {
        EXPECT_TRUE(kept.count(static_cast<int32_t>(id)) != 0)
            << set.name << ": drew id " << id << " (" << observed[static_cast<size_t>(id)]
            << " times), which no stage keeps";
      }
    }
    const ChiSquare fit = chi_square(want, observed);
    std::printf("[ref] sampler statistics %s: %zu survivors, chi2 %.1f over %d bins, p = %.3g\n",
                set.name.c_str(), want.survivors.size(), fit.statistic, fit.bins, fit.p_value);
    EXPECT_GE(fit.p_value, kAlpha) << set.name;
    // The test can fail: the same counts against the distribution at a temperature 25% off.
    SamplerParams off = set.params;
    off.temperature *= 1.25f;
    const ChiSquare wrong = chi_square(ref::sample(logits, off, zeros, seen, 0.5), observed);
    std::printf("[ref] ... against T x 1.25: chi2 %.1f, p = %.3g\n", wrong.statistic, wrong.p_value);
    if (want.survivors.size() > 1) {
      EXPECT_LT(wrong.p_value, kAlpha) << set.name << " (power)";
    }
  }
}

}  // namespace
}  // namespace lily::testing

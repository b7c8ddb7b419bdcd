// CPU sampler ops vs the float64 reference: Philox, the exact arithmetic, every stage, logprobs, rejection.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/thread_pool.h"
#include "backend_test_support.h"
#include "ref/reference_sampler.h"
#include "sampler_test_support.h"

namespace lily::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- Philox4x32-10 ---------------------------------------------------------------------------

// Random123's kat_vectors (philox4x32 10 lines, as cut into DEShawResearch/Random123-Boost
// libs/random/test/test_philox.cpp): counter[4] key[2] -> output[4].
struct Kat {
  uint32_t counter[4];
  uint32_t key[2];
  uint32_t out[4];
};
constexpr Kat kKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(SamplerPhilox, Random123KnownAnswers) {
  for (const Kat& kat : kKats) {
    const Philox4x32 got = philox4x32_10(
        Philox4x32{{kat.counter[0], kat.counter[1], kat.counter[2], kat.counter[3]}}, kat.key[0],
        kat.key[1]);
    const std::vector<uint32_t> ref = ref::philox4x32_10(kat.counter, kat.key);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(got.v[i], kat.out[i]) << "word " << i << " of counter " << std::hex << kat.counter[0];
      EXPECT_EQ(ref[static_cast<size_t>(i)], kat.out[i]) << "reference word " << i;
    }
  }
}

TEST(SamplerPhilox, MatchesTheReferenceFormulationAndDefinesTheUniform) {
  Rng rng(7001);
  for (int n = 0; n < 2000; ++n) {
    const uint32_t counter[4] = {rng.next_u32(), rng.next_u32(), rng.next_u32(), rng.next_u32()};
    const uint32_t key[2] = {rng.next_u32(), rng.next_u32()};
    const Philox4x32 got =
        philox4x32_10(Philox4x32{{counter[0], counter[1], counter[2], counter[3]}}, key[0], key[1]);
    const std::vector<uint32_t> want = ref::philox4x32_10(counter, key);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(got.v[i], want[static_cast<size_t>(i)]) << n;
    // Stage 9's uniform: the top 24 bits of word 0 of counter (step, 0, 0, 0).
    const uint32_t step_counter[4] = {counter[0], 0, 0, 0};
    const uint32_t word0 = ref::philox4x32_10(step_counter, key)[0];
    ASSERT_EQ(sampler_u24(key[0], key[1], counter[0]), word0 >> 8);
    ASSERT_EQ(sampler_uniform(key[0], key[1], counter[0]), static_cast<float>(word0 >> 8) * 0x1p-24f);
  }
}

// ---- The exact arithmetic of sampling.h --------------------------------------------------

TEST(SamplerArithmetic, TopPThresholdIsTheExactCeiling) {
  Rng rng(7002);
  const float fixed[] = {1e-30f, 1e-7f, 0.01f, 0.3f, 0.5f, 0.9f, 0.95f, 0.99f, 0.999999f,
                         std::nextafter(1.0f, 0.0f), 1e-45f /* subnormal */};
  for (int n = 0; n < 20000; ++n) {
    const float top_p = n < 11 ? fixed[n] : rng.uniform(0.0f, 1.0f);
    if (!(top_p > 0.0f)) continue;
    const uint64_t z = n % 3 == 0 ? rng.next() : (rng.next() >> (n % 40)) | 1;
    const uint64_t t = top_p_threshold(top_p, z);
    // top_p = m * 2^-shift exactly (frexp, independent of the bit layout): the ceiling of
    // m * z / 2^shift from the quotient and remainder of 128-bit integers.
    int e = 0;
    const double frac = std::frexp(static_cast<double>(top_p), &e);  // top_p = frac * 2^e
    const auto m = static_cast<uint64_t>(std::ldexp(frac, 53));     // exact: <= 24 bits set
    const int shift = 53 - e;
    const SamplerU128 product = static_cast<SamplerU128>(m) * z;  // < 2^117
    uint64_t want = product != 0 ? 1 : 0;
    if (shift < 120) {
      const SamplerU128 quotient = product >> shift;
      const bool remainder = (product & ((static_cast<SamplerU128>(1) << shift) - 1)) != 0;
      want = static_cast<uint64_t>(quotient) + (remainder ? 1 : 0);
    }
    ASSERT_EQ(t, want) << "top_p " << top_p << " z " << z;
  }
  EXPECT_EQ(top_p_threshold(1.0f, 12345), 12345u);
  EXPECT_EQ(top_p_threshold(0.5f, 3), 2u);
  EXPECT_EQ(top_p_threshold(0.5f, 4), 2u);
  EXPECT_EQ(top_p_threshold(0.75f, 4), 3u);
}

TEST(SamplerArithmetic, DrawTargetMinPAndMassRounding) {
  Rng rng(7003);
  for (int n = 0; n < 20000; ++n) {
    const uint32_t u24 = rng.next_u32() >> 8;
    const uint64_t zs = rng.next() >> (n % 24);
    const uint64_t t = draw_target(u24, zs);
    const SamplerU128 exact = static_cast<SamplerU128>(u24) * zs;
    ASSERT_LE(static_cast<SamplerU128>(t) << 24, exact);
    ASSERT_LT(exact, (static_cast<SamplerU128>(t) + 1) << 24);
    if (zs > 0) {
      ASSERT_LT(t, zs);
    }
  }
  EXPECT_EQ(min_p_threshold(0.0f), 0u);
  EXPECT_EQ(min_p_threshold(1.0f), kMassOne);
  EXPECT_EQ(min_p_threshold(0.5f), kMassOne / 2);
  for (int n = 0; n < 1000; ++n) {
    const float min_p = rng.uniform(0.0f, 1.0f);
    const uint64_t t = min_p_threshold(min_p);
    const double scaled = static_cast<double>(min_p) * 0x1p40;  // exact
    ASSERT_TRUE(static_cast<double>(t) >= scaled && static_cast<double>(t) - 1.0 < scaled) << min_p;
  }
  // q = round half to even of e * 2^40.
  EXPECT_EQ(mass_from_exp(1.0f), kMassOne);
  EXPECT_EQ(mass_from_exp(0x1p-41f), 0u);         // 0.5 -> 0
  EXPECT_EQ(mass_from_exp(0x1.8p-40f), 2u);       // 1.5 -> 2
  EXPECT_EQ(mass_from_exp(0x1.4p-39f), 2u);       // 2.5 -> 2
  EXPECT_EQ(mass_from_exp(0x1.000002p-1f), (kMassOne >> 1) + (uint64_t{1} << 16));
  EXPECT_EQ(mass_from_exp(std::exp(-30.0f)), 0u);  // the cutoff: e^-30 * 2^40 = 0.10
}

TEST(SamplerArithmetic, LogitKeysOrderLikeFloatsWithSignedZerosEqual) {
  Rng rng(7004);
  std::vector<float> values = {-kInf, -FLT_MAX, -1.0f, -1e-40f, -0.0f, 0.0f, 1e-40f, 1.0f, FLT_MAX};
  for (int i = 0; i < 3000; ++i) values.push_back(rng.uniform(-1e4f, 1e4f));
  for (int i = 0; i < 300; ++i) values.push_back(static_cast<float>(rng.below(7)) - 3.0f);
  for (float a : values) {
    if (a != 0.0f) {
      ASSERT_EQ(key_logit(logit_key(a)), a);
    }
    for (int j = 0; j < 20; ++j) {
      const float b = values[static_cast<size_t>(rng.below(static_cast<int32_t>(values.size())))];
      ASSERT_EQ(a < b, logit_key(a) < logit_key(b)) << a << " vs " << b;
      ASSERT_EQ(a == b, logit_key(a) == logit_key(b)) << a << " vs " << b;
    }
  }
  // rank_key: larger logit first, then lower id; 0 ranks after everything.
  EXPECT_GT(rank_key(logit_key(2.0f), 5), rank_key(logit_key(1.0f), 0));
  EXPECT_GT(rank_key(logit_key(1.0f), 3), rank_key(logit_key(1.0f), 4));
  EXPECT_GT(rank_key(logit_key(-kInf), 16777214), 0u);
  EXPECT_EQ(rank_key_id(rank_key(logit_key(-3.5f), 123456)), 123456);
}

TEST(SamplerArithmetic, ExpIsWithinTwoUlpAndExactAtZero) {
  double worst = 0;
  for (int i = 0; i <= 2'000'000; ++i) {
    const float d = -87.0f * static_cast<float>(i) / 2'000'000.0f;
    const double want = std::exp(static_cast<double>(d));
    const double got = static_cast<double>(sampler_exp(d));
    worst = std::max(worst, std::abs(got - want) / want);
  }
  std::printf("[ref] sampler_exp over [-87, 0]: max relative error %.3g (2 ulp = 2.4e-7)\n", worst);
  EXPECT_LT(worst, 2.4e-7);
  EXPECT_EQ(sampler_exp(0.0f), 1.0f);
  EXPECT_EQ(sampler_exp(-0.0f), 1.0f);
  EXPECT_EQ(sampler_mass(3.0f, 3.0f, 0.7f), kMassOne);
  EXPECT_EQ(sampler_mass(-27.0f, 3.0f, 1.0f), 0u);  // d = -30: the cutoff
  EXPECT_EQ(sampler_mass(-24.0f, 3.0f, 1.0f), 2u);  // e^-27 * 2^40 = 2.07
}

// ---- sample vs the reference -----------------------------------------------------------------

struct Tally {
  int exact = 0;
  int boundary = 0;
};

// Runs every case through sample_row (top-k path where it applies, and the general path),
// checks both against the reference and against each other (the top-k path must be exact:
// the same survivors, masses and token), and the processed logits bitwise.
Tally run_cases(const std::vector<SamplerCase>& cases) {
  Tally tally;
  cpu::SamplerWork work;
  for (const SamplerCase& c : cases) {
    const ref::SampleResult want = c.reference();
    cpu::SamplerTrace fast;
    const int32_t token = cpu::sample_row(c.logits.data(), c.vocab(), c.params, c.counts.data(),
                                          c.prompt_seen.data(), c.step, work, &fast);
    // Stages 1-3 are f32 by the contract: bit for bit.
    for (size_t i = 0; i < want.processed.size(); ++i) {
      const float got = work.processed[i];
      if (std::memcmp(&got, &want.processed[i], sizeof got) != 0 &&
          !(got == 0.0f && want.processed[i] == 0.0f)) {
        ADD_FAILURE() << c.label << ": processed logit " << i << " is " << got << ", want "
                      << want.processed[i];
        break;
      }
    }
    EXPECT_EQ(token, fast.token) << c.label;
    EXPECT_EQ(fast.greedy, want.greedy) << c.label;
    const Agreement a = check_draw(c, want, token, &fast.survivors);
    ++(a == Agreement::exact ? tally.exact : tally.boundary);
    if (!want.greedy) {
      for (cpu::SamplerPath path : {cpu::SamplerPath::general, cpu::SamplerPath::bands}) {
        cpu::SamplerTrace other;
        const int32_t token2 = cpu::sample_row(c.logits.data(), c.vocab(), c.params, c.counts.data(),
                                               c.prompt_seen.data(), c.step, work, &other, path);
        const char* name = path == cpu::SamplerPath::general ? " (general path)" : " (band selections)";
        EXPECT_FALSE(other.fast_path);
        if (path == cpu::SamplerPath::bands) {
          EXPECT_FALSE(other.list_cut);
        }
        EXPECT_EQ(token2, token) << c.label << name;
        EXPECT_EQ(other.survivors, fast.survivors) << c.label << name;
        EXPECT_EQ(other.masses, fast.masses) << c.label << name;
        EXPECT_EQ(other.z, fast.z) << c.label << name;
      }
    }
    if (::testing::Test::HasFailure()) break;  // one case's details are enough
  }
  return tally;
}

TEST(CpuSampler, EveryStageAloneAndCombinedMatchesTheReference) {
  Rng rng(7010);
  Tally total;
  for (int64_t vocab : {1, 2, 3, 63, 64, 65, 1000, 4096}) {
    const Tally t = run_cases(stage_cases(rng, vocab, vocab <= 65 ? 6 : 3));
    total.exact += t.exact;
    total.boundary += t.boundary;
  }
  std::printf("[ref] cpu sample vs reference: %d exact, %d within %.0e of a boundary\n",
              total.exact, total.boundary, kBoundaryTol);
  // Boundaries are rare: u or a cut must fall within 1e-5 of one.
  EXPECT_LT(total.boundary * 50, total.exact + total.boundary);
  EXPECT_GT(total.exact, 2000);
}

TEST(CpuSampler, ProductionVocabularyMatchesTheReference) {
  Rng rng(7011);
  std::vector<SamplerCase> cases;
  for (int stages : {0, int{kTopK} | kTopP, int{kAllSampled}, int{kTopP}, int{kMinP}, int{kGreedy}}) {
    for (int kind : {int{kNormal}, int{kTies}, int{kSpecial}}) {
      cases.push_back(random_case(rng, 248'320, kind, stages));
    }
  }
  // The performance target's parameters, and a large k through the general path.
  SamplerCase target = random_case(rng, 248'320, kNormal, 0);
  target.params.top_k = 20;
  target.params.top_p = 0.95f;
  cases.push_back(target);
  target.params.top_k = 5000;
  cases.push_back(target);
  const Tally t = run_cases(cases);
  EXPECT_EQ(t.exact + t.boundary, static_cast<int>(cases.size()));
}

TEST(CpuSampler, ThreadsChangeNothing) {
  // The passes over the vocabulary split over a pool: the same processed logits, survivors,
  // masses and token as on one thread, for every path.
  Rng rng(7015);
  ThreadPool pool(3);
  cpu::SamplerWork one;
  cpu::SamplerWork many;
  for (int stages : {0, int{kTopP}, int{kTopK} | kTopP, int{kAllSampled}, int{kMinP}}) {
    const SamplerCase c = random_case(rng, 248'320, stages % 2 == 0 ? kNormal : kTies, stages);
    for (cpu::SamplerPath path : {cpu::SamplerPath::automatic, cpu::SamplerPath::bands}) {
      cpu::SamplerTrace a;
      cpu::SamplerTrace b;
      const int32_t ta = cpu::sample_row(c.logits.data(), c.vocab(), c.params, c.counts.data(),
                                         c.prompt_seen.data(), c.step, one, &a, path);
      const int32_t tb = cpu::sample_row(c.logits.data(), c.vocab(), c.params, c.counts.data(),
                                         c.prompt_seen.data(), c.step, many, &b, path, &pool);
      EXPECT_EQ(ta, tb) << c.label;
      EXPECT_EQ(one.processed, many.processed) << c.label;
      EXPECT_EQ(a.survivors, b.survivors) << c.label;
      EXPECT_EQ(a.masses, b.masses) << c.label;
      EXPECT_EQ(a.z, b.z) << c.label;
    }
  }
  const std::vector<float> logits = random_logits(rng, 248'320, kNormal);
  int32_t ra[TokenRecordLayout::kWords];
  int32_t rb[TokenRecordLayout::kWords];
  cpu::token_logprobs_row(logits.data(), 248'320, 5, 20, one, ra);
  cpu::token_logprobs_row(logits.data(), 248'320, 5, 20, many, rb, &pool);
  EXPECT_TRUE(std::equal(ra, ra + TokenRecordLayout::kWords, rb));
}

TEST(CpuSampler, TemperatureZeroIsTheArgmaxOfTheProcessedLogitsExactly) {
  Rng rng(7012);
  auto be = cpu();
  cpu::SamplerWork work;
  for (int n = 0; n < 300; ++n) {
    const int64_t vocab = 1 + rng.below(3000);
    const int kinds[] = {kNormal, kTies, kSpecial, kConstant};
    SamplerCase c = random_case(rng, vocab, kinds[n % 4], kGreedy | (n % 2 == 0 ? kAllSampled : 0));
    c.params.temperature = 0.0f;
    const ref::SampleResult want = c.reference();
    const int32_t token = cpu::sample_row(c.logits.data(), vocab, c.params, c.counts.data(),
                                          c.prompt_seen.data(), c.step, work);
    int32_t argmax = -1;
    be->argmax(want.processed.data(), 1, vocab, &argmax);
    ASSERT_EQ(token, want.token) << c.label;
    ASSERT_EQ(token, argmax) << c.label;
  }
  // Ties: the lowest id; all -inf: id 0, whatever the temperature.
  const std::vector<float> ties = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  const std::vector<int32_t> zeros(5, 0);
  SamplerParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(cpu::sample_row(ties.data(), 5, p, zeros.data(), zeros.data(), 0, work), 1);
  const std::vector<float> none(5, -kInf);
  p.temperature = 1.0f;
  EXPECT_EQ(cpu::sample_row(none.data(), 5, p, zeros.data(), zeros.data(), 0, work), 0);
}

TEST(CpuSampler, NeutralStagesChangeNothingAndTopKOneIsTheArgmax) {
  Rng rng(7013);
  cpu::SamplerWork work;
  for (int n = 0; n < 200; ++n) {
    SamplerCase c = random_case(rng, 2000, n % kLogitKinds, 0);
    // Explicit neutral values: the processed logits are the (sanitised) logits themselves.
    c.params.repetition_penalty = 1.0f;
    c.params.top_k = n % 2 == 0 ? 0 : 2000;
    c.params.top_p = 1.0f;
    c.params.min_p = 0.0f;
    cpu::sample_row(c.logits.data(), 2000, c.params, c.counts.data(), c.prompt_seen.data(), c.step, work);
    for (size_t i = 0; i < c.logits.size(); ++i) {
      const float l = c.logits[i];
      const float want = std::isnan(l) ? -kInf : (l > FLT_MAX ? FLT_MAX : l);
      ASSERT_TRUE(work.processed[i] == want) << i << ": " << work.processed[i] << " vs " << want;
    }
    // top_k = 1 draws the argmax (lowest id on ties) whatever u is.
    c.params.top_k = 1;
    const ref::SampleResult want = c.reference();
    c.params.temperature = 0.0f;
    const ref::SampleResult greedy = c.reference();
    c.params.temperature = 1.0f;
    EXPECT_EQ(cpu::sample_row(c.logits.data(), 2000, c.params, c.counts.data(), c.prompt_seen.data(),
                              c.step, work),
              greedy.token);
    EXPECT_EQ(want.token, greedy.token);
  }
}

TEST(CpuSampler, StagesCutWhereTheContractSays) {
  // Hand-made: logits ln(4), ln(2), ln(1), ln(1) -> masses 4, 2, 1, 1 (sum 8) at T = 1.
  const std::vector<float> logits = {std::log(1.0f), std::log(4.0f), std::log(1.0f), std::log(2.0f)};
  const std::vector<int32_t> zeros(4, 0);
  cpu::SamplerWork work;
  const auto survivors = [&](SamplerParams p) {
    cpu::SamplerTrace t;
    cpu::sample_row(logits.data(), 4, p, zeros.data(), zeros.data(), 0, work, &t);
    return t.survivors;
  };
  SamplerParams p;
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{0, 1, 2, 3}));
  p.top_k = 2;  // the two largest
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{1, 3}));
  p.top_k = 3;  // ties at 1: the lower id (0) first
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{0, 1, 3}));
  p.top_k = 0;
  p.top_p = 0.49f;  // 4/8 reaches it (the masses are 4:2:1:1 only to ~1e-7)
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{1}));
  p.top_p = 0.51f;
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{1, 3}));
  p.top_p = 0.8f;  // 7/8 with the first of the tied ones
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{0, 1, 3}));
  p.top_p = 1.0f;
  p.min_p = 0.45f;  // p >= 0.45 p_max
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{1, 3}));
  p.min_p = 0.26f;
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{1, 3}));
  p.min_p = 0.24f;
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{0, 1, 2, 3}));
  p.top_k = 3;
  p.top_p = 0.6f;  // top_p over top_k's mass (7): 4/7 < 0.6 <= 6/7
  p.min_p = 0.0f;
  EXPECT_EQ(survivors(p), (std::vector<int32_t>{1, 3}));
}

TEST(CpuSampler, TheDrawPicksTheIdWhoseShareHoldsU) {
  // Masses 4, 2, 1, 1 of 8 in id order 1, 3, 0, 2 -> shares [0, 1/8), [1/8, 5/8), [5/8, 6/8),
  // [6/8, 1) for ids 0, 1, 2, 3. Seeds picked for u in each share.
  const std::vector<float> logits = {std::log(1.0f), std::log(4.0f), std::log(1.0f), std::log(2.0f)};
  const std::vector<int32_t> zeros(4, 0);
  cpu::SamplerWork work;
  int seen[4] = {};
  for (uint32_t seed = 0; seed < 400; ++seed) {
    SamplerParams p;
    p.seed_lo = seed;
    const auto u = static_cast<double>(sampler_uniform(seed, 0, 9));
    const int want = u < 0.125 ? 0 : u < 0.625 ? 1 : u < 0.75 ? 2 : 3;
    ASSERT_EQ(cpu::sample_row(logits.data(), 4, p, zeros.data(), zeros.data(), 9, work), want) << u;
    ++seen[want];
  }
  for (int id = 0; id < 4; ++id) EXPECT_GT(seen[id], 20) << id;
}

TEST(CpuSampler, SampleUpdatesCountsAndStepAndIsDeterministic) {
  Rng rng(7014);
  auto be = cpu();
  const int64_t vocab = 3000;
  SamplerCase c = random_case(rng, vocab, kNormal, kTopP | kFreqPresence);
  c.logits = rng.uniform_vector(static_cast<size_t>(vocab), -1.0f, 1.0f);  // many likely ids
  c.params.temperature = 1.3f;
  c.params.top_p = 0.9f;
  SamplerBuffers buf;
  buf.params = be->alloc_i32(static_cast<size_t>(kSamplerParamWords));
  buf.counts = be->alloc_i32(static_cast<size_t>(vocab));
  buf.prompt_seen = be->alloc_i32(static_cast<size_t>(vocab));
  buf.step = be->alloc_i32(1);
  std::memcpy(buf.params, static_cast<const void*>(&c.params), sizeof c.params);
  std::copy(c.prompt_seen.begin(), c.prompt_seen.end(), buf.prompt_seen);
  int32_t* token = be->alloc_i32(1);
  std::vector<int32_t> counts(static_cast<size_t>(vocab), 0);
  std::vector<int32_t> tokens;
  cpu::SamplerWork work;
  for (int step = 0; step < 30; ++step) {
    // The reference draw from the same state: counts so far, step = draws so far.
    const int32_t want = cpu::sample_row(c.logits.data(), vocab, c.params, counts.data(),
                                         c.prompt_seen.data(), static_cast<uint32_t>(step), work);
    be->sample(c.logits.data(), vocab, buf, token);
    ASSERT_EQ(*token, want) << "step " << step;
    ++counts[static_cast<size_t>(want)];
    ASSERT_EQ(*buf.step, step + 1);
    ASSERT_TRUE(std::equal(counts.begin(), counts.end(), buf.counts)) << "step " << step;
    tokens.push_back(*token);
  }
  EXPECT_GT(std::set<int32_t>(tokens.begin(), tokens.end()).size(), 3u) << "the draws should vary";
  // The step counter wraps as an unsigned number.
  *buf.step = -1;
  be->sample(c.logits.data(), vocab, buf, token);
  EXPECT_EQ(*buf.step, 0);
}

TEST(CpuSampler, RejectsBadArguments) {
  auto be = cpu();
  const int64_t vocab = 100;
  std::vector<float> logits(static_cast<size_t>(vocab), 0.5f);
  SamplerBuffers buf;
  buf.params = be->alloc_i32(static_cast<size_t>(kSamplerParamWords));
  buf.counts = be->alloc_i32(static_cast<size_t>(vocab));
  buf.prompt_seen = be->alloc_i32(static_cast<size_t>(vocab));
  buf.step = be->alloc_i32(1);
  int32_t token = -1;
  const auto try_params = [&](const SamplerParams& p) {
    std::memcpy(buf.params, static_cast<const void*>(&p), sizeof p);
    be->sample(logits.data(), vocab, buf, &token);
  };
  SamplerParams good;
  EXPECT_NO_THROW(try_params(good));
  const auto expect_rejected = [&](const SamplerParams& p, const std::string& what) {
    try {
      try_params(p);
      ADD_FAILURE() << what << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  SamplerParams p = good;
  for (float t : {-1.0f, 2.5f, std::numeric_limits<float>::quiet_NaN()}) {
    p.temperature = t;
    expect_rejected(p, "temperature");
  }
  p = good;
  for (float v : {0.0f, 1.5f}) {
    p.top_p = v;
    expect_rejected(p, "top_p");
  }
  p = good;
  p.top_k = -1;
  expect_rejected(p, "top_k");
  p = good;
  p.min_p = 1.5f;
  expect_rejected(p, "min_p");
  p = good;
  p.presence_penalty = 3.0f;
  expect_rejected(p, "presence_penalty");
  p = good;
  p.frequency_penalty = -2.5f;
  expect_rejected(p, "frequency_penalty");
  p = good;
  p.repetition_penalty = 0.0f;
  expect_rejected(p, "repetition_penalty");
  p = good;
  p.top_logprobs = 21;
  expect_rejected(p, "top_logprobs");
  p = good;
  p.bias_count = kMaxLogitBias + 1;
  expect_rejected(p, "bias_count");
  p = good;
  p.bias_count = 1;
  p.bias_ids[0] = static_cast<int32_t>(vocab);
  expect_rejected(p, "bias_ids[0] = 100");
  p.bias_ids[0] = 3;
  p.bias_values[0] = 101.0f;
  expect_rejected(p, "bias_values[0]");
  p = good;
  p.bias_count = 3;
  p.bias_ids[0] = 7;
  p.bias_ids[1] = 9;
  p.bias_ids[2] = 7;
  expect_rejected(p, "holds 7 twice");
  // Buffers and sizes.
  std::memcpy(buf.params, static_cast<const void*>(&good), sizeof good);
  EXPECT_THROW(be->sample(nullptr, vocab, buf, &token), std::invalid_argument);
  EXPECT_THROW(be->sample(logits.data(), vocab, buf, nullptr), std::invalid_argument);
  SamplerBuffers missing = buf;
  missing.counts = nullptr;
  EXPECT_THROW(be->sample(logits.data(), vocab, missing, &token), std::invalid_argument);
  EXPECT_THROW(be->sample(logits.data(), 0, buf, &token), std::invalid_argument);
  EXPECT_THROW(be->sample(logits.data(), kMaxSamplerVocab + 1, buf, &token), std::invalid_argument);
  // token_logprobs and the word reads.
  int32_t record[TokenRecordLayout::kWords];
  int32_t bad_token = static_cast<int32_t>(vocab);
  EXPECT_THROW(be->token_logprobs(logits.data(), vocab, &bad_token, buf, record), std::invalid_argument);
  bad_token = -1;
  EXPECT_THROW(be->token_logprobs(logits.data(), vocab, &bad_token, buf, record), std::invalid_argument);
  EXPECT_THROW(be->token_logprobs(logits.data(), vocab, &token, buf, nullptr), std::invalid_argument);
  EXPECT_THROW(be->read_words_async(record, 5, 2), std::invalid_argument);
  EXPECT_THROW(be->read_words_async(record, 0, 0), std::invalid_argument);
  EXPECT_THROW(be->read_words_async(record, TokenRecordLayout::kWords + 1, 0), std::invalid_argument);
  EXPECT_THROW(be->wait_read_words(-1), std::invalid_argument);
}

// ---- token_logprobs --------------------------------------------------------------------------

float record_float(const int32_t* record, int at) {
  float f;
  std::memcpy(&f, record + at, sizeof f);
  return f;
}

TEST(CpuTokenLogprobs, MatchesTheReference) {
  Rng rng(7020);
  auto be = cpu();
  double worst = 0;
  for (int64_t vocab : {1, 2, 20, 21, 100, 4096, 248'320}) {
    for (int kind = 0; kind < kLogitKinds; ++kind) {
      const std::vector<float> logits = random_logits(rng, vocab, kind);
      for (int n : {-1, 0, 1, 5, 20}) {
        SamplerParams p;
        p.top_logprobs = n;
        std::vector<int32_t> words(static_cast<size_t>(kSamplerParamWords));
        std::memcpy(words.data(), static_cast<const void*>(&p), sizeof p);
        SamplerBuffers buf;
        buf.params = words.data();
        const int32_t token = rng.below(static_cast<int32_t>(vocab));
        std::vector<int32_t> record(TokenRecordLayout::kWords, -7);
        be->token_logprobs(logits.data(), vocab, &token, buf, record.data());
        const int want_n = static_cast<int>(std::min<int64_t>(std::max(n, 0), vocab));
        const ref::LogprobRecord want = ref::token_logprobs(logits, token, want_n);
        const std::string label = "vocab " + std::to_string(vocab) + " kind " + std::to_string(kind) +
                                  " n " + std::to_string(n);
        ASSERT_EQ(record[TokenRecordLayout::kToken], token) << label;
        ASSERT_EQ(record[TokenRecordLayout::kTopCount], want_n) << label;
        const auto close = [&](float got_value, double expect) {
          const auto got = static_cast<double>(got_value);
          // The record holds floats: a logprob below -FLT_MAX is -inf there.
          if (std::isinf(static_cast<float>(expect))) return got == static_cast<double>(static_cast<float>(expect));
          worst = std::max(worst, std::abs(got - expect));
          return std::abs(got - expect) <= 1e-5 * std::max(1.0, std::abs(expect));
        };
        EXPECT_TRUE(close(record_float(record.data(), TokenRecordLayout::kLogprob), want.logprob))
            << label << ": " << record_float(record.data(), TokenRecordLayout::kLogprob) << " vs "
            << want.logprob;
        for (int j = 0; j < want_n; ++j) {
          EXPECT_EQ(record[static_cast<size_t>(TokenRecordLayout::kTopIds + j)],
                    want.top_ids[static_cast<size_t>(j)])
              << label << " top " << j;
          EXPECT_TRUE(close(record_float(record.data(), TokenRecordLayout::kTopLogprobs + j),
                            want.top_logprobs[static_cast<size_t>(j)]))
              << label << " top " << j;
        }
        for (int j = want_n; j < kMaxTopLogprobs; ++j) {
          EXPECT_EQ(record[static_cast<size_t>(TokenRecordLayout::kTopIds + j)], 0) << label;
        }
      }
    }
  }
  std::printf("[ref] cpu token_logprobs: max |error| %.3g\n", worst);
}

TEST(CpuReadWords, CopiesIntoTheSlotUntilItIsUsedAgain) {
  auto be = cpu();
  std::vector<int32_t> a(TokenRecordLayout::kWords);
  std::vector<int32_t> b(TokenRecordLayout::kWords);
  for (int i = 0; i < TokenRecordLayout::kWords; ++i) {
    a[static_cast<size_t>(i)] = i + 1;
    b[static_cast<size_t>(i)] = -i;
  }
  be->read_words_async(a.data(), TokenRecordLayout::kWords, 0);
  be->read_words_async(b.data(), 3, 1);
  a[0] = 99;  // the copy was taken when the read was enqueued
  const int32_t* slot0 = be->wait_read_words(0);
  const int32_t* slot1 = be->wait_read_words(1);
  EXPECT_EQ(slot0[0], 1);
  EXPECT_EQ(slot0[TokenRecordLayout::kWords - 1], TokenRecordLayout::kWords);
  EXPECT_EQ(slot1[2], -2);
}

}  // namespace
}  // namespace lily::testing

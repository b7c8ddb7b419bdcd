// CUDA sampler ops vs the CPU (exactly) and the float64 reference: every stage, every selection path, graph replay.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cuda_test_support.h"
#include "ref/reference_sampler.h"
#include "sampler_test_support.h"

namespace lily::testing {
namespace {

constexpr int64_t kVocab = 248'320;

// A case's buffers in device memory.
struct DeviceCase {
  float* logits = nullptr;
  SamplerBuffers buffers;
  int32_t* token = nullptr;
};

void put_params(Backend& be, const SamplerParams& p, int32_t* params) {
  std::vector<int32_t> words(static_cast<size_t>(kSamplerParamWords));
  std::memcpy(words.data(), static_cast<const void*>(&p), sizeof p);
  be.copy_from_host(words.data(), words.size(), params);
}

DeviceCase upload(Backend& be, const SamplerCase& c) {
  DeviceCase d;
  d.logits = to_device(be, c.logits);
  d.buffers.params = be.alloc_i32(static_cast<size_t>(kSamplerParamWords));
  put_params(be, c.params, d.buffers.params);
  d.buffers.counts = to_device(be, c.counts);
  d.buffers.prompt_seen = to_device(be, c.prompt_seen);
  const std::vector<int32_t> step = {static_cast<int32_t>(c.step)};
  d.buffers.step = to_device(be, step);
  d.token = to_device(be, std::vector<int32_t>{-1});
  return d;
}

struct Tally {
  int exact = 0;
  int boundary = 0;
};

// Draws every case on the device and checks: the CPU's token exactly (same processed logits,
// same integer masses), the reference's but for a decision within kBoundaryTol, counts[token]
// and step advanced on the device and nothing else touched.
Tally run_cases(Backend& be, const std::vector<SamplerCase>& cases) {
  Tally tally;
  cpu::SamplerWork work;
  for (const SamplerCase& c : cases) {
    const DeviceCase d = upload(be, c);
    be.sample(d.logits, c.vocab(), d.buffers, d.token);
    const int32_t token = to_host(be, d.token, 1)[0];
    const int32_t want = cpu::sample_row(c.logits.data(), c.vocab(), c.params, c.counts.data(),
                                         c.prompt_seen.data(), c.step, work);
    EXPECT_EQ(token, want) << c.label << " (cuda vs cpu)";
    const Agreement a = check_draw(c, c.reference(), token, nullptr);
    ++(a == Agreement::exact ? tally.exact : tally.boundary);
    if (token >= 0 && token < c.vocab()) {
      std::vector<int32_t> counts = c.counts;
      ++counts[static_cast<size_t>(token)];
      EXPECT_EQ(to_host(be, d.buffers.counts, counts.size()), counts) << c.label;
    }
    EXPECT_EQ(static_cast<uint32_t>(to_host(be, d.buffers.step, 1)[0]), c.step + 1u) << c.label;
    if (::testing::Test::HasFailure()) break;  // one case's details are enough
  }
  return tally;
}

TEST(CudaSampler, EveryStageOnSmallAndOddVocabularies) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(8001);
  Tally total;
  for (int64_t vocab : {1, 2, 3, 64, 65, 2047, 2048, 2049, 4096, 10'000}) {
    const Tally t = run_cases(*be, stage_cases(rng, vocab, vocab <= 65 ? 3 : 1));
    total.exact += t.exact;
    total.boundary += t.boundary;
  }
  std::printf("[ref] cuda sample (small vocabularies): %d exact, %d within %.0e of a boundary\n",
              total.exact, total.boundary, kBoundaryTol);
  EXPECT_LT(total.boundary * 50, total.exact + total.boundary);
}

TEST(CudaSampler, ProductionVocabularyEveryStageAndLogitShape) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(8002);
  std::vector<SamplerCase> cases;
  for (int stages : {0, int{kRepetition} | kFreqPresence | kBias, int{kTopK}, int{kTopP},
                     int{kMinP}, int{kTopK} | kTopP, int{kAllSampled}, int{kGreedy}}) {
    for (int kind = 0; kind < kLogitKinds; ++kind) cases.push_back(random_case(rng, kVocab, kind, stages));
  }
  // The performance target's parameters.
  SamplerCase target = random_case(rng, kVocab, kNormal, 0);
  target.params.temperature = 1.0f;
  target.params.top_k = 20;
  target.params.top_p = 0.95f;
  cases.push_back(target);
  const Tally t = run_cases(*be, cases);
  std::printf("[ref] cuda sample (vocab 248320): %d exact, %d within %.0e of a boundary\n", t.exact,
              t.boundary, kBoundaryTol);
}

TEST(CudaSampler, SelectionsForLargeTopKNucleiAndRunsOfEqualLogits) {
  // Every way the device finds a cut: the top-k lists (k <= 64), a top_p cut among the first 64
  // ids, and the radix selections (histogram rounds, gathering, runs of equal logits resolved
  // by id) for stage 5 and then stage 7; vocabularies past 128 spans have no lists at all.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(8003);
  std::vector<SamplerCase> cases;
  for (int64_t vocab : {kVocab, int64_t{300'000}}) {
    for (int32_t k : {20, 64, 65, 100, 1000, 8192, 8193, 50'000, 200'000}) {
      for (float top_p : {1.0f, 0.95f, 0.5f}) {
        for (int kind : {int{kNormal}, int{kTies}, int{kWide}}) {
          SamplerCase c = random_case(rng, vocab, kind, kTopK | kTopP);
          c.params.top_k = k;
          c.params.top_p = top_p;
          c.params.temperature = kind == kTies ? 1.0f : 2.0f;  // flat: large nuclei
          cases.push_back(c);
        }
      }
    }
    for (float top_p : {0.999999f, 0.99f, 0.6f}) {
      for (int kind : {int{kNormal}, int{kTies}, int{kWide}, int{kConstant}}) {
        SamplerCase c = random_case(rng, vocab, kind, kTopP | kMinP);
        c.params.top_p = top_p;
        c.params.min_p = kind == kWide ? 0.0f : c.params.min_p;
        cases.push_back(c);
      }
    }
  }
  const Tally t = run_cases(*be, cases);
  std::printf("[ref] cuda sample (selections): %d exact, %d within %.0e of a boundary\n", t.exact,
              t.boundary, kBoundaryTol);
}

TEST(CudaSampler, CountsAndStepAdvanceOverASequence) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(8004);
  SamplerCase c = random_case(rng, kVocab, kNormal, kFreqPresence | kRepetition | kTopP);
  c.logits = rng.uniform_vector(static_cast<size_t>(kVocab), -2.0f, 2.0f);
  c.params.temperature = 1.0f;
  c.params.frequency_penalty = 2.0f;  // strong: the counts must reach the penalties
  const DeviceCase d = upload(*be, c);
  cpu::SamplerWork work;
  std::vector<int32_t> counts = c.counts;
  for (uint32_t i = 0; i < 25; ++i) {
    be->sample(d.logits, kVocab, d.buffers, d.token);
    const int32_t want = cpu::sample_row(c.logits.data(), kVocab, c.params, counts.data(),
                                         c.prompt_seen.data(), c.step + i, work);
    ASSERT_EQ(to_host(*be, d.token, 1)[0], want) << "draw " << i;
    ++counts[static_cast<size_t>(want)];
  }
  EXPECT_EQ(to_host(*be, d.buffers.counts, counts.size()), counts);
  EXPECT_EQ(static_cast<uint32_t>(to_host(*be, d.buffers.step, 1)[0]), c.step + 25u);
}

TEST(CudaSampler, GraphReplayReadsParamsCountsAndStepFromDeviceMemory) {
  // sample and token_logprobs captured once, replayed with the parameters, counts and step
  // rewritten in device memory between replays: every replay is the CPU's draw for that state,
  // and its record (read after the replay) names it.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  if (!be->can_capture()) GTEST_SKIP() << "backend cannot capture";
  Rng rng(8005);
  SamplerCase c = random_case(rng, kVocab, kNormal, 0);
  const DeviceCase d = upload(*be, c);
  int32_t* record = be->alloc_i32(TokenRecordLayout::kWords);
  be->sample(d.logits, kVocab, d.buffers, d.token);  // eager: sizes the scratch
  be->token_logprobs(d.logits, kVocab, d.token, d.buffers, record);
  be->synchronize();
  be->begin_capture();
  be->sample(d.logits, kVocab, d.buffers, d.token);
  be->token_logprobs(d.logits, kVocab, d.token, d.buffers, record);
  const int graph = be->end_capture();
  std::vector<int32_t> counts = to_host(*be, d.buffers.counts, static_cast<size_t>(kVocab));
  uint32_t step = static_cast<uint32_t>(to_host(*be, d.buffers.step, 1)[0]);
  cpu::SamplerWork work;
  const int stage_sets[] = {0, kTopK | kTopP, kGreedy, kAllSampled, kTopP, kMinP, kTopK};
  for (int r = 0; r < 28; ++r) {
    const SamplerCase next = random_case(rng, kVocab, kNormal, stage_sets[r % 7]);
    SamplerParams p = next.params;
    if (r % 7 == 6) p.top_k = 5000;  // the selection rounds inside the graph
    if (r % 4 == 0) {
      // A new sequence: fresh counts and step.
      counts.assign(static_cast<size_t>(kVocab), 0);
      step = next.step;
      be->copy_from_host(counts.data(), counts.size(), d.buffers.counts);
      const auto s = static_cast<int32_t>(step);
      be->copy_from_host(&s, 1, d.buffers.step);
    }
    put_params(*be, p, d.buffers.params);
    be->replay(graph);
    be->read_words_async(record, TokenRecordLayout::kWords, r % 2);  // after it, as the model does
    const int32_t* words = be->wait_read_words(r % 2);
    const int32_t want = cpu::sample_row(c.logits.data(), kVocab, p, counts.data(),
                                         c.prompt_seen.data(), step, work);
    ASSERT_EQ(words[TokenRecordLayout::kToken], want) << "replay " << r;
    ASSERT_EQ(to_host(*be, d.token, 1)[0], want) << "replay " << r;
    const int n = std::max(p.top_logprobs, 0);
    ASSERT_EQ(words[TokenRecordLayout::kTopCount], n) << "replay " << r;
    ++counts[static_cast<size_t>(want)];
    ++step;
    ASSERT_EQ(static_cast<uint32_t>(to_host(*be, d.buffers.step, 1)[0]), step) << "replay " << r;
  }
  EXPECT_EQ(to_host(*be, d.buffers.counts, counts.size()), counts);
}

float record_float(const int32_t* record, int at) {
  float f;
  std::memcpy(&f, record + at, sizeof f);
  return f;
}

TEST(CudaTokenLogprobs, MatchesTheReference) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(8006);
  double worst = 0;
  for (int64_t vocab : {int64_t{1}, int64_t{20}, int64_t{2049}, kVocab, int64_t{300'000}}) {
    for (int kind = 0; kind < kLogitKinds; ++kind) {
      const std::vector<float> logits = random_logits(rng, vocab, kind);
      float* dev_logits = to_device(*be, logits);
      for (int n : {-1, 0, 1, 7, 20}) {
        SamplerParams p;
        p.top_logprobs = n;
        SamplerBuffers buf;
        buf.params = be->alloc_i32(static_cast<size_t>(kSamplerParamWords));
        put_params(*be, p, buf.params);
        const int32_t token = rng.below(static_cast<int32_t>(vocab));
        const int32_t* dev_token = to_device(*be, std::vector<int32_t>{token});
        int32_t* record = to_device(*be, std::vector<int32_t>(TokenRecordLayout::kWords, -7));
        be->token_logprobs(dev_logits, vocab, dev_token, buf, record);
        const std::vector<int32_t> got = to_host(*be, record, TokenRecordLayout::kWords);
        const int want_n = static_cast<int>(std::min<int64_t>(std::max(n, 0), vocab));
        const ref::LogprobRecord want = ref::token_logprobs(logits, token, want_n);
        const std::string label = "vocab " + std::to_string(vocab) + " kind " +
                                  std::to_string(kind) + " n " + std::to_string(n);
        ASSERT_EQ(got[TokenRecordLayout::kToken], token) << label;
        ASSERT_EQ(got[TokenRecordLayout::kTopCount], want_n) << label;
        const auto close = [&](float got_value, double expect) {
          const auto value = static_cast<double>(got_value);
          if (std::isinf(static_cast<float>(expect))) return value == static_cast<double>(static_cast<float>(expect));
          worst = std::max(worst, std::abs(value - expect));
          return std::abs(value - expect) <= 1e-5 * std::max(1.0, std::abs(expect));
        };
        EXPECT_TRUE(close(record_float(got.data(), TokenRecordLayout::kLogprob), want.logprob))
            << label << ": " << record_float(got.data(), TokenRecordLayout::kLogprob) << " vs "
            << want.logprob;
        for (int j = 0; j < want_n; ++j) {
          EXPECT_EQ(got[static_cast<size_t>(TokenRecordLayout::kTopIds + j)],
                    want.top_ids[static_cast<size_t>(j)])
              << label << " top " << j;
          EXPECT_TRUE(close(record_float(got.data(), TokenRecordLayout::kTopLogprobs + j),
                            want.top_logprobs[static_cast<size_t>(j)]))
              << label << " top " << j;
        }
      }
    }
  }
  std::printf("[ref] cuda token_logprobs: max |error| %.3g\n", worst);
}

TEST(CudaReadWords, DeliversTheWordsOfEachSlot) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  std::vector<int32_t> a(TokenRecordLayout::kWords);
  std::vector<int32_t> b(TokenRecordLayout::kWords);
  for (int i = 0; i < TokenRecordLayout::kWords; ++i) {
    a[static_cast<size_t>(i)] = 1000 + i;
    b[static_cast<size_t>(i)] = -i;
  }
  int32_t* da = to_device(*be, a);
  int32_t* db = to_device(*be, b);
  be->read_words_async(da, TokenRecordLayout::kWords, 0);
  be->read_words_async(db, 5, 1);
  const int32_t* s1 = be->wait_read_words(1);
  EXPECT_EQ(std::vector<int32_t>(s1, s1 + 5), std::vector<int32_t>(b.begin(), b.begin() + 5));
  const int32_t* s0 = be->wait_read_words(0);
  EXPECT_EQ(std::vector<int32_t>(s0, s0 + TokenRecordLayout::kWords), a);
  EXPECT_THROW(be->read_words_async(da, 0, 0), std::invalid_argument);
  EXPECT_THROW(be->read_words_async(da, TokenRecordLayout::kWords + 1, 0), std::invalid_argument);
  EXPECT_THROW(be->read_words_async(da, 3, 2), std::invalid_argument);
  EXPECT_THROW(be->wait_read_words(-1), std::invalid_argument);
}

TEST(CudaSampler, RejectsWhatItCannotServe) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(8007);
  const SamplerCase c = random_case(rng, 100, kNormal, 0);
  const DeviceCase d = upload(*be, c);
  EXPECT_THROW(be->sample(nullptr, 100, d.buffers, d.token), std::invalid_argument);
  EXPECT_THROW(be->sample(d.logits, 100, d.buffers, nullptr), std::invalid_argument);
  SamplerBuffers missing = d.buffers;
  missing.step = nullptr;
  EXPECT_THROW(be->sample(d.logits, 100, missing, d.token), std::invalid_argument);
  EXPECT_THROW(be->sample(d.logits, 0, d.buffers, d.token), std::invalid_argument);
  EXPECT_THROW(be->sample(d.logits, kMaxSamplerVocab + 1, d.buffers, d.token), std::invalid_argument);
  int32_t* record = be->alloc_i32(TokenRecordLayout::kWords);
  EXPECT_THROW(be->token_logprobs(d.logits, 100, nullptr, d.buffers, record), std::invalid_argument);
  EXPECT_THROW(be->token_logprobs(d.logits, 100, d.token, d.buffers, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace lily::testing

// The engine with sequences: sampling by seed, temperature 0 vs argmax, stop strings, logprobs, deltas, fed counts.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../model/tiny_model_fixture.h"
#include "engine/engine.h"
#include "engine/session_cache.h"
#include "text/tokenizer.h"

namespace lily {
namespace {

constexpr int64_t kMaxSeq = 160;

testing::TinyModel& tiny() { return testing::tiny_model(); }
// The tiny model's own tokenizer.json.
const Tokenizer& tokenizer() {
  static const Tokenizer t =
      Tokenizer::from_file((std::filesystem::path(tiny().checkpoint.dir) / "tokenizer.json").string());
  return t;
}

std::vector<int32_t> prompt_ids() {
  const std::vector<uint32_t> ids = tokenizer().encode("<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\n");
  return {ids.begin(), ids.end()};
}

struct Outcome {
  EngineResult result;
  std::vector<SequenceDelta> deltas;
};

// One request through a fresh engine and cache (no reuse between runs).
Outcome run(SequenceConfig config, std::vector<int32_t> prompt = prompt_ids()) {
  SessionCache cache(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq);
  Engine engine(tiny().model, cache, 4, &tokenizer());
  auto deltas = std::make_shared<std::vector<SequenceDelta>>();
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.sequence = std::move(config);
  r.on_delta = [deltas](SequenceDelta d) { deltas->push_back(std::move(d)); };
  Submission s = engine.submit(std::move(r));
  EXPECT_EQ(s.status, SubmitStatus::accepted);
  Outcome out{s.result.get(), {}};
  engine.shutdown();
  out.deltas = *deltas;
  EXPECT_TRUE(out.result.ok()) << out.result.error;
  return out;
}

SequenceConfig greedy(int64_t max_tokens) {
  SequenceConfig c;
  c.max_tokens = max_tokens;
  return c;
}

SequenceConfig sampled(int64_t max_tokens, uint64_t seed, float temperature = 1.0f) {
  SequenceConfig c = greedy(max_tokens);
  SamplerParams p;
  p.temperature = temperature;
  p.seed_lo = static_cast<uint32_t>(seed);
  p.seed_hi = static_cast<uint32_t>(seed >> 32);
  c.sampling = p;
  return c;
}

std::string joined(const std::vector<SequenceDelta>& deltas) {
  std::string out;
  for (const SequenceDelta& d : deltas) out += d.text;
  return out;
}

TEST(SequenceEngine, DeltasConcatenateToTheResultTextAndTheDecode) {
  const Outcome r = run(greedy(24));
  EXPECT_EQ(joined(r.deltas), r.result.text);
  const std::vector<uint32_t> ids(r.result.tokens.begin(), r.result.tokens.end());
  EXPECT_EQ(r.result.text, tokenizer().decode(ids, true));
}

TEST(SequenceEngine, SameSeedSameTokensDifferentSeedsDiffer) {
  const Outcome a = run(sampled(16, 42));
  const Outcome b = run(sampled(16, 42));
  EXPECT_EQ(a.result.tokens, b.result.tokens);
  int differing = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    differing += run(sampled(16, seed)).result.tokens != a.result.tokens ? 1 : 0;
  }
  EXPECT_GE(differing, 3);  // the tiny model's distributions are broad at temperature 1
}

TEST(SequenceEngine, TemperatureZeroWithAPenaltyOfZeroIsTheArgmax) {
  // temperature 0 through the sampler op (a neutral penalty field forces the sample path)
  // must give exactly the argmax decode.
  SequenceConfig c = sampled(20, 7, 0.0f);
  c.sampling->presence_penalty = 0.0f;
  const Outcome via_sampler = run(c);
  const Outcome argmax = run(greedy(20));
  EXPECT_EQ(via_sampler.result.tokens, argmax.result.tokens);
}

TEST(SequenceEngine, StopStringEndsTheAnswerBeforeIt) {
  const Outcome full = run(greedy(24));
  // A stop string taken from the middle of the greedy answer's text.
  const std::string& text = full.result.text;
  ASSERT_GE(text.size(), 12u);
  size_t start = text.size() / 2;
  while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
  size_t end = start + 1;
  while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
  const std::string stop = text.substr(start, end - start);  // one whole character
  const size_t first = text.find(stop);
  SequenceConfig c = greedy(24);
  c.stop_strings = {stop};
  const Outcome stopped = run(c);
  EXPECT_EQ(stopped.result.finish_reason, "stop");
  EXPECT_EQ(stopped.result.text, text.substr(0, first));
  EXPECT_EQ(joined(stopped.deltas), stopped.result.text);
  // Generation ended on the token that completed the stop string: a prefix of the full run.
  ASSERT_LE(stopped.result.tokens.size(), full.result.tokens.size());
  EXPECT_TRUE(std::equal(stopped.result.tokens.begin(), stopped.result.tokens.end(),
                         full.result.tokens.begin()));
}

TEST(SequenceEngine, LogprobsOfTheArgmaxAreTheTopEntry) {
  SequenceConfig c = greedy(8);
  c.top_logprobs = 3;
  const Outcome r = run(c);
  ASSERT_EQ(r.result.logprobs.size(), r.result.tokens.size());
  for (size_t i = 0; i < r.result.logprobs.size(); ++i) {
    const TokenLogprobs& e = r.result.logprobs[i];
    EXPECT_EQ(e.token, r.result.tokens[i]);
    ASSERT_EQ(e.top.size(), 3u);
    EXPECT_EQ(e.top[0].first, e.token);  // greedy: the chosen token is the most likely
    EXPECT_FLOAT_EQ(e.top[0].second, e.logprob);
    EXPECT_LE(e.logprob, 0.0f);
    EXPECT_GE(e.top[0].second, e.top[1].second);
    EXPECT_GE(e.top[1].second, e.top[2].second);
  }
  // The same tokens as without logprobs (the record path reads the same argmax).
  EXPECT_EQ(r.result.tokens, run(greedy(8)).result.tokens);
}

TEST(SequenceEngine, SampledLogprobsAreOfTheRawDistribution) {
  SequenceConfig c = sampled(8, 3);
  c.top_logprobs = 0;
  const Outcome r = run(c);
  ASSERT_EQ(r.result.logprobs.size(), r.result.tokens.size());
  double total = 0;
  for (const TokenLogprobs& e : r.result.logprobs) {
    EXPECT_TRUE(e.top.empty());
    EXPECT_LE(e.logprob, 0.0f);
    total += static_cast<double>(e.logprob);
  }
  EXPECT_TRUE(std::isfinite(total));
  EXPECT_EQ(r.result.tokens, run(sampled(8, 3)).result.tokens);  // logprobs change nothing
}

}  // namespace
}  // namespace lily

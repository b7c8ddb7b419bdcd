// generate: the pipelined decode (no top_logits) against the step-by-step one, and Lily's fed-token accounting.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../model/tiny_model_fixture.h"
#include "engine/generator.h"
#include "model/decode_state.h"

namespace lily {
namespace {

constexpr int64_t kMaxSeq = 96;

testing::TinyModel& tiny() { return testing::tiny_model(); }

std::vector<int32_t> prompt_tokens() {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < 11; ++i) p.push_back(5 + 37 * i);
  return p;
}

struct GenerationRun {
  GenerationResult result;
  int64_t position = 0;  // the state's position afterwards
};

// One generation from a fresh state; pipelined unless `stepwise` (top_logits forces it).
// cancel_at >= 0: on_token cancels at that token index.
GenerationRun run_generation(const GenerationOptions& base, bool stepwise, int cancel_at = -1) {
  GenerationOptions options = base;
  options.top_logits = stepwise ? 1 : 0;
  if (cancel_at >= 0) {
    options.on_token = [cancel_at, seen = 0](int32_t, const int32_t*) mutable {
      return seen++ != cancel_at ? TokenAction::proceed : TokenAction::cancel;
    };
  }
  DecodeState state(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq);
  const std::vector<int32_t> prompt = prompt_tokens();
  GenerationRun run{generate(tiny().model, state, prompt, options), 0};
  run.position = state.position;
  return run;
}

// Both loops, with the same options: the same tokens, finish reason and fed count (given),
// and each state holds exactly prompt + fed tokens.
void expect_both(const GenerationOptions& options, const std::string& finish, int64_t fed_pipelined,
                 int64_t fed_stepwise, const std::string& label, int cancel_at = -1) {
  const GenerationRun piped = run_generation(options, false, cancel_at);
  const GenerationRun stepped = run_generation(options, true, cancel_at);
  const auto prompt = static_cast<int64_t>(prompt_tokens().size());
  EXPECT_EQ(piped.result.tokens, stepped.result.tokens) << label;
  EXPECT_EQ(piped.result.finish_reason, finish) << label;
  EXPECT_EQ(stepped.result.finish_reason, finish) << label;
  EXPECT_EQ(piped.result.fed, fed_pipelined) << label;
  EXPECT_EQ(stepped.result.fed, fed_stepwise) << label;
  EXPECT_EQ(piped.position, prompt + piped.result.fed) << label << ": pipelined state";
  EXPECT_EQ(stepped.position, prompt + stepped.result.fed) << label << ": stepwise state";
  EXPECT_TRUE(piped.result.steps.empty()) << label;
}

TEST(Generator, PipelinedDecodeMatchesStepByStep) {
  GenerationOptions options;
  options.max_tokens = 8;
  const GenerationRun reference = run_generation(options, true);
  ASSERT_EQ(reference.result.tokens.size(), 8u);
  const std::vector<int32_t>& t = reference.result.tokens;

  expect_both(options, "length", 7, 7, "length 8");  // the last token is not fed
  options.max_tokens = 1;
  expect_both(options, "length", 0, 0, "length 1");
  options.max_tokens = 2;
  expect_both(options, "length", 1, 1, "length 2");

  // Stops: on token 0 (nothing fed), token 3 (the overshoot step fed it), and the last allowed
  // token (fed as well). A stop id that also occurs earlier in `t` stops there instead, so the
  // expected index is the first occurrence.
  const auto first_index = [&](int32_t id) {
    int64_t i = 0;
    while (t[static_cast<size_t>(i)] != id) ++i;
    return i;
  };
  options.max_tokens = 8;
  options.stop_tokens = {t[0]};
  expect_both(options, "stop", 0, 0, "stop on token 0");
  options.stop_tokens = {t[3]};
  const int64_t s3 = first_index(t[3]);
  expect_both(options, "stop", s3 == 0 ? 0 : s3 + 1, s3 == 0 ? 0 : s3 + 1, "stop on token 3");
  options.max_tokens = 5;
  options.stop_tokens = {t[4]};
  const int64_t s4 = first_index(t[4]);
  expect_both(options, "stop", s4 == 0 ? 0 : s4 + 1, s4 == 0 ? 0 : s4 + 1, "stop on the last allowed token");

  // Cancel at token 2: the pipelined loop had already submitted the step that feeds it.
  options.stop_tokens.clear();
  options.max_tokens = 8;
  expect_both(options, "cancelled", 3, 2, "cancel at token 2", 2);
  // Cancel on the last allowed token: nothing was submitted after it.
  options.max_tokens = 3;
  expect_both(options, "cancelled", 2, 2, "cancel on the last allowed token", 2);
}


// Greedy tokens of a fresh state fed `prompt` (the reference for what follows forced tokens:
// forcing f after the prompt must continue exactly as a prompt that ends with f).
std::vector<int32_t> greedy_after(const std::vector<int32_t>& prompt, int64_t count) {
  GenerationOptions options;
  options.max_tokens = count;
  DecodeState state(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq);
  return generate(tiny().model, state, prompt, options).tokens;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Forced tokens: a prefix replaces the model's first token, a batch handed out after token k
// replaces token k + 1; what follows each batch is the model's greedy continuation of
// prompt + everything before, and the state holds prompt + fed.
TEST(Generator, ForcedTokensReplaceTheModelsChoiceAndContinueFromThem) {
  const std::vector<int32_t> prompt = prompt_tokens();
  const std::vector<int32_t> prefix = {7, 9, 11};
  const std::vector<int32_t> later = {13, 17};
  for (const bool with_prefix : {false, true}) {
    for (const int after : {-1, 0, 2}) {  // -1: no later batch; else after output token `after`
      const std::string label = std::string("prefix ") + (with_prefix ? "yes" : "no") +
                                ", later batch after token " + std::to_string(after);
      GenerationOptions options;
      options.max_tokens = 12;
      std::vector<int32_t> seen;
      options.on_token = [&seen](int32_t token, const int32_t*) {
        seen.push_back(token);
        return TokenAction::proceed;
      };
      int calls = 0;
      bool prefix_given = !with_prefix;
      bool later_given = after < 0;
      options.take_forced = [&]() -> std::vector<int32_t> {
        ++calls;
        if (!prefix_given) {
          prefix_given = true;
          return prefix;
        }
        if (!later_given && static_cast<int>(seen.size()) == after + 1 + (with_prefix ? 3 : 0)) {
          later_given = true;
          return later;
        }
        return {};
      };
      DecodeState state(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq);
      const GenerationResult result = generate(tiny().model, state, prompt, options);

      // The expected tokens, built from fresh greedy runs.
      std::vector<int32_t> expected = with_prefix ? prefix : std::vector<int32_t>();
      const auto fill = [&](size_t until) {
        const std::vector<int32_t> more = greedy_after(
            concat(prompt, expected), static_cast<int64_t>(until - expected.size()));
        expected.insert(expected.end(), more.begin(), more.end());
      };
      if (after >= 0) {
        fill(expected.size() + static_cast<size_t>(after) + 1);
        expected.insert(expected.end(), later.begin(), later.end());
      }
      fill(12);
      EXPECT_EQ(result.tokens, expected) << label;
      EXPECT_EQ(seen, expected) << label << ": on_token saw every token, forced ones too";
      EXPECT_EQ(result.finish_reason, "length") << label;
      EXPECT_EQ(state.position, static_cast<int64_t>(prompt.size()) + result.fed) << label;
      EXPECT_EQ(result.fed, 11) << label;
      EXPECT_GT(calls, 0) << label;
    }
  }
}

// A forced stop token ends generation (every accepted token fed); so does max_tokens reached
// inside a batch.
TEST(Generator, ForcedTokensCanEndTheGeneration) {
  const std::vector<int32_t> prompt = prompt_tokens();
  GenerationOptions options;
  options.max_tokens = 10;
  options.stop_tokens = {3};
  bool given = false;
  options.take_forced = [&given]() -> std::vector<int32_t> {
    if (given) return {};
    given = true;
    return {21, 22, 3, 23};
  };
  DecodeState state(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq);
  GenerationResult result = generate(tiny().model, state, prompt, options);
  EXPECT_EQ(result.tokens, (std::vector<int32_t>{21, 22, 3}));
  EXPECT_EQ(result.finish_reason, "stop");
  EXPECT_EQ(result.fed, 3);
  EXPECT_EQ(state.position, static_cast<int64_t>(prompt.size()) + 3);

  options.max_tokens = 2;
  given = false;
  DecodeState second(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq);
  result = generate(tiny().model, second, prompt, options);
  EXPECT_EQ(result.tokens, (std::vector<int32_t>{21, 22}));
  EXPECT_EQ(result.finish_reason, "length");
  EXPECT_EQ(second.position, static_cast<int64_t>(prompt.size()) + result.fed);

  options.top_logits = 1;  // the stepwise loop has no forcing
  EXPECT_THROW(generate(tiny().model, second, prompt, options), std::invalid_argument);
}

}  // namespace
}  // namespace lily

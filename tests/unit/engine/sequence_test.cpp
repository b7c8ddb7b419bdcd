// Sequence and StopStringMatcher: stop strings across pieces, hold-back, UTF-8, stop tokens, length, records.
#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <string>
#include <vector>

#include "engine/sequence.h"
#include "text/stop_strings.h"
#include "unit/text/test_tokenizers.h"

namespace lily {
namespace {

// The whole text cut at the earliest occurrence of any stop string (a plain whole-text search,
// independent of the matcher's incremental logic).
std::string cut_at_first_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t first = std::string::npos;
  for (const std::string& s : stops) first = std::min(first, text.find(s));
  return first == std::string::npos ? text : text.substr(0, first);
}

TEST(StopStringMatcher, RandomSplitsReleaseTheTextCutAtTheFirstStop) {
  std::mt19937 rng(7);
  const std::string alphabet = "abcAB \n<>/";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int length = static_cast<int>(rng() % 40);
    for (int i = 0; i < length; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    const int count = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < count; ++i) {
      std::string stop;
      const int stop_length = 1 + static_cast<int>(rng() % 4);
      for (int j = 0; j < stop_length; ++j) stop += alphabet[rng() % alphabet.size()];
      stops.push_back(stop);
    }
    StopStringMatcher matcher(stops);
    std::string released;
    bool stopped = false;
    size_t at = 0;
    while (at < text.size() && !stopped) {
      const size_t piece = 1 + rng() % 5;
      StopStringMatcher::Release r = matcher.push(std::string_view(text).substr(at, piece));
      released += r.text;
      stopped = r.stopped;
      at += piece;
    }
    if (!stopped) released += matcher.flush();
    const std::string expected = cut_at_first_stop(text, stops);
    ASSERT_EQ(released, expected) << "text \"" << text << "\" stops " << stops.size();
    bool occurs = false;
    for (const std::string& s : stops) occurs = occurs || text.find(s) != std::string::npos;
    EXPECT_EQ(stopped, occurs);
  }
}

TEST(StopStringMatcher, HoldsBackWhatCouldStillBecomeAStop) {
  StopStringMatcher matcher({"world", "</end>"});
  StopStringMatcher::Release a = matcher.push("Hello wor");
  EXPECT_EQ(a.text, "Hello ");
  EXPECT_FALSE(a.stopped);
  EXPECT_EQ(matcher.held(), 3u);
  StopStringMatcher::Release b = matcher.push("m and </e");
  EXPECT_EQ(b.text, "worm and ");
  EXPECT_EQ(matcher.held(), 3u);
  StopStringMatcher::Release c = matcher.push("nd> tail");
  EXPECT_EQ(c.text, "");
  EXPECT_TRUE(c.stopped);
  EXPECT_TRUE(matcher.push("more").text.empty());
}

TEST(StopStringMatcher, RefusesEmptyStops) {
  EXPECT_THROW(StopStringMatcher({"a", ""}), std::invalid_argument);
}

std::vector<int32_t> ids_of(const Tokenizer& t, const std::string& text) {
  const std::vector<uint32_t> ids = t.encode(text);
  return {ids.begin(), ids.end()};
}

std::string concatenated_deltas(Sequence& sequence, const std::vector<int32_t>& ids,
                                size_t* accepted = nullptr) {
  std::string out;
  size_t count = 0;
  for (int32_t id : ids) {
    ++count;
    const bool more = sequence.accept(id, nullptr);
    out += sequence.take_delta().text;
    if (!more) break;
  }
  if (accepted) *accepted = count;
  return out;
}

TEST(Sequence, DeltasConcatenateToTheWholeDecode) {
  const Tokenizer& t = test::tiny();
  const std::string text = "Grüße, 世界! naïve café — ok 🙂 done";
  const std::vector<int32_t> ids = ids_of(t, text);
  SequenceConfig config;
  config.max_tokens = static_cast<int64_t>(ids.size());
  Sequence sequence(&t, config);
  EXPECT_EQ(concatenated_deltas(sequence, ids), text);
  EXPECT_EQ(sequence.end(), SequenceEnd::length);
  EXPECT_STREQ(sequence.finish_reason(), "length");
  EXPECT_EQ(sequence.text(), text);
}

TEST(Sequence, AMultiByteCharacterSplitOverTokensComesOutWhole) {
  const Tokenizer& t = test::tiny();
  // ByteLevel maps byte 0xC3 to "Ã" and 0xA9 to "©": the two tokens of "é" fed one by one.
  const std::optional<uint32_t> lead = t.token_to_id("\xC3\x83");   // "Ã"
  const std::optional<uint32_t> tail = t.token_to_id("\xC2\xA9");   // "©"
  ASSERT_TRUE(lead && tail);
  SequenceConfig config;
  config.max_tokens = 8;
  Sequence sequence(&t, config);
  EXPECT_TRUE(sequence.accept(static_cast<int32_t>(*lead), nullptr));
  EXPECT_EQ(sequence.take_delta().text, "");
  EXPECT_TRUE(sequence.accept(static_cast<int32_t>(*tail), nullptr));
  EXPECT_EQ(sequence.take_delta().text, "\xC3\xA9");
}

TEST(Sequence, StopStringAcrossTokensIsExcludedAndEnds) {
  const Tokenizer& t = test::tiny();
  std::vector<int32_t> ids;
  for (char c : std::string("foo STOP bar")) {
    const std::vector<int32_t> one = ids_of(t, std::string(1, c));
    ids.insert(ids.end(), one.begin(), one.end());
  }
  SequenceConfig config;
  config.max_tokens = 64;
  config.stop_strings = {"STOP"};
  Sequence sequence(&t, config);
  size_t accepted = 0;
  EXPECT_EQ(concatenated_deltas(sequence, ids, &accepted), "foo ");
  EXPECT_EQ(accepted, 8u);  // "foo STOP": ended on the token that completed the stop string
  EXPECT_EQ(sequence.end(), SequenceEnd::stop_string);
  EXPECT_STREQ(sequence.finish_reason(), "stop");
}

TEST(Sequence, HeldBackTextIsReleasedAtTheEndWhenNoStopMatched) {
  const Tokenizer& t = test::tiny();
  const std::vector<int32_t> ids = ids_of(t, "abc ST");
  SequenceConfig config;
  config.max_tokens = static_cast<int64_t>(ids.size());
  config.stop_strings = {"STOP"};
  Sequence sequence(&t, config);
  EXPECT_EQ(concatenated_deltas(sequence, ids), "abc ST");
  EXPECT_EQ(sequence.end(), SequenceEnd::length);
}

TEST(Sequence, StopTokenEndsWithoutTextOrLogprobs) {
  const Tokenizer& t = test::tiny();
  const std::optional<uint32_t> im_end = t.token_to_id("<|im_end|>");
  ASSERT_TRUE(im_end);
  const std::vector<int32_t> ids = ids_of(t, "hi");
  SequenceConfig config;
  config.max_tokens = 10;
  config.stop_tokens = {static_cast<int32_t>(*im_end)};
  config.top_logprobs = 1;
  Sequence sequence(&t, config);
  std::vector<int32_t> record(TokenRecordLayout::kWords, 0);
  record[TokenRecordLayout::kLogprob] = std::bit_cast<int32_t>(-0.5f);
  record[TokenRecordLayout::kTopCount] = 1;
  record[TokenRecordLayout::kTopIds] = 42;
  record[TokenRecordLayout::kTopLogprobs] = std::bit_cast<int32_t>(-0.25f);
  for (int32_t id : ids) {
    record[TokenRecordLayout::kToken] = id;
    EXPECT_TRUE(sequence.accept(id, record.data()));
  }
  record[TokenRecordLayout::kToken] = static_cast<int32_t>(*im_end);
  EXPECT_FALSE(sequence.accept(static_cast<int32_t>(*im_end), record.data()));
  const SequenceDelta delta = sequence.take_delta();
  EXPECT_EQ(sequence.text(), "hi");
  EXPECT_EQ(sequence.end(), SequenceEnd::stop_token);
  ASSERT_EQ(delta.logprobs.size(), ids.size());  // the stop token has no entry
  EXPECT_EQ(delta.logprobs[0].token, ids[0]);
  EXPECT_FLOAT_EQ(delta.logprobs[0].logprob, -0.5f);
  ASSERT_EQ(delta.logprobs[0].top.size(), 1u);
  EXPECT_EQ(delta.logprobs[0].top[0].first, 42);
  EXPECT_FLOAT_EQ(delta.logprobs[0].top[0].second, -0.25f);
  EXPECT_THROW(sequence.accept(1, nullptr), std::logic_error);
}

TEST(Sequence, CancelReleasesNothingMore) {
  const Tokenizer& t = test::tiny();
  SequenceConfig config;
  config.max_tokens = 10;
  config.stop_strings = {"xyz"};
  Sequence sequence(&t, config);
  EXPECT_TRUE(sequence.accept(ids_of(t, "x")[0], nullptr));
  EXPECT_EQ(sequence.take_delta().text, "");
  sequence.cancel();
  EXPECT_EQ(sequence.take_delta().text, "");
  EXPECT_STREQ(sequence.finish_reason(), "cancelled");
}

TEST(Sequence, RefusesBadConfigs) {
  SequenceConfig config;
  config.max_tokens = 0;
  EXPECT_THROW(Sequence(nullptr, config), std::invalid_argument);
  config.max_tokens = 1;
  config.stop_strings = {"a"};
  EXPECT_THROW(Sequence(nullptr, config), std::invalid_argument);  // no tokenizer
  config.stop_strings.clear();
  config.top_logprobs = 21;
  EXPECT_THROW(Sequence(nullptr, config), std::invalid_argument);
}


// ---- forced tokens (ForcingPlan) -----------------------------------------------------------

// Token ids only (no tokenizer): 900 plays `</think>`, 901.. the forced texts.
constexpr int32_t kThinkEnd = 900;

SequenceConfig forcing_config(ForcingPlan plan, int64_t max_tokens = 50) {
  SequenceConfig config;
  config.max_tokens = max_tokens;
  config.forcing = std::move(plan);
  return config;
}

TEST(SequenceForcing, PrefixThenAfterReasoningWithoutThinking) {
  ForcingPlan plan;
  plan.prefix = {1, 2};
  plan.after_reasoning = {3};
  Sequence sequence(nullptr, forcing_config(plan));
  EXPECT_FALSE(sequence.in_reasoning());
  EXPECT_EQ(sequence.take_forced(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(sequence.take_forced().empty()) << "handed out once";
  for (int32_t t : {1, 2, 3, 40}) EXPECT_TRUE(sequence.accept(t, nullptr));
  EXPECT_TRUE(sequence.take_forced().empty());
  EXPECT_EQ(sequence.reasoning_tokens(), 0);
}

TEST(SequenceForcing, AfterReasoningFollowsTheReasoningEnd) {
  ForcingPlan plan;
  plan.reasoning_end = kThinkEnd;
  plan.after_reasoning = {901, 902};
  Sequence sequence(nullptr, forcing_config(plan));
  EXPECT_TRUE(sequence.in_reasoning());
  EXPECT_TRUE(sequence.take_forced().empty());
  for (int32_t t : {10, 11, 12}) {
    EXPECT_TRUE(sequence.accept(t, nullptr));
    EXPECT_TRUE(sequence.take_forced().empty());
  }
  EXPECT_TRUE(sequence.accept(kThinkEnd, nullptr));
  EXPECT_FALSE(sequence.in_reasoning());
  EXPECT_EQ(sequence.reasoning_tokens(), 4) << "three reasoning tokens and the end token";
  EXPECT_EQ(sequence.take_forced(), (std::vector<int32_t>{901, 902}));
  EXPECT_TRUE(sequence.accept(901, nullptr));
  EXPECT_EQ(sequence.reasoning_tokens(), 4);
}

TEST(SequenceForcing, TheBudgetForcesTheCloseOnceAndTheCloseEndsTheReasoning) {
  ForcingPlan plan;
  plan.reasoning_end = kThinkEnd;
  plan.reasoning_budget = 3;
  plan.reasoning_close = {905, kThinkEnd, 906};
  plan.after_reasoning = {907};
  Sequence sequence(nullptr, forcing_config(plan));
  EXPECT_TRUE(sequence.accept(10, nullptr));
  EXPECT_TRUE(sequence.accept(11, nullptr));
  EXPECT_TRUE(sequence.take_forced().empty());
  EXPECT_TRUE(sequence.accept(12, nullptr));  // the third reasoning token: the budget is spent
  EXPECT_EQ(sequence.take_forced(), (std::vector<int32_t>{905, kThinkEnd, 906}));
  EXPECT_TRUE(sequence.accept(905, nullptr));
  EXPECT_TRUE(sequence.take_forced().empty()) << "the close is not forced twice";
  EXPECT_TRUE(sequence.accept(kThinkEnd, nullptr));
  EXPECT_FALSE(sequence.in_reasoning());
  EXPECT_EQ(sequence.reasoning_tokens(), 5);
  EXPECT_TRUE(sequence.accept(906, nullptr));
  EXPECT_EQ(sequence.take_forced(), (std::vector<int32_t>{907}));
}

TEST(SequenceForcing, ABudgetOfZeroClosesTheReasoningAtOnce) {
  ForcingPlan plan;
  plan.reasoning_end = kThinkEnd;
  plan.reasoning_budget = 0;
  plan.reasoning_close = {kThinkEnd, 906};
  Sequence sequence(nullptr, forcing_config(plan));
  EXPECT_EQ(sequence.take_forced(), (std::vector<int32_t>{kThinkEnd, 906}));
}

TEST(SequenceForcing, NothingIsForcedAfterTheEndAndABadCloseIsRefused) {
  ForcingPlan plan;
  plan.reasoning_end = kThinkEnd;
  plan.after_reasoning = {901};
  Sequence sequence(nullptr, forcing_config(plan, 1));
  EXPECT_FALSE(sequence.accept(kThinkEnd, nullptr));  // max_tokens 1: the end
  EXPECT_TRUE(sequence.take_forced().empty());
  ForcingPlan bad;
  bad.reasoning_end = kThinkEnd;
  bad.reasoning_budget = 4;
  bad.reasoning_close = {905};
  EXPECT_THROW(Sequence(nullptr, forcing_config(bad)), std::invalid_argument);
}

}  // namespace
}  // namespace lily

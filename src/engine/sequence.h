// One request's generation as a state machine: token choice, stop rules, text and logprob deltas.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/sampling.h"
#include "text/stop_strings.h"
#include "text/tokenizer.h"

namespace lily {

// The log-probabilities of one generated token (raw model distribution, TokenRecordLayout).
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), descending
};

// Tokens a sequence forces into its output instead of the model's choice: a required or named
// tool call's opening, the close of a reasoning that reached its budget, a test script's whole
// answer. Forced tokens are generated tokens in every other respect (text, stop rules,
// max_tokens) but have no logprobs entry and are not seen by the device sampler's penalties.
struct ForcingPlan {
  std::vector<int32_t> prefix;  // the output begins with these
  // Thinking on: the output starts inside the reasoning, which ends with this token
  // (`</think>`); -1: no reasoning.
  int32_t reasoning_end = -1;
  int64_t reasoning_budget = -1;         // reasoning tokens allowed; -1: unlimited
  std::vector<int32_t> reasoning_close;  // forced at the budget; must contain reasoning_end
  std::vector<int32_t> after_reasoning;  // forced right after the reasoning ends (or, without
                                         // reasoning, after `prefix`)
};

// What a request asks of its generation.
struct SequenceConfig {
  int64_t max_tokens = 128;                 // >= 1
  std::unordered_set<int32_t> stop_tokens;  // generation ends after one of these (counted)
  std::vector<std::string> stop_strings;    // matched on the text; excluded from it
  // nullopt: the greedy argmax of the raw logits (Lily's decoding). Otherwise the sampler's
  // stages (sampling.h); params.top_logprobs is set from top_logprobs below.
  std::optional<SamplerParams> sampling;
  int top_logprobs = -1;  // -1: no logprobs; 0..20: logprobs with that many alternatives
  ForcingPlan forcing;
};

// Output that became final with one token: text (whole UTF-8 characters, with anything that
// could still become a stop string held back) and the logprobs of the tokens it came from.
struct SequenceDelta {
  std::string text;
  std::vector<TokenLogprobs> logprobs;  // one entry per token accepted since the last delta
};

// How a sequence ended.
enum class SequenceEnd { running, stop_token, stop_string, length, cancelled };

// The per-request state the inference loop steps one token at a time: it decides after each
// token whether generation goes on (stop token, stop string, length), turns the tokens into
// text (IncrementalDetokenizer, special tokens skipped) and logprob entries, and hands out
// what became final. Knows nothing of the model or the backend, so a scheduler can step many
// sequences (one per batch row) the same way. Not thread-safe: the inference thread owns it.
class Sequence {
 public:
  // `tokenizer` may be null (no text, no stop strings: token ids only, e.g. `lily run`).
  Sequence(const Tokenizer* tokenizer, SequenceConfig config);

  const SequenceConfig& config() const { return config_; }
  bool wants_logprobs() const { return config_.top_logprobs >= 0; }

  // The next generated token, with its record (TokenRecordLayout words) when logprobs were
  // asked for. Returns whether generation goes on; false once a stop token, a stop string or
  // max_tokens ended it.
  bool accept(int32_t token, const int32_t* record);
  // The client went away: ends the sequence as cancelled (no further text is released).
  void cancel();
  // The tokens to force next (ForcingPlan), after the last accepted token; empty: none. Each
  // is handed out once; the driver feeds them through accept() like model tokens.
  std::vector<int32_t> take_forced();
  bool in_reasoning() const { return in_reasoning_; }
  // Tokens generated inside the reasoning, its end token included
  // (usage.completion_tokens_details.reasoning_tokens).
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  // The driver's count of generated tokens fed into the state (GenerationResult::fed).
  void set_fed(int64_t fed) { fed_ = fed; }

  // What became final since the last call (empty when nothing did). After the end, the last
  // call also releases what was held back (unless a stop string or a cancel ended it).
  SequenceDelta take_delta();

  SequenceEnd end() const { return end_; }
  bool finished() const { return end_ != SequenceEnd::running; }
  // "stop" (token or string), "length" or "cancelled"; "" while running.
  const char* finish_reason() const;
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t fed() const { return fed_; }
  const std::string& text() const { return text_; }  // everything released so far

 private:
  void release(std::string piece);
  void end_with(SequenceEnd end);

  const Tokenizer* tokenizer_;
  SequenceConfig config_;
  std::unique_ptr<IncrementalDetokenizer> detokenizer_;
  StopStringMatcher stops_;
  std::vector<int32_t> tokens_;
  int64_t fed_ = 0;
  SequenceEnd end_ = SequenceEnd::running;
  std::string text_;
  SequenceDelta pending_;
  bool in_reasoning_ = false;
  int64_t reasoning_tokens_ = 0;
  bool close_forced_ = false;  // the budget's close was handed out
  std::vector<int32_t> forced_;  // to hand out at the next take_forced()
};

// Decodes a token record (TokenRecordLayout) into its entry.
TokenLogprobs token_logprobs_from_record(const int32_t* record);

}  // namespace lily

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

// What a request asks of its generation.
struct SequenceConfig {
  int64_t max_tokens = 128;                 // >= 1
  std::unordered_set<int32_t> stop_tokens;  // generation ends after one of these (counted)
  std::vector<std::string> stop_strings;    // matched on the text; excluded from it
  // nullopt: the greedy argmax of the raw logits (Lily's decoding). Otherwise the sampler's
  // stages (sampling.h); params.top_logprobs is set from top_logprobs below.
  std::optional<SamplerParams> sampling;
  int top_logprobs = -1;  // -1: no logprobs; 0..20: logprobs with that many alternatives
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
};

// Decodes a token record (TokenRecordLayout) into its entry.
TokenLogprobs token_logprobs_from_record(const int32_t* record);

}  // namespace lily

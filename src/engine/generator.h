// Generation over a model and a session state (argmax or sampled), with Lily's fed-token accounting.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "model/qwen36_model.h"

namespace lily {

// What on_token decides after a token: go on, end as "stop" (e.g. a stop string matched) or end
// as "cancelled" (the client went away). Both endings leave the fed count of a cancel.
enum class TokenAction { proceed, stop, cancel };

struct GenerationOptions {
  int64_t max_tokens = 16;
  std::unordered_set<int32_t> stop_tokens;  // generation ends after emitting one of these
  int top_logits = 0;                       // record the K largest logits of every step (argmax only)
  TokenChoice choice;                       // how tokens are chosen; default: argmax
  // Called after each token with its record (TokenRecordLayout, when choice.logprobs; else
  // nullptr), the stop token included. Absent: always proceed.
  std::function<TokenAction(int32_t token, const int32_t* record)> on_token;
  // Checked before each prefill chunk (model.chunk() tokens); return true to cancel, so that a
  // long prompt stops within one chunk. The state then holds the chunks already fed.
  std::function<bool()> cancel_prefill;
  // Session-cache snapshots: absolute state positions, ascending, where prefill ends a chunk
  // and calls on_snapshot(state) with state.position == that point before it goes on. Points
  // at or below the position the state already holds, or at or beyond the prompt's end, are
  // skipped (the end is the entry's own tokens). Empty, or no on_snapshot: chunks as usual.
  std::vector<int64_t> snapshot_at;
  std::function<void(DecodeState&)> on_snapshot;
  // Optional: tokens to force into the output next, instead of the model's choice (a required
  // tool call's opening, the reasoning budget's close, a test script). Called before the
  // model's first token is acted on and after every token on_token lets proceed; empty: none.
  // Forced tokens are generated tokens in every other respect (on_token sees them, with a null
  // record; they count towards max_tokens and may stop generation) and are fed in one prefill,
  // whose token continues the decode. Pipelined decode only (not with top_logits).
  std::function<std::vector<int32_t>()> take_forced;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // includes the stop token when one ended generation
  std::string finish_reason;    // "stop", "length" or "cancelled"
  // Generated tokens fed into the state, as Lily counts them (docs/session-cache.md); on_token's
  // stop counts as a cancel. A stop at token i >= 1 feeds tokens 0..i (the overshoot step fed
  // the stop token); ending on the length limit does not feed the last token; a stop on token 0
  // or max_tokens = 1 feeds none. A cancel at token i >= 1 leaves tokens 0..i fed when decode
  // was pipelined (the step after it was already submitted) and 0..i-1 when it ran step by step
  // (top_logits). The state then holds prompt + tokens[0, fed).
  int64_t fed = 0;
  // Prompt tokens left unfed because prefill was cancelled (0 otherwise): the state holds
  // prompt[0, size - prompt_unfed) and no generated token.
  int64_t prompt_unfed = 0;
  std::vector<std::vector<std::pair<int32_t, float>>> steps;  // top logits per token
  double prefill_seconds = 0;  // prompt in, first token out
  double decode_seconds = 0;   // the decode steps after it
};

// Prefills `prompt` on top of the state (which may already hold a prefix) and decodes, each
// token chosen by options.choice: pipelined two steps deep (Qwen36Model::submit_decode) unless
// top_logits asks for every step's logits, then step by step (argmax only). Both give the same
// tokens and the same fed count (but for a cancel, see GenerationResult::fed).
GenerationResult generate(Qwen36Model& model, DecodeState& state, std::span<const int32_t> prompt,
                          const GenerationOptions& options);

// The K largest (id, logit) pairs, descending; ties by lower id.
std::vector<std::pair<int32_t, float>> top_logits(const std::vector<float>& logits, int k);

}  // namespace lily

// libFuzzer target: parse_chat_request in both API modes, its invariants, and the JSON builders.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/strict_json.h"
#include "server/openai_types.h"
#include "text/utf8.h"

namespace {

// Only ApiError may leave the parser; anything else (InputError, nlohmann's exceptions,
// std::bad_alloc...) aborts, which libFuzzer reports as a crash.
std::optional<lily::ChatRequest> parse_or_refuse(std::string_view body,
                                                 const lily::ServerLimits& limits) {
  try {
    return lily::parse_chat_request(body, limits);
  } catch (const lily::ApiError& error) {
    if (error.status != 400 && error.status != 413) std::abort();
    if (error.type != "invalid_request_error") std::abort();
    if (lily::utf8::find_invalid(error.message) != std::string_view::npos) std::abort();
    // A param can name a field of the body (an unknown field in strict mode); the body has
    // been checked to be valid UTF-8 by then.
    if (error.param && lily::utf8::find_invalid(*error.param) != std::string_view::npos) {
      std::abort();
    }
    // The envelope is always strict JSON.
    lily::parse_strict_json(lily::error_response_json(error), "error", 4);
    return std::nullopt;
  } catch (...) {
    std::abort();
  }
}

// What every accepted request guarantees.
void check_accepted(const lily::ChatRequest& r, const lily::ServerLimits& limits) {
  if (r.messages.empty() || r.messages.back().role != lily::ChatRole::user) std::abort();
  if (r.max_tokens == 0) std::abort();
  if (r.include_usage && !r.stream) std::abort();
  if (r.top_logprobs < 0 || r.top_logprobs > 20 || (r.top_logprobs > 0 && !r.logprobs)) {
    std::abort();
  }
  if (r.stop.size() > lily::kMaxStopStrings) std::abort();
  for (const std::string& s : r.stop) {
    if (s.empty()) std::abort();
  }
  const lily::SamplingFields& s = r.sampling;
  if (s.temperature && !(*s.temperature >= 0.0 && *s.temperature <= 2.0)) std::abort();
  if (s.top_p && !(*s.top_p > 0.0 && *s.top_p <= 1.0)) std::abort();
  if (s.top_k && *s.top_k < 0) std::abort();
  if (s.min_p && !(*s.min_p >= 0.0 && *s.min_p <= 1.0)) std::abort();
  if (s.repetition_penalty && !(*s.repetition_penalty > 0.0 && *s.repetition_penalty <= 2.0)) {
    std::abort();
  }
  for (const auto* p : {&s.presence_penalty, &s.frequency_penalty}) {
    if (*p && !(**p >= -2.0 && **p <= 2.0)) std::abort();
  }
  if (s.logit_bias.size() > 1024) std::abort();
  const uint64_t bound = limits.token_id_count > 0 ? limits.token_id_count : (uint64_t{1} << 31);
  for (size_t i = 0; i < s.logit_bias.size(); ++i) {
    const auto [id, bias] = s.logit_bias[i];
    if (id >= bound || !(bias >= -100.0f && bias <= 100.0f)) std::abort();
    if (i > 0 && s.logit_bias[i - 1].first >= id) std::abort();  // ascending, distinct
  }
  if (!std::is_sorted(r.ignored_fields.begin(), r.ignored_fields.end()) ||
      std::adjacent_find(r.ignored_fields.begin(), r.ignored_fields.end()) !=
          r.ignored_fields.end()) {
    std::abort();
  }
  if (limits.mode == lily::ApiMode::strict &&
      (r.stream || s.any() || !r.stop.empty() || r.logprobs || !r.ignored_fields.empty())) {
    std::abort();
  }
  // Rendering may refuse (ApiError) but never fails otherwise.
  try {
    lily::render_request_prompt(r);
  } catch (const lily::ApiError&) {
  } catch (...) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  lily::ServerLimits strict;
  strict.mode = lily::ApiMode::strict;
  lily::ServerLimits openai;  // ids of logit_bias unchecked
  lily::ServerLimits openai_vocab;
  openai_vocab.token_id_count = 1000;

  const std::optional<lily::ChatRequest> s = parse_or_refuse(body, strict);
  const std::optional<lily::ChatRequest> o = parse_or_refuse(body, openai);
  const std::optional<lily::ChatRequest> v = parse_or_refuse(body, openai_vocab);
  if (s) check_accepted(*s, strict);
  if (o) check_accepted(*o, openai);
  if (v) check_accepted(*v, openai_vocab);
  // Whatever Lily's contract accepts, openai mode accepts the same way.
  if (s) {
    if (!o) std::abort();
    if (o->model != s->model || o->max_tokens != s->max_tokens ||
        o->max_tokens_given != s->max_tokens_given || o->stream != s->stream ||
        o->prompt_cache_key != s->prompt_cache_key || o->messages.size() != s->messages.size()) {
      std::abort();
    }
    for (size_t i = 0; i < s->messages.size(); ++i) {
      if (o->messages[i].role != s->messages[i].role ||
          o->messages[i].content != s->messages[i].content) {
        std::abort();
      }
    }
  }
  // A known id count only narrows logit_bias.
  if (v && !o) std::abort();

  // The builders turn arbitrary bytes (cut characters included) into strict JSON.
  const std::string_view piece = body.substr(0, std::min<size_t>(size, 64));
  lily::CompletionResult result;
  result.content = std::string(body);
  result.logprobs = std::vector<lily::TokenLogprob>{
      {std::string(piece), -0.5f, {{std::string(piece.substr(0, 3)), -1.0f}}}};
  lily::parse_strict_json(lily::completion_response_json(result), "response", 16);
  lily::ChunkContext context;
  context.id = "chatcmpl-1-1";
  context.include_usage = (size & 1) != 0;
  lily::parse_strict_json(lily::chunk_content_json(context, piece, &*result.logprobs), "chunk", 16);
  return 0;
}

// POST /v1/chat/completions request parsing and validation in the two API modes (openai, strict).
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/strict_json.h"
#include "text/chat_format.h"

namespace lily {

// The one model id the server exposes, as Lily does (docs/api.md, *200 models*).
inline constexpr std::string_view kServedModelId = "Qwen3.6-35B-A3B";

// Which request contract the server applies (docs/api.md):
//   openai: what real OpenAI clients send; unknown and harmless fields are accepted and
//           ignored, sampling and streaming fields are used, features that would change the
//           output but are not implemented yet are refused by name;
//   strict: Perplexity Lily's contract, byte for byte (`lily serve --strict`): exactly five
//           fields, any other field is a 400, `stream: true` is a 400.
enum class ApiMode { openai, strict };

// At most this many `stop` strings (openai mode).
inline constexpr size_t kMaxStopStrings = 16;

// Limits that apply while parsing a request body.
struct ServerLimits {
  std::string model_id = std::string(kServedModelId);  // `model` must equal this
  uint64_t max_body_bytes = 1048576;                   // larger bodies: 413
  int max_json_depth = 16;  // strict mode's nesting cap; a valid request needs 3 levels (5 with
                            // content parts)
  int max_json_depth_openai = 64;  // openai mode: tool schemas and arguments nest deeper
  uint64_t default_max_tokens = 128;  // used when the body has no `max_tokens`
  ApiMode mode = ApiMode::openai;
  // logit_bias keys must be token ids below this (the tokenizer's id count); 0: unknown, then
  // keys only need to be below 2^31.
  uint32_t token_id_count = 0;
};

// A client-visible error: HTTP status plus the OpenAI envelope fields. `param` and `code`
// serialize as null when absent. Thrown by everything that validates a request.
class ApiError : public std::exception {
 public:
  ApiError(int status_, std::string message_, std::string type_,
           std::optional<std::string> param_ = std::nullopt,
           std::optional<std::string> code_ = std::nullopt)
      : status(status_),
        message(std::move(message_)),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}
  const char* what() const noexcept override { return message.c_str(); }

  int status;
  std::string message;
  std::string type;  // "invalid_request_error" (4xx) or "server_error"
  std::optional<std::string> param;
  std::optional<std::string> code;
};

// The request's sampling fields as given (absent or null = nullopt), each range-checked.
// Only openai mode fills them; in strict mode they are all absent.
struct SamplingFields {
  std::optional<double> temperature;  // [0, 2]
  std::optional<double> top_p;        // (0, 1]
  std::optional<int64_t> top_k;  // >= 0; 0 = off (the request's -1, vLLM's "off", is stored as 0)
  std::optional<double> min_p;   // [0, 1]
  std::optional<double> presence_penalty;    // [-2, 2]
  std::optional<double> frequency_penalty;   // [-2, 2]
  std::optional<double> repetition_penalty;  // (0, 2]
  std::optional<uint64_t> seed;              // any JSON integer in int64 or uint64 range;
                                             // negatives as their two's complement
  // (token id, bias), ascending distinct ids (< ServerLimits::token_id_count when known, else
  // < 2^31); biases in [-100, 100]; at most kMaxLogitBias (backend/sampling.h) entries.
  std::vector<std::pair<uint32_t, float>> logit_bias;

  // Whether any field above was given (an empty logit_bias object counts as not given). When
  // false, the request decodes greedily as Lily does.
  bool any() const;
};

// Which tool calls the answer may or must contain (`tool_choice`).
enum class ToolChoice {
  none,      // never a call (and the text is not parsed for calls)
  automatic, // the model decides ("auto", the default with tools)
  required,  // at least one call: its opening is forced after the reasoning
  named,     // a call of `tool_choice_name`: its opening and name are forced
};

// A validated POST /v1/chat/completions body.
struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;  // non-empty, last role user (or tool); text parts joined
  uint64_t max_tokens = 128;          // > 0; the default when absent (openai: or its alias)
  bool max_tokens_given = false;  // whether the body carried max_tokens or max_completion_tokens
  bool stream = false;            // strict mode: always false once accepted
  std::optional<std::string> prompt_cache_key;  // absent or null: none
  bool include_usage = false;  // stream_options.include_usage, and only when streaming
  SamplingFields sampling;
  std::vector<std::string> stop;  // `stop`: up to kMaxStopStrings non-empty strings
  bool logprobs = false;
  int top_logprobs = 0;  // 0..kMaxTopLogprobs (20); only with logprobs
  // The accepted-and-ignored fields present (non-null), deduplicated, in byte order: top-level
  // names ("metadata", "user", any unknown field) and nested ones as dotted paths with `[]`
  // for array positions ("messages[].name", "stream_options.continuous_usage_stats",
  // "chat_template_kwargs.preserve_thinking", "messages[].content[].cache_control"). The
  // caller logs them once per request.
  std::vector<std::string> ignored_fields;
  // Tools (openai mode): the `tools` array's elements as sent (key order kept, for the
  // template's tojson), every one a function tool with a name.
  std::vector<OrderedJson> tools;
  ToolChoice tool_choice = ToolChoice::none;  // "auto" when tools are given and it is absent
  std::string tool_choice_name;               // ToolChoice::named
  bool parallel_tool_calls = true;
  // Thinking: chat_template_kwargs.enable_thinking (or a top-level enable_thinking), else
  // reasoning_effort ("none"/"minimal" off, "low"/"medium"/"high"/"xhigh" on); nullopt: the
  // server's --thinking.
  std::optional<bool> thinking;
  bool preserve_thinking = false;           // chat_template_kwargs.preserve_thinking
  std::optional<int64_t> reasoning_budget;  // reasoning_budget (or thinking_budget), >= 0
};

// Parses and validates a chat-completions body in the order of docs/api.md for
// `limits.mode`. Strict mode (Lily's order): body size (413), UTF-8, strict JSON (depth cap,
// duplicate keys), object, unknown fields, field types, missing fields, then model, stream,
// empty messages, final role, max_tokens 0. Openai mode: the same first steps; then every
// present field's type and range, missing fields, model, unsupported features, empty
// messages, final role, then max_tokens (alias conflict, 0) and top_logprobs without logprobs.
// Throws ApiError (status 400 or 413) on the first failure, and nothing else.
ChatRequest parse_chat_request(std::string_view body, const ServerLimits& limits);

// Step 7: the prompt text (docs/chat-format.md): thinking off, Lily's history rewrite and the
// template; thinking on, the template as the checkpoint renders it; with the request's tools.
// Template errors become ApiError 400 "rendering chat template: ...".
std::string render_request_prompt(const ChatRequest& request, bool thinking = false);

// Steps 8–9: given the tokenised prompt length, the requested max_tokens and the server's
// max_seq, returns the effective max_tokens (Lily: the request's value, unchanged) or throws
// ApiError 400: empty prompt; prompt + max_tokens + 1 overflowing 64 bits; or
// prompt + max_tokens + 1 > max_seq ("request needs N tokens but server max_seq is M").
uint64_t checked_max_tokens(uint64_t prompt_tokens, uint64_t max_tokens, uint64_t max_seq);

// Lily's start-up clamp (docs/api.md, *The budget*): min(cli, declared) when declared > 0, else
// cli; the result must be >= 2. Throws InputError("max_seq must be at least 2 ...").
uint64_t clamp_max_seq(uint64_t cli_max_seq, uint64_t declared_max_position_embeddings);

}  // namespace lily

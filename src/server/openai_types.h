// OpenAI-compatible response JSON of the HTTP API: completions, stream chunks, models, errors.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/chat_request.h"

namespace lily {

// Completion ids "chatcmpl-<created>-<n>", n a per-process counter starting at `first`.
// Thread-safe.
class CompletionIdGenerator {
 public:
  explicit CompletionIdGenerator(uint64_t first = 1) : next_(first) {}
  std::string next(int64_t created);

 private:
  std::atomic<uint64_t> next_;
};

// "chatcmpl-<created>-<n>".
std::string completion_id(int64_t created, uint64_t n);

enum class FinishReason { stop, length, tool_calls };
std::string_view finish_reason_name(FinishReason reason);

// One generated token's log-probabilities (the choice's "logprobs" in openai mode).
struct TokenLogprob {
  // The token's text as raw bytes: a token can end inside a UTF-8 character, so "token" is
  // written lossily (U+FFFD) and "bytes" carries the exact bytes.
  std::string token;
  float logprob = 0.0f;  // a non-finite value is written as -9999.0 (OpenAI's "very unlikely")
  std::vector<std::pair<std::string, float>> top;  // (token text, logprob), most likely first
};

// One tool call of an answer (openai mode): {"id","type":"function","function":{"name","arguments"}}.
struct ApiToolCall {
  std::string id;         // "call_<24 alphanumerics>"
  std::string name;
  std::string arguments;  // a JSON object as text
};

// Everything a 200 chat-completion response carries (docs/api.md, *200 chat completion*).
struct CompletionResult {
  std::string id;
  int64_t created = 0;
  std::string model = std::string(kServedModelId);
  std::string content;  // may hold invalid UTF-8: replaced by U+FFFD when serialised
  // openai mode: the reasoning (thinking on; the key is absent otherwise), and the tool calls
  // (then an empty content is written as null, as OpenAI does).
  std::optional<std::string> reasoning_content;
  std::vector<ApiToolCall> tool_calls;
  // usage.completion_tokens_details.reasoning_tokens (thinking on; absent otherwise).
  std::optional<uint64_t> reasoning_tokens;
  FinishReason finish_reason = FinishReason::stop;
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;  // includes the stop token
  uint64_t cached_tokens = 0;
  // openai: the choice carries "logprobs" (null unless set); strict: Lily's shape, no key.
  ApiMode mode = ApiMode::openai;
  std::optional<std::vector<TokenLogprob>> logprobs;  // openai mode only
};

// Field order: id, object, created, model, choices, usage. The choice is
// {index, message:{role, content}, finish_reason} in strict mode (Lily's exact bytes) and
// {index, message:{role, content(, reasoning_content)(, tool_calls)}, logprobs, finish_reason} in
// openai mode (OpenAI's order); usage is {prompt_tokens, completion_tokens, total_tokens,
// prompt_tokens_details:{cached_tokens}(, completion_tokens_details:{reasoning_tokens})}.
std::string completion_response_json(const CompletionResult& result);

// What every chunk of one streamed completion repeats. `include_usage`: the request's
// stream_options.include_usage (then every chunk but the usage chunk carries "usage":null).
struct ChunkContext {
  std::string id;
  int64_t created = 0;
  std::string model = std::string(kServedModelId);
  bool include_usage = false;
};

// chat.completion.chunk objects (openai mode), each
//   {"id","object":"chat.completion.chunk","created","model",
//    "choices":[{"index":0,"delta":{...},"logprobs":...,"finish_reason":...}](,"usage":null)}
// The first: delta {"role":"assistant","content":""}, logprobs null, finish_reason null.
std::string chunk_role_json(const ChunkContext& context);
// Text: delta {"content": text} (invalid UTF-8 becomes U+FFFD); logprobs
// {"content":[...],"refusal":null} when `logprobs` is given, else null; finish_reason null.
std::string chunk_content_json(const ChunkContext& context, std::string_view text,
                               const std::vector<TokenLogprob>* logprobs);
// Reasoning: delta {"reasoning_content": text}; logprobs as chunk_content_json.
std::string chunk_reasoning_json(const ChunkContext& context, std::string_view text,
                                 const std::vector<TokenLogprob>* logprobs);
// A tool call's piece: delta {"tool_calls":[{"index", "id", "type":"function",
// "function":{"name","arguments":""}}]} when `id` is given (a call's first chunk), else
// {"tool_calls":[{"index","function":{"arguments": fragment}}]}.
std::string chunk_tool_call_json(const ChunkContext& context, size_t index, std::string_view id,
                                 std::string_view name, std::string_view arguments,
                                 const std::vector<TokenLogprob>* logprobs);
// The last choice chunk: delta {}, logprobs null, finish_reason "stop", "length" or
// "tool_calls".
std::string chunk_finish_json(const ChunkContext& context, FinishReason reason);
// With include_usage, after the finish chunk: "choices":[] and the usage object of
// completion_response_json.
std::string chunk_usage_json(const ChunkContext& context, uint64_t prompt_tokens,
                             uint64_t completion_tokens, uint64_t cached_tokens,
                             std::optional<uint64_t> reasoning_tokens = std::nullopt);

// Server-sent events framing: "data: " + json + "\n\n"; the terminator "data: [DONE]\n\n"; an
// error after the stream started (then send sse_done()): "data: " + error_response_json + "\n\n".
std::string sse_frame(std::string_view json);
std::string sse_done();

// GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by":"lily"}]}.
std::string models_response_json(std::string_view model_id, int64_t created);

// {"error":{"message","type","param","code"}} (param/code null when absent).
std::string error_response_json(const ApiError& error);
std::string sse_error_frame(const ApiError& error);

// The transport-level errors, so that every path uses one envelope (docs/api.md).
ApiError not_found_error();                         // 404
ApiError method_not_allowed_error();                // 405
ApiError body_too_large_error(uint64_t max_bytes);  // 413
ApiError unsupported_media_type_error();            // 415
ApiError unauthorized_error();                      // 401
ApiError queue_full_error();                        // 429
ApiError shutting_down_error();                     // 503
ApiError model_loading_error();                    // 503 while the model loads
ApiError device_failed_error();                    // 503 once a DeviceFault ended the engine
ApiError internal_error();                          // 500, generic message
// Any other transport-level refusal (400 malformed HTTP, 408, 431, 503 too many
// connections): the given message, type by status, no param or code.
ApiError transport_error(int status, std::string message);

}  // namespace lily

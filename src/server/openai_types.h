// OpenAI-compatible JSON of the HTTP API: request parsing/validation, budget, responses, errors.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_format.h"

namespace lily {

// The one model id the server exposes (lily-reference §6.2).
inline constexpr std::string_view kServedModelId = "Qwen3.6-35B-A3B";

// Limits that apply while parsing a request body (independent of the model).
struct ServerLimits {
  std::string model_id = std::string(kServedModelId);  // `model` must equal this
  uint64_t max_body_bytes = 1048576;                    // larger bodies: 413
  int max_json_depth = 16;  // nesting cap; a valid request needs 3 levels
  uint64_t default_max_tokens = 128;  // used when the body has no `max_tokens`
};

// A client-visible error: HTTP status plus the OpenAI envelope fields. `param` and `code`
// serialize as null when absent. Thrown by everything in this header that validates.
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

// A validated POST /v1/chat/completions body (lily-reference §6.3 steps 1–6 passed).
struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;  // non-empty, last role user
  uint64_t max_tokens = 128;          // > 0; the default when absent
  bool max_tokens_given = false;      // whether the body carried `max_tokens`
  bool stream = false;                // always false once accepted
  std::optional<std::string> prompt_cache_key;  // absent or null: none
};

// Parses and validates a chat-completions body in Lily's order (docs/api.md):
// body size (413), UTF-8, strict JSON (depth cap, duplicate keys), object, unknown fields,
// field types, missing fields, then model, stream, empty messages, final role, max_tokens 0.
// Throws ApiError (status 400 or 413) on the first failure.
ChatRequest parse_chat_request(std::string_view body, const ServerLimits& limits);

// Step 7: the prompt text (history rewrite + template, thinking off). Template errors
// become ApiError 400 "rendering chat template: ...".
std::string render_request_prompt(const ChatRequest& request);

// Steps 8–9: given the tokenised prompt length, the requested max_tokens and the server's
// max_seq, returns the effective max_tokens (Lily: the request's value, unchanged) or throws
// ApiError 400: empty prompt; prompt + max_tokens + 1 overflowing 64 bits; or
// prompt + max_tokens + 1 > max_seq ("request needs N tokens but server max_seq is M").
uint64_t checked_max_tokens(uint64_t prompt_tokens, uint64_t max_tokens, uint64_t max_seq);

// Start-up clamp (lily-reference §6.1): min(cli, declared) when declared > 0, else cli; the
// result must be >= 2. Throws InputError("max_seq must be at least 2 ...").
uint64_t clamp_max_seq(uint64_t cli_max_seq, uint64_t declared_max_position_embeddings);

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

enum class FinishReason { stop, length };
std::string_view finish_reason_name(FinishReason reason);

// Everything a 200 chat-completion response carries (lily-reference §6.5).
struct CompletionResult {
  std::string id;
  int64_t created = 0;
  std::string model = std::string(kServedModelId);
  std::string content;  // may hold invalid UTF-8: replaced by U+FFFD when serialised
  FinishReason finish_reason = FinishReason::stop;
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;  // includes the stop token
  uint64_t cached_tokens = 0;
};

// Lily's exact field order: id, object, created, model, choices, usage.
std::string completion_response_json(const CompletionResult& result);

// GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by":"lily"}]}.
std::string models_response_json(std::string_view model_id, int64_t created);

// {"error":{"message","type","param","code"}} (param/code null when absent).
std::string error_response_json(const ApiError& error);

// The transport-level errors, so that every path uses one envelope (docs/api.md).
ApiError not_found_error();                         // 404
ApiError method_not_allowed_error();                // 405
ApiError body_too_large_error(uint64_t max_bytes);  // 413
ApiError unsupported_media_type_error();            // 415
ApiError unauthorized_error();                      // 401
ApiError queue_full_error();                        // 429
ApiError shutting_down_error();                     // 503
ApiError model_loading_error();                    // 503 while the model loads
ApiError internal_error();                          // 500, generic message
// Any other transport-level refusal (400 malformed HTTP, 408, 431, 503 too many
// connections): the given message, type by status, no param or code.
ApiError transport_error(int status, std::string message);

}  // namespace lily

// OpenAI-compatible JSON of the HTTP API: request parsing/validation, budget, responses, errors.
#include "server/openai_types.h"

#include <array>
#include <limits>

#include "core/error.h"
#include "core/strict_json.h"
#include "text/utf8.h"

namespace lily {

namespace {

constexpr std::string_view kInvalidRequest = "invalid_request_error";
constexpr std::string_view kServerError = "server_error";
constexpr std::string_view kParsePrefix = "parsing chat request: ";

// The fields Lily's ChatRequest accepts, in its declaration order.
constexpr std::array<std::string_view, 5> kAcceptedFields = {"model", "messages", "max_tokens",
                                                             "stream", "prompt_cache_key"};

using OrderedJson = nlohmann::ordered_json;

ApiError bad_request(std::string message, std::optional<std::string> param = std::nullopt,
                     std::optional<std::string> code = std::nullopt) {
  return ApiError(400, std::move(message), std::string(kInvalidRequest), std::move(param),
                  std::move(code));
}

// A step-1 failure (Lily: serde could not deserialize the body into ChatRequest). The detail
// may quote a value cut in the middle of a character; lossy repair keeps messages valid UTF-8.
ApiError parse_error(const std::string& detail, std::optional<std::string> param = std::nullopt) {
  return bad_request(std::string(kParsePrefix) + utf8::lossy(detail), std::move(param));
}

std::string dump(const OrderedJson& value) {
  return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

std::string in_quotes(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

bool is_accepted_field(std::string_view key) {
  for (std::string_view field : kAcceptedFields) {
    if (key == field) return true;
  }
  return false;
}

std::string accepted_fields_list() {
  std::string out;
  for (std::string_view field : kAcceptedFields) {
    if (!out.empty()) out += ", ";
    out += in_quotes(field);
  }
  return out;
}

// max_tokens: a JSON integer in [0, 2^64). Fractions (including 128.0 and 1e3), negatives
// and integers too large for 64 bits (which nlohmann parses as floating point) are refused
// before any conversion.
uint64_t parse_max_tokens(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  throw parse_error("max_tokens must be a non-negative integer (at most 18446744073709551615), "
                    "found " + describe_json(value),
                    "max_tokens");
}

}  // namespace

ChatRequest parse_chat_request(std::string_view body, const ServerLimits& limits) {
  if (body.size() > limits.max_body_bytes) throw body_too_large_error(limits.max_body_bytes);

  // Step 1: the body must deserialize into ChatRequest.
  if (body.substr(0, 3) == "\xEF\xBB\xBF") {
    throw parse_error("the body starts with a UTF-8 byte order mark; send plain JSON");
  }
  if (const size_t bad = utf8::find_invalid(body); bad != std::string_view::npos) {
    throw parse_error("the body is not valid UTF-8 (first bad byte at offset " +
                      std::to_string(bad) + ")");
  }
  Json root;
  try {
    root = parse_strict_json(body, "request body", limits.max_json_depth);
  } catch (const InputError& error) {
    throw parse_error(error.what());
  }
  if (!root.is_object()) {
    throw parse_error("the body must be a JSON object, found " + describe_json(root));
  }
  // Unknown fields first (nlohmann keeps keys sorted, so the first in byte order is named).
  for (const auto& [key, value] : root.items()) {
    if (!is_accepted_field(key)) {
      throw parse_error("unknown field " + in_quotes(key) + ", expected one of " +
                            accepted_fields_list(),
                        key);
    }
  }
  // Then the type of every present field, in declaration order; then missing fields.
  ChatRequest request;
  request.max_tokens = limits.default_max_tokens;
  if (auto it = root.find("model"); it != root.end()) {
    if (!it->is_string()) {
      throw parse_error("model must be a string, found " + describe_json(*it), "model");
    }
    request.model = it->get<std::string>();
  }
  if (auto it = root.find("messages"); it != root.end()) {
    try {
      request.messages = parse_chat_messages(*it, "messages");
    } catch (const InputError& error) {
      throw parse_error(error.what(), "messages");
    }
  }
  if (auto it = root.find("max_tokens"); it != root.end()) {
    request.max_tokens = parse_max_tokens(*it);
    request.max_tokens_given = true;
  }
  if (auto it = root.find("stream"); it != root.end()) {
    if (!it->is_boolean()) {
      throw parse_error("stream must be true or false, found " + describe_json(*it), "stream");
    }
    request.stream = it->get<bool>();
  }
  if (auto it = root.find("prompt_cache_key"); it != root.end() && !it->is_null()) {
    if (!it->is_string()) {
      throw parse_error("prompt_cache_key must be a string or null, found " + describe_json(*it),
                        "prompt_cache_key");
    }
    request.prompt_cache_key = it->get<std::string>();
  }
  if (!root.contains("model")) throw parse_error("missing field \"model\"", "model");
  if (!root.contains("messages")) throw parse_error("missing field \"messages\"", "messages");

  // Step 2: the model.
  if (request.model != limits.model_id) {
    throw bad_request("unknown model " + in_quotes(request.model) + "; this server exposes only " +
                          limits.model_id,
                      "model", "model_not_found");
  }
  // Step 3: streaming.
  if (request.stream) throw bad_request("streaming is not supported", "stream");
  // Steps 4-5: non-empty, last message from the user.
  try {
    check_chat_request_messages(request.messages);
  } catch (const InputError& error) {
    throw bad_request(error.what(), "messages");
  }
  // Step 6: max_tokens > 0.
  if (request.max_tokens == 0) {
    throw bad_request("max_tokens must be greater than zero", "max_tokens");
  }
  return request;
}

std::string render_request_prompt(const ChatRequest& request) {
  try {
    return render_chat(request.messages);
  } catch (const InputError& error) {
    throw bad_request(std::string("rendering chat template: ") + error.what(), "messages");
  }
}

uint64_t checked_max_tokens(uint64_t prompt_tokens, uint64_t max_tokens, uint64_t max_seq) {
  if (prompt_tokens == 0) {
    throw bad_request("chat template produced an empty prompt", "messages");
  }
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  // prompt + max_tokens + 1, each addition checked.
  if (max_tokens > kMax - prompt_tokens || prompt_tokens + max_tokens == kMax) {
    throw bad_request("request token count overflow", "max_tokens");
  }
  const uint64_t needed = prompt_tokens + max_tokens + 1;
  if (needed > max_seq) {
    throw bad_request("request needs " + std::to_string(needed) +
                          " tokens but server max_seq is " + std::to_string(max_seq),
                      "messages", "context_length_exceeded");
  }
  return max_tokens;
}

uint64_t clamp_max_seq(uint64_t cli_max_seq, uint64_t declared_max_position_embeddings) {
  uint64_t max_seq = cli_max_seq;
  if (declared_max_position_embeddings > 0 && declared_max_position_embeddings < max_seq) {
    max_seq = declared_max_position_embeddings;
  }
  if (max_seq < 2) {
    throw InputError("max_seq must be at least 2 (--max-seq " + std::to_string(cli_max_seq) +
                     ", checkpoint max_position_embeddings " +
                     std::to_string(declared_max_position_embeddings) + ")");
  }
  return max_seq;
}

std::string completion_id(int64_t created, uint64_t n) {
  return "chatcmpl-" + std::to_string(created) + "-" + std::to_string(n);
}

std::string CompletionIdGenerator::next(int64_t created) {
  return completion_id(created, next_.fetch_add(1, std::memory_order_relaxed));
}

std::string_view finish_reason_name(FinishReason reason) {
  return reason == FinishReason::stop ? "stop" : "length";
}

std::string completion_response_json(const CompletionResult& result) {
  OrderedJson message = OrderedJson::object();
  message["role"] = "assistant";
  message["content"] = result.content;
  OrderedJson choice = OrderedJson::object();
  choice["index"] = 0;
  choice["message"] = std::move(message);
  choice["finish_reason"] = finish_reason_name(result.finish_reason);
  OrderedJson details = OrderedJson::object();
  details["cached_tokens"] = result.cached_tokens;
  OrderedJson usage = OrderedJson::object();
  usage["prompt_tokens"] = result.prompt_tokens;
  usage["completion_tokens"] = result.completion_tokens;
  usage["total_tokens"] = result.prompt_tokens + result.completion_tokens;
  usage["prompt_tokens_details"] = std::move(details);
  OrderedJson out = OrderedJson::object();
  out["id"] = result.id;
  out["object"] = "chat.completion";
  out["created"] = result.created;
  out["model"] = result.model;
  out["choices"] = OrderedJson::array({std::move(choice)});
  out["usage"] = std::move(usage);
  return dump(out);
}

std::string models_response_json(std::string_view model_id, int64_t created) {
  OrderedJson model = OrderedJson::object();
  model["id"] = model_id;
  model["object"] = "model";
  model["created"] = created;
  model["owned_by"] = "lily";
  OrderedJson out = OrderedJson::object();
  out["object"] = "list";
  out["data"] = OrderedJson::array({std::move(model)});
  return dump(out);
}

std::string error_response_json(const ApiError& error) {
  OrderedJson inner = OrderedJson::object();
  inner["message"] = error.message;
  inner["type"] = error.type;
  inner["param"] = error.param ? OrderedJson(*error.param) : OrderedJson(nullptr);
  inner["code"] = error.code ? OrderedJson(*error.code) : OrderedJson(nullptr);
  OrderedJson out = OrderedJson::object();
  out["error"] = std::move(inner);
  return dump(out);
}

ApiError not_found_error() {
  return ApiError(404, "not found", std::string(kInvalidRequest));
}

ApiError method_not_allowed_error() {
  return ApiError(405, "method not allowed", std::string(kInvalidRequest));
}

ApiError body_too_large_error(uint64_t max_bytes) {
  return ApiError(413, "request body exceeds " + std::to_string(max_bytes) + " bytes",
                  std::string(kInvalidRequest));
}

ApiError unsupported_media_type_error() {
  return ApiError(415, "Content-Type must be application/json", std::string(kInvalidRequest));
}

ApiError unauthorized_error() {
  return ApiError(401, "missing or invalid API key (send Authorization: Bearer <key>)",
                  std::string(kInvalidRequest), std::nullopt, "invalid_api_key");
}

ApiError queue_full_error() {
  return ApiError(429, "server is busy: request queue is full, retry later",
                  std::string(kServerError), std::nullopt, "queue_full");
}

ApiError shutting_down_error() {
  return ApiError(503, "server is shutting down", std::string(kServerError), std::nullopt,
                  "shutting_down");
}

ApiError model_loading_error() {
  return ApiError(503, "the model is still loading; retry shortly", std::string(kServerError),
                  std::nullopt, "model_loading");
}

ApiError transport_error(int status, std::string message) {
  const bool server_side = status >= 500 || status == 429;
  return ApiError(status, std::move(message),
                  std::string(server_side ? kServerError : kInvalidRequest));
}

ApiError internal_error() {
  return ApiError(500, "internal server error", std::string(kServerError));
}

}  // namespace lily

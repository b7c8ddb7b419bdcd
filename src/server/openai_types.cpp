// OpenAI-compatible response JSON of the HTTP API: completions, stream chunks, models, errors.
#include "server/openai_types.h"

#include <charconv>
#include <cmath>

#include "core/strict_json.h"
#include "text/utf8.h"

namespace lily {

namespace {

constexpr std::string_view kInvalidRequest = "invalid_request_error";
constexpr std::string_view kServerError = "server_error";
using OrderedJson = nlohmann::ordered_json;

std::string dump(const OrderedJson& value) {
  return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// A float log-probability as the JSON number of its shortest decimal form (-0.1f is written
// -0.1, not -0.10000000149011612); non-finite values as -9999.0, as OpenAI does.
OrderedJson logprob_value(float value) {
  if (!std::isfinite(value)) return -9999.0;
  char buffer[32];
  const auto written = std::to_chars(buffer, buffer + sizeof(buffer), value);
  double shortest = static_cast<double>(value);
  if (written.ec == std::errc()) std::from_chars(buffer, written.ptr, shortest);  // locale-free
  return shortest;
}

OrderedJson token_bytes(std::string_view token) {
  OrderedJson bytes = OrderedJson::array();
  for (char c : token) bytes.push_back(static_cast<unsigned>(static_cast<unsigned char>(c)));
  return bytes;
}

// {"content":[{"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]}],
//  "refusal":null}
OrderedJson logprobs_json(const std::vector<TokenLogprob>& tokens) {
  OrderedJson content = OrderedJson::array();
  for (const TokenLogprob& t : tokens) {
    OrderedJson top = OrderedJson::array();
    for (const auto& [text, logprob] : t.top) {
      OrderedJson alt = OrderedJson::object();
      alt["token"] = utf8::lossy(text);
      alt["logprob"] = logprob_value(logprob);
      alt["bytes"] = token_bytes(text);
      top.push_back(std::move(alt));
    }
    OrderedJson entry = OrderedJson::object();
    entry["token"] = utf8::lossy(t.token);
    entry["logprob"] = logprob_value(t.logprob);
    entry["bytes"] = token_bytes(t.token);
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  OrderedJson out = OrderedJson::object();
  out["content"] = std::move(content);
  out["refusal"] = nullptr;
  return out;
}

OrderedJson usage_json(uint64_t prompt_tokens, uint64_t completion_tokens,
                       uint64_t cached_tokens, std::optional<uint64_t> reasoning_tokens) {
  OrderedJson details = OrderedJson::object();
  details["cached_tokens"] = cached_tokens;
  OrderedJson usage = OrderedJson::object();
  usage["prompt_tokens"] = prompt_tokens;
  usage["completion_tokens"] = completion_tokens;
  usage["total_tokens"] = prompt_tokens + completion_tokens;
  usage["prompt_tokens_details"] = std::move(details);
  if (reasoning_tokens) {
    OrderedJson completion = OrderedJson::object();
    completion["reasoning_tokens"] = *reasoning_tokens;
    usage["completion_tokens_details"] = std::move(completion);
  }
  return usage;
}

// id, object, created, model: the same on every chunk of a stream.
OrderedJson chunk_head(const ChunkContext& context) {
  OrderedJson out = OrderedJson::object();
  out["id"] = context.id;
  out["object"] = "chat.completion.chunk";
  out["created"] = context.created;
  out["model"] = context.model;
  return out;
}

// A chunk with one choice; null logprobs / finish_reason when not given.
OrderedJson chunk(const ChunkContext& context, OrderedJson delta, OrderedJson logprobs,
                  std::optional<std::string_view> finish_reason) {
  OrderedJson choice = OrderedJson::object();
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason ? OrderedJson(*finish_reason) : OrderedJson(nullptr);
  OrderedJson out = chunk_head(context);
  out["choices"] = OrderedJson::array({std::move(choice)});
  if (context.include_usage) out["usage"] = nullptr;
  return out;
}

}  // namespace

std::string completion_id(int64_t created, uint64_t n) {
  return "chatcmpl-" + std::to_string(created) + "-" + std::to_string(n);
}

std::string CompletionIdGenerator::next(int64_t created) {
  return completion_id(created, next_.fetch_add(1, std::memory_order_relaxed));
}

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::tool_calls: return "tool_calls";
  }
  return "stop";
}

std::string completion_response_json(const CompletionResult& result) {
  OrderedJson message = OrderedJson::object();
  message["role"] = "assistant";
  const bool null_content = !result.tool_calls.empty() && result.content.empty();
  message["content"] = null_content ? OrderedJson(nullptr) : OrderedJson(result.content);
  if (result.reasoning_content) message["reasoning_content"] = *result.reasoning_content;
  if (!result.tool_calls.empty()) {
    OrderedJson calls = OrderedJson::array();
    for (const ApiToolCall& call : result.tool_calls) {
      OrderedJson function = OrderedJson::object();
      function["name"] = call.name;
      function["arguments"] = call.arguments;
      OrderedJson entry = OrderedJson::object();
      entry["id"] = call.id;
      entry["type"] = "function";
      entry["function"] = std::move(function);
      calls.push_back(std::move(entry));
    }
    message["tool_calls"] = std::move(calls);
  }
  OrderedJson choice = OrderedJson::object();
  choice["index"] = 0;
  choice["message"] = std::move(message);
  if (result.mode == ApiMode::openai) {
    choice["logprobs"] = result.logprobs ? logprobs_json(*result.logprobs) : OrderedJson(nullptr);
  }
  choice["finish_reason"] = finish_reason_name(result.finish_reason);
  OrderedJson out = OrderedJson::object();
  out["id"] = result.id;
  out["object"] = "chat.completion";
  out["created"] = result.created;
  out["model"] = result.model;
  out["choices"] = OrderedJson::array({std::move(choice)});
  out["usage"] = usage_json(result.prompt_tokens, result.completion_tokens, result.cached_tokens,
                            result.reasoning_tokens);
  return dump(out);
}

std::string chunk_role_json(const ChunkContext& context) {
  OrderedJson delta = OrderedJson::object();
  delta["role"] = "assistant";
  delta["content"] = "";
  return dump(chunk(context, std::move(delta), nullptr, std::nullopt));
}

std::string chunk_content_json(const ChunkContext& context, std::string_view text,
                               const std::vector<TokenLogprob>* logprobs) {
  OrderedJson delta = OrderedJson::object();
  delta["content"] = std::string(text);
  return dump(chunk(context, std::move(delta),
                    logprobs ? logprobs_json(*logprobs) : OrderedJson(nullptr), std::nullopt));
}

std::string chunk_reasoning_json(const ChunkContext& context, std::string_view text,
                                 const std::vector<TokenLogprob>* logprobs) {
  OrderedJson delta = OrderedJson::object();
  delta["reasoning_content"] = std::string(text);
  return dump(chunk(context, std::move(delta),
                    logprobs ? logprobs_json(*logprobs) : OrderedJson(nullptr), std::nullopt));
}

std::string chunk_tool_call_json(const ChunkContext& context, size_t index, std::string_view id,
                                 std::string_view name, std::string_view arguments,
                                 const std::vector<TokenLogprob>* logprobs) {
  OrderedJson function = OrderedJson::object();
  if (!id.empty()) function["name"] = std::string(name);
  function["arguments"] = std::string(arguments);
  OrderedJson call = OrderedJson::object();
  call["index"] = index;
  if (!id.empty()) {
    call["id"] = std::string(id);
    call["type"] = "function";
  }
  call["function"] = std::move(function);
  OrderedJson delta = OrderedJson::object();
  delta["tool_calls"] = OrderedJson::array({std::move(call)});
  return dump(chunk(context, std::move(delta),
                    logprobs ? logprobs_json(*logprobs) : OrderedJson(nullptr), std::nullopt));
}

std::string chunk_finish_json(const ChunkContext& context, FinishReason reason) {
  return dump(chunk(context, OrderedJson::object(), nullptr, finish_reason_name(reason)));
}

std::string chunk_usage_json(const ChunkContext& context, uint64_t prompt_tokens,
                             uint64_t completion_tokens, uint64_t cached_tokens,
                             std::optional<uint64_t> reasoning_tokens) {
  OrderedJson out = chunk_head(context);
  out["choices"] = OrderedJson::array();
  out["usage"] = usage_json(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens);
  return dump(out);
}

std::string sse_frame(std::string_view json) {
  std::string out;
  out.reserve(json.size() + 8);
  out += "data: ";
  out += json;
  out += "\n\n";
  return out;
}

std::string sse_done() {
  return "data: [DONE]\n\n";
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

std::string sse_error_frame(const ApiError& error) {
  return sse_frame(error_response_json(error));
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

ApiError device_failed_error() {
  return ApiError(503, "the server's device failed; the server is restarting, retry shortly",
                  std::string(kServerError), std::nullopt, "device_failed");
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

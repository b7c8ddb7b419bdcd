// The API: routing, auth, health and the chat-completion pipeline (validate, render, tokenise, queue).
#include "server/api_handler.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <exception>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "server/auth.h"
#include "server/completion_stream.h"
#include "server/request_log.h"

namespace lily {

namespace {

constexpr std::string_view kHealthPath = "/health";
constexpr std::string_view kModelsPath = "/v1/models";
constexpr std::string_view kChatPath = "/v1/chat/completions";

// Status for a request whose client went away before its response (nginx's convention).
// Nobody receives it; it shows up in the log line.
constexpr int kClientClosedRequest = 499;

HttpResponse json_response(int status, std::string body, std::string log_detail = "") {
  HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  response.log_detail = std::move(log_detail);
  return response;
}

int64_t unix_seconds() {
  return static_cast<int64_t>(std::time(nullptr));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

HttpResponse api_error_response(const ApiError& error) {
  return json_response(error.status, error_response_json(error), error_log_detail(error.message));
}

bool is_json_content_type(std::string_view content_type) {
  if (content_type.empty()) return true;
  std::string_view media = content_type.substr(0, content_type.find(';'));
  while (!media.empty() && (media.front() == ' ' || media.front() == '\t')) media.remove_prefix(1);
  while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.remove_suffix(1);
  constexpr std::string_view kJson = "application/json";
  if (media.size() != kJson.size()) return false;
  for (size_t i = 0; i < kJson.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(media[i])) != kJson[i]) return false;
  }
  return true;
}

ApiHandler::ApiHandler(ApiConfig config) : config_(std::move(config)) {}

void ApiHandler::set_ready(ServingModel model) {
  model_ = std::move(model);
  // Requests are parsed only once ready (acquire), so this write is seen by all of them.
  if (model_.tokenizer != nullptr) config_.limits.token_id_count = model_.tokenizer->id_count();
  phase_.store(ServerPhase::ready, std::memory_order_release);
}

void ApiHandler::set_stopping() { phase_.store(ServerPhase::stopping, std::memory_order_release); }

std::optional<HttpResponse> ApiHandler::screen(const HttpRequestHead& head) {
  const std::string_view path = head.path;
  std::string_view allowed;
  if (path == kHealthPath || path == kModelsPath) {
    allowed = "GET";
  } else if (path == kChatPath) {
    allowed = "POST";
  } else {
    return api_error_response(not_found_error());
  }
  if (head.method != allowed) {
    HttpResponse response = api_error_response(method_not_allowed_error());
    response.headers = {{"Allow", std::string(allowed)}};
    return response;
  }
  if (config_.api_key && path != kHealthPath &&
      !bearer_token_matches(head.authorization, *config_.api_key)) {
    return api_error_response(unauthorized_error());
  }
  if (path == kChatPath) {
    if (!is_json_content_type(head.content_type)) {
      return api_error_response(unsupported_media_type_error());
    }
    switch (phase()) {
      case ServerPhase::loading: return api_error_response(model_loading_error());
      case ServerPhase::stopping: return api_error_response(shutting_down_error());
      case ServerPhase::ready: break;
    }
  }
  return std::nullopt;
}

HttpResponse ApiHandler::transport_error(int status, std::string message) {
  if (status == 413) return api_error_response(body_too_large_error(config_.limits.max_body_bytes));
  if (status == 500) return api_error_response(internal_error());
  return api_error_response(lily::transport_error(status, std::move(message)));
}

void ApiHandler::handle(HttpRequest request, Responder respond) {
  const std::string_view path = request.head.path;
  if (path == kHealthPath) {
    switch (phase()) {
      case ServerPhase::ready: return respond(json_response(200, R"({"status":"ok"})"));
      case ServerPhase::loading: return respond(json_response(503, R"({"status":"loading"})"));
      case ServerPhase::stopping: return respond(json_response(503, R"({"status":"stopping"})"));
    }
  }
  if (path == kModelsPath) {
    return respond(json_response(200, models_response_json(config_.limits.model_id, 0)));
  }
  chat_completion(std::move(request), std::move(respond));
}

namespace {

// " ignored=\"user,metadata\"": the accepted-and-ignored fields, once per request.
std::string ignored_log_detail(const std::vector<std::string>& fields) {
  if (fields.empty()) return "";
  std::string names;
  for (const std::string& field : fields) {
    if (!names.empty()) names += ',';
    names += field;
  }
  return " ignored=\"" + names + "\"";
}

uint64_t random_seed() {
  static thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator();
}

}  // namespace

SequenceConfig ApiHandler::sequence_config(const ChatRequest& chat, uint64_t max_tokens) const {
  SequenceConfig config;
  config.max_tokens = static_cast<int64_t>(max_tokens);
  config.stop_tokens = model_.stop_tokens;
  config.stop_strings = chat.stop;
  if (config_.limits.mode == ApiMode::openai) {
    config.sampling = resolve_sampling(chat.sampling, model_.sampling_defaults, random_seed());
  }
  config.top_logprobs = chat.logprobs ? chat.top_logprobs : -1;
  return config;
}

void ApiHandler::chat_completion(HttpRequest request, Responder respond) {
  try {
    // The phase may have changed since screen(); the model is only read once ready.
    if (phase() == ServerPhase::stopping) return respond(api_error_response(shutting_down_error()));
    if (phase() != ServerPhase::ready) return respond(api_error_response(model_loading_error()));
    const ChatRequest chat = parse_chat_request(request.body, config_.limits);
    const std::string log_extra = ignored_log_detail(chat.ignored_fields);
    const std::string prompt_text = render_request_prompt(chat);
    const std::vector<uint32_t> ids = model_.tokenizer->encode(prompt_text);
    const uint64_t max_tokens = checked_max_tokens(ids.size(), chat.max_tokens, model_.max_seq);

    EngineRequest job;
    job.prompt.assign(ids.begin(), ids.end());
    job.sequence = sequence_config(chat, max_tokens);
    job.prompt_cache_key = chat.prompt_cache_key;
    job.cancelled = request.client_gone ? request.client_gone
                                        : std::make_shared<std::atomic<bool>>(false);
    const ApiMode mode = config_.limits.mode;
    const bool logprobs = chat.logprobs;
    auto shared_request = std::make_shared<HttpRequest>(std::move(request));
    shared_request->body.clear();  // not needed any more; keeps queued requests small

    std::shared_ptr<CompletionStream> stream;
    if (chat.stream) {
      ChunkContext context;
      context.created = unix_seconds();
      context.id = ids_.next(context.created);
      context.model = config_.limits.model_id;
      context.include_usage = chat.include_usage;
      stream = std::make_shared<CompletionStream>(std::move(context), *model_.tokenizer, logprobs,
                                                  shared_request->post, shared_request->received);
      job.on_delta = [stream](SequenceDelta delta) { stream->on_delta(std::move(delta)); };
      job.on_complete = [stream, log_extra](EngineResult result) {
        stream->on_complete(std::move(result), log_extra);
      };
    } else {
      // The JSON is built on the connection's strand, not on the inference thread.
      job.on_complete = [this, respond, shared_request, mode, logprobs,
                         log_extra](EngineResult result) {
        auto build = [this, respond, shared_request, mode, logprobs, log_extra,
                      result = std::move(result)] {
          HttpResponse response;
          try {
            response = completion_response(result, *shared_request, mode, logprobs, log_extra);
          } catch (const std::exception& e) {
            write_log_line(std::string("request failed: building the response: ") + e.what());
            response = api_error_response(internal_error());
          }
          respond(std::move(response));
        };
        if (shared_request->post) {
          shared_request->post(std::move(build));
        } else {
          build();
        }
      };
    }
    Submission submission = model_.engine->submit(std::move(job));
    switch (submission.status) {
      case SubmitStatus::accepted:
        // Errors before this point were ordinary JSON responses; from here on the answer is a
        // stream (its role chunk goes out now, before the prefill).
        if (stream) stream->start(shared_request->start_stream(HttpStreamHead{}));
        return;
      case SubmitStatus::queue_full: return respond(api_error_response(queue_full_error()));
      case SubmitStatus::shutting_down: return respond(api_error_response(shutting_down_error()));
    }
  } catch (const ApiError& error) {
    respond(api_error_response(error));
  } catch (const std::exception& e) {
    write_log_line(std::string("request failed: ") + e.what());
    respond(api_error_response(internal_error()));
  }
}

HttpResponse ApiHandler::completion_response(const EngineResult& result,
                                             const HttpRequest& request, ApiMode mode,
                                             bool logprobs, const std::string& log_extra) {
  if (!result.ok()) {
    if (result.error == kShuttingDownError) return api_error_response(shutting_down_error());
    write_log_line("request failed: " + result.error);
    return api_error_response(internal_error());
  }
  const double wall = seconds_since(request.received);
  const std::string counts = completion_log_detail(
      static_cast<uint64_t>(result.prompt_tokens), static_cast<uint64_t>(result.cached_tokens),
      static_cast<uint64_t>(result.completion_tokens), wall) + log_extra;
  if (result.finish_reason == "cancelled") {
    const ApiError gone(kClientClosedRequest, "client disconnected", "invalid_request_error");
    HttpResponse response = api_error_response(gone);
    response.log_detail = counts + error_log_detail(gone.message);
    response.close = true;
    return response;
  }
  CompletionResult completion;
  completion.created = unix_seconds();
  completion.id = ids_.next(completion.created);
  completion.model = config_.limits.model_id;
  completion.mode = mode;
  completion.content = result.text;
  completion.finish_reason =
      result.finish_reason == "stop" ? FinishReason::stop : FinishReason::length;
  completion.prompt_tokens = static_cast<uint64_t>(result.prompt_tokens);
  completion.completion_tokens = static_cast<uint64_t>(result.completion_tokens);
  completion.cached_tokens = static_cast<uint64_t>(result.cached_tokens);
  if (logprobs) completion.logprobs = api_logprobs(result.logprobs, *model_.tokenizer);
  return json_response(200, completion_response_json(completion), counts);
}

}  // namespace lily

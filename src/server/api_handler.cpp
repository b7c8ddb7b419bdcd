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
constexpr std::string_view kMetricsPath = "/metrics";

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
  // Requests are parsed only once ready (acquire), so these writes are seen by all of them.
  if (model_.tokenizer != nullptr) {
    config_.limits.token_id_count = model_.tokenizer->id_count();
    const std::vector<int32_t> think_end = encode("</think>");
    if (think_end.size() == 1) think_end_token_ = think_end[0];
    const std::vector<int32_t> tool_call = encode("<tool_call>");
    if (tool_call.size() == 1) tool_call_token_ = tool_call[0];
  }
  phase_.store(ServerPhase::ready, std::memory_order_release);
}

void ApiHandler::set_stopping() {
  // A failed server stays failed: /health keeps saying why it is going away.
  ServerPhase expected = phase_.load(std::memory_order_acquire);
  while (expected != ServerPhase::failed &&
         !phase_.compare_exchange_weak(expected, ServerPhase::stopping, std::memory_order_acq_rel)) {
  }
}

void ApiHandler::set_failed() { phase_.store(ServerPhase::failed, std::memory_order_release); }

std::optional<HttpResponse> ApiHandler::screen(const HttpRequestHead& head) {
  const std::string_view path = head.path;
  std::string_view allowed;
  if (path == kHealthPath || path == kModelsPath || path == kMetricsPath) {
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
      case ServerPhase::failed: return api_error_response(device_failed_error());
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
      case ServerPhase::failed: return respond(json_response(503, R"({"status":"failed"})"));
    }
  }
  if (path == kModelsPath) {
    return respond(json_response(200, models_response_json(config_.limits.model_id, 0)));
  }
  if (path == kMetricsPath) {
    MetricsGauges gauges;
    if (phase() != ServerPhase::loading) {  // the model is read only once ready
      if (model_.engine != nullptr) gauges.queue_depth = model_.engine->queued();
      if (model_.backend != nullptr) gauges.device_memory_bytes = model_.backend->allocated_bytes();
    }
    if (in_flight_) gauges.in_flight = in_flight_();
    HttpResponse response = json_response(200, metrics_.render(gauges));
    response.headers = {{"Content-Type", "text/plain; version=0.0.4; charset=utf-8"}};
    return respond(std::move(response));
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

// The model text that opens a call (the template's format, T110-116), forced by tool_choice.
std::string tool_call_opening(const ChatRequest& chat) {
  std::string out = "<tool_call>\n<function=";
  if (chat.tool_choice == ToolChoice::named) {
    out += chat.tool_choice_name;
    out += ">\n";
  }
  return out;
}

}  // namespace

FinishReason answer_finish_reason(const std::string& engine_reason, bool has_tool_calls) {
  if (engine_reason == "length") return FinishReason::length;
  return has_tool_calls ? FinishReason::tool_calls : FinishReason::stop;
}

std::vector<int32_t> ApiHandler::encode(std::string_view text) const {
  const std::vector<uint32_t> ids = model_.tokenizer->encode(std::string(text));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

SequenceConfig ApiHandler::sequence_config(const ChatRequest& chat, uint64_t max_tokens,
                                           bool thinking) const {
  SequenceConfig config;
  config.max_tokens = static_cast<int64_t>(max_tokens);
  config.stop_tokens = model_.stop_tokens;
  config.stop_strings = chat.stop;
  config.top_logprobs = chat.logprobs ? chat.top_logprobs : -1;
  if (config_.limits.mode != ApiMode::openai) return config;  // strict: Lily's greedy decode

  // Greedy decoding loops in thinking mode: a thinking request that chooses no sampling gets
  // the checkpoint's recommended sampling unless the server set its own defaults.
  const bool recommended =
      thinking && !request_sets_sampling(chat.sampling) && !model_.sampling_defaults.any();
  const SamplingDefaults& defaults =
      recommended ? model_.thinking_sampling : model_.sampling_defaults;
  SamplingFields fields = chat.sampling;
  if (chat.tool_choice == ToolChoice::none && !chat.tools.empty() && tool_call_token_ >= 0) {
    // tool_choice "none" with tools in the prompt: the model must not open a call, so its
    // opening token is banned (a bias of -100, the API's floor) rather than only left unparsed.
    // A request that would have decoded greedily stays greedy: temperature 0 with the bias.
    if (!request_sets_sampling(fields) && !defaults.any()) fields.temperature = 0.0;
    const auto id = static_cast<uint32_t>(tool_call_token_);
    auto& bias = fields.logit_bias;
    const auto at = std::lower_bound(bias.begin(), bias.end(), std::make_pair(id, -1e9f));
    if (at != bias.end() && at->first == id) {
      at->second = -100.0f;
    } else if (bias.size() < static_cast<size_t>(kMaxLogitBias)) {
      bias.insert(at, {id, -100.0f});
    }
  }
  config.sampling = resolve_sampling(fields, defaults, random_seed());

  ForcingPlan& plan = config.forcing;
  if (thinking) {
    plan.reasoning_end = think_end_token_;
    plan.reasoning_budget = chat.reasoning_budget.value_or(model_.reasoning_budget);
    // The close the template writes after a reasoning (T101): "\n</think>\n\n".
    plan.reasoning_close = encode("\n</think>\n\n");
  }
  if (chat.tool_choice == ToolChoice::required || chat.tool_choice == ToolChoice::named) {
    // Thinking: right after </think>, where the template puts "\n\n" before the answer.
    plan.after_reasoning = encode((thinking ? "\n\n" : "") + tool_call_opening(chat));
  }
  if (const std::optional<std::string> scripted =
          match_test_script(model_.test_script, chat.messages)) {
    plan.prefix = encode(*scripted + "<|im_end|>");
    plan.reasoning_budget = -1;
    plan.after_reasoning.clear();
  }
  return config;
}

void ApiHandler::chat_completion(HttpRequest request, Responder respond) {
  try {
    // The phase may have changed since screen(); the model is only read once ready.
    if (phase() == ServerPhase::stopping) return respond(api_error_response(shutting_down_error()));
    if (phase() == ServerPhase::failed) return respond(api_error_response(device_failed_error()));
    if (phase() != ServerPhase::ready) return respond(api_error_response(model_loading_error()));
    const ChatRequest chat = parse_chat_request(request.body, config_.limits);
    const ApiMode mode = config_.limits.mode;
    const std::string log_extra = ignored_log_detail(chat.ignored_fields);
    AnswerShape shape;
    shape.thinking = mode == ApiMode::openai && chat.thinking.value_or(model_.thinking);
    if (shape.thinking && think_end_token_ < 0) {
      throw ApiError(400, "thinking is not available: the tokenizer has no single </think> token",
                     "invalid_request_error", "chat_template_kwargs.enable_thinking");
    }
    shape.parser.starts_in_reasoning = shape.thinking;
    shape.parser.tool_calls = !chat.tools.empty() && chat.tool_choice != ToolChoice::none;
    if (shape.parser.tool_calls) {
      OrderedJson tools = OrderedJson::array();
      for (const OrderedJson& tool : chat.tools) tools.push_back(tool);
      shape.parser.tools = tool_specs_from_openai(tools);
    }
    shape.parallel_tool_calls = chat.parallel_tool_calls;
    const std::string prompt_text = render_request_prompt(chat, shape.thinking);
    const std::vector<int32_t> ids = encode(prompt_text);
    // Strict mode refuses a budget that does not fit (Lily). Openai mode clamps it to what fits
    // after the prompt (the answer then ends with finish_reason "length"), as llama.cpp does:
    // agents send large fixed budgets (Qwen Code: 64000) whatever the server's max_seq.
    uint64_t max_tokens = 0;
    if (mode == ApiMode::strict) {
      max_tokens = checked_max_tokens(ids.size(), chat.max_tokens, model_.max_seq);
    } else {
      checked_max_tokens(ids.size(), 1, model_.max_seq);  // the prompt and one token must fit
      max_tokens = std::min<uint64_t>(chat.max_tokens, model_.max_seq - ids.size() - 1);
    }

    EngineRequest job;
    job.prompt = ids;
    // Token timing for /metrics: time to first token and the gaps between tokens (inference
    // thread only).
    struct TokenTiming {
      std::chrono::steady_clock::time_point first, last;
      bool any = false;
    };
    auto timing = std::make_shared<TokenTiming>();
    job.on_token = [this, timing](int32_t) {
      const auto now = std::chrono::steady_clock::now();
      if (timing->any) {
        metrics_.observe_inter_token(std::chrono::duration<double>(now - timing->last).count());
      } else {
        timing->first = now;
        timing->any = true;
      }
      timing->last = now;
    };
    const auto received = request.received;
    auto observe = [this, timing, received](const EngineResult& result) {
      if (!result.ok() || result.finish_reason == "cancelled" || !timing->any) return;
      metrics_.observe_completion(
          static_cast<uint64_t>(result.prompt_tokens), static_cast<uint64_t>(result.cached_tokens),
          static_cast<uint64_t>(result.completion_tokens),
          std::chrono::duration<double>(timing->first - received).count(), result.decode_seconds);
    };
    job.sequence = sequence_config(chat, max_tokens, shape.thinking);
    if (mode == ApiMode::openai) {
      // Where the prompt ends before the generation prompt: the next turn's prompt shares
      // everything up to there even when the template drops this turn's reasoning.
      const size_t generation_prompt = encode(chat_generation_prompt(shape.thinking)).size();
      if (ids.size() > generation_prompt) {
        job.snapshot_points = {static_cast<int64_t>(ids.size() - generation_prompt)};
      }
    }
    job.prompt_cache_key = chat.prompt_cache_key;
    if (!job.prompt_cache_key && mode == ApiMode::openai) {  // --strict: Lily's body only
      job.prompt_cache_key = request.head.prompt_cache_key;
    }
    job.cancelled = request.client_gone ? request.client_gone
                                        : std::make_shared<std::atomic<bool>>(false);
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
                                                  shape, shared_request->post,
                                                  shared_request->received);
      job.on_delta = [stream](SequenceDelta delta) { stream->on_delta(std::move(delta)); };
      job.on_complete = [stream, log_extra, observe](EngineResult result) {
        observe(result);
        stream->on_complete(std::move(result), log_extra);
      };
    } else {
      // The JSON is built on the connection's strand, not on the inference thread.
      job.on_complete = [this, respond, shared_request, mode, logprobs, shape, log_extra,
                         observe](EngineResult result) {
        observe(result);
        auto build = [this, respond, shared_request, mode, logprobs, shape, log_extra,
                      result = std::move(result)] {
          HttpResponse response;
          try {
            response =
                completion_response(result, *shared_request, mode, logprobs, shape, log_extra);
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
      case SubmitStatus::device_failed: return respond(api_error_response(device_failed_error()));
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
                                             bool logprobs, const AnswerShape& shape,
                                             const std::string& log_extra) {
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
  if (mode == ApiMode::strict) {
    completion.content = result.text;
    completion.finish_reason = answer_finish_reason(result.finish_reason, false);
  } else {
    // The same parser as a stream's, over the whole text at once.
    OutputParser parser(shape.parser, random_call_id);
    parser.feed(result.text);
    parser.finish(result.finish_reason == "length");
    const ParsedOutput& parsed = parser.output();
    completion.content = parsed.content;
    for (const ParsedToolCall& call : parsed.tool_calls) {
      if (!shape.parallel_tool_calls && !completion.tool_calls.empty()) break;
      completion.tool_calls.push_back({call.id, call.name, call.arguments});
    }
    if (shape.thinking) {
      completion.reasoning_content = parsed.reasoning;
      completion.reasoning_tokens = static_cast<uint64_t>(result.reasoning_tokens);
    }
    completion.finish_reason =
        answer_finish_reason(result.finish_reason, !completion.tool_calls.empty());
  }
  completion.prompt_tokens = static_cast<uint64_t>(result.prompt_tokens);
  completion.completion_tokens = static_cast<uint64_t>(result.completion_tokens);
  completion.cached_tokens = static_cast<uint64_t>(result.cached_tokens);
  if (logprobs) completion.logprobs = api_logprobs(result.logprobs, *model_.tokenizer);
  return json_response(200, completion_response_json(completion), counts);
}

}  // namespace lily

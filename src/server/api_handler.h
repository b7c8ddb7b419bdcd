// The API behind the transport: routing, auth, health, and chat completions through the engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_set>

#include "engine/engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_types.h"
#include "server/sampling_config.h"
#include "server/test_script.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace lily {

// failed: the device is lost (a DeviceFault ended the engine); the process exits shortly.
enum class ServerPhase { loading, ready, stopping, failed };

struct ApiConfig {
  ServerLimits limits;  // body size, nesting depth, model id, default max_tokens, API mode
  std::optional<std::string> api_key;  // when set, every path but /health needs it
};

// What a loaded model brings. The pointees are owned by the caller and must outlive every
// request (the engine is shut down before they go).
struct ServingModel {
  const Tokenizer* tokenizer = nullptr;
  Engine* engine = nullptr;
  std::unordered_set<int32_t> stop_tokens;
  uint64_t max_seq = 0;  // after clamp_max_seq
  // What a request that leaves sampling fields out gets (openai mode; none: greedy). Known
  // only once the checkpoint is (--sampling-defaults checkpoint).
  SamplingDefaults sampling_defaults;
  // Thinking (openai mode): the default for requests that do not choose (--thinking), the
  // reasoning budget for those that set none (--reasoning-budget; -1: none), and the sampling
  // of a thinking request that sets no sampling field while sampling_defaults is greedy: the
  // checkpoint's generation_config.json (greedy decoding loops in thinking mode).
  bool thinking = false;
  int64_t reasoning_budget = -1;
  SamplingDefaults thinking_sampling;
  // Test only (--test-script): requests whose last message matches a rule get its output.
  std::vector<TestScriptRule> test_script;
  const Backend* backend = nullptr;  // for /metrics' device memory (may be null)
};

// What the output of one chat request is parsed for (openai mode), fixed at admission.
struct AnswerShape {
  bool thinking = false;
  OutputParserConfig parser;
  bool parallel_tool_calls = true;  // false: only the first call is kept
};

// Routes (docs/api.md): GET /health, GET /v1/models, GET /metrics (Prometheus text),
// POST /v1/chat/completions; 404 for other paths, 405 for another method on a known path. Chat requests are parsed, validated,
// rendered and tokenised on the calling (HTTP) thread, then queued on the engine; the
// response is built when the engine hands back the result.
class ApiHandler : public HttpHandler {
 public:
  explicit ApiHandler(ApiConfig config);

  // loading -> ready. Call once, before any request can observe `ready`.
  void set_ready(ServingModel model);
  // -> stopping: /health answers 503 {"status":"stopping"}, new completions 503.
  void set_stopping();
  // -> failed (final): /health answers 503 {"status":"failed"}, new completions 503
  // device_failed; the engine has already failed what it held with 500s.
  void set_failed();
  ServerPhase phase() const { return phase_.load(std::memory_order_acquire); }
  // The process's metrics (observe requests into it from the transport: HttpServer's
  // observer). `in_flight` reads the transport's count for /metrics; set it before serving.
  ServerMetrics& metrics() { return metrics_; }
  void set_in_flight_source(std::function<uint64_t()> in_flight) {
    in_flight_ = std::move(in_flight);
  }

  std::optional<HttpResponse> screen(const HttpRequestHead& head) override;
  void handle(HttpRequest request, Responder respond) override;
  HttpResponse transport_error(int status, std::string message) override;

 private:
  void chat_completion(HttpRequest request, Responder respond);
  // The request's generation: budget, stop tokens and strings, token choice, logprobs, and
  // the tokens forced by tool_choice, the reasoning budget or a test script.
  SequenceConfig sequence_config(const ChatRequest& chat, uint64_t max_tokens,
                                 bool thinking) const;
  std::vector<int32_t> encode(std::string_view text) const;
  HttpResponse completion_response(const EngineResult& result, const HttpRequest& request,
                                   ApiMode mode, bool logprobs, const AnswerShape& shape,
                                   const std::string& log_extra);

  ApiConfig config_;
  std::atomic<ServerPhase> phase_{ServerPhase::loading};
  ServingModel model_;  // written before phase_ becomes ready (release), read after (acquire)
  CompletionIdGenerator ids_;
  ServerMetrics metrics_;
  std::function<uint64_t()> in_flight_;
  int32_t think_end_token_ = -1;  // `</think>`, when the tokenizer has it as one token
  int32_t tool_call_token_ = -1;  // `<tool_call>`, likewise (banned by tool_choice "none")
};

// The finish_reason of an answer: the engine's "length" or "stop", the latter "tool_calls"
// when the answer holds calls.
FinishReason answer_finish_reason(const std::string& engine_reason, bool has_tool_calls);

// The OpenAI envelope for an error, with its log detail.
HttpResponse api_error_response(const ApiError& error);

// Whether a Content-Type value names JSON: media type "application/json" (any case, any
// parameters such as charset). An absent header (empty string) is accepted as JSON.
bool is_json_content_type(std::string_view content_type);

}  // namespace lily

// The API behind the transport: routing, auth, health, and chat completions through the engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>

#include "engine/engine.h"
#include "server/http_server.h"
#include "server/openai_types.h"
#include "server/sampling_config.h"
#include "text/tokenizer.h"

namespace lily {

enum class ServerPhase { loading, ready, stopping };

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
};

// Routes (docs/api.md): GET /health, GET /v1/models, POST /v1/chat/completions; 404 for other
// paths, 405 for another method on a known path. Chat requests are parsed, validated,
// rendered and tokenised on the calling (HTTP) thread, then queued on the engine; the
// response is built when the engine hands back the result.
class ApiHandler : public HttpHandler {
 public:
  explicit ApiHandler(ApiConfig config);

  // loading -> ready. Call once, before any request can observe `ready`.
  void set_ready(ServingModel model);
  // -> stopping: /health answers 503 {"status":"stopping"}, new completions 503.
  void set_stopping();
  ServerPhase phase() const { return phase_.load(std::memory_order_acquire); }

  std::optional<HttpResponse> screen(const HttpRequestHead& head) override;
  void handle(HttpRequest request, Responder respond) override;
  HttpResponse transport_error(int status, std::string message) override;

 private:
  void chat_completion(HttpRequest request, Responder respond);
  // The request's generation: budget, stop tokens and strings, token choice, logprobs.
  SequenceConfig sequence_config(const ChatRequest& chat, uint64_t max_tokens) const;
  HttpResponse completion_response(const EngineResult& result, const HttpRequest& request,
                                   ApiMode mode, bool logprobs, const std::string& log_extra);

  ApiConfig config_;
  std::atomic<ServerPhase> phase_{ServerPhase::loading};
  ServingModel model_;  // written before phase_ becomes ready (release), read after (acquire)
  CompletionIdGenerator ids_;
};

// The OpenAI envelope for an error, with its log detail.
HttpResponse api_error_response(const ApiError& error);

// Whether a Content-Type value names JSON: media type "application/json" (any case, any
// parameters such as charset). An absent header (empty string) is accepted as JSON.
bool is_json_content_type(std::string_view content_type);

}  // namespace lily

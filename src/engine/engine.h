// The engine loop: one inference thread serving requests one at a time from a bounded FIFO queue.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "engine/sampler_state.h"
#include "engine/sequence.h"
#include "engine/session_cache.h"
#include "model/qwen36_model.h"

namespace lily {

struct EngineResult;

// One generation request. The HTTP side keeps a copy of `cancelled` and sets it when the client
// disconnects: a queued request is then skipped, a running one stops within one decode step.
struct EngineRequest {
  std::vector<int32_t> prompt;  // token ids, non-empty
  // max_tokens (>= 1; prompt + max_tokens + 1 must fit the cache's max_seq), stop tokens and
  // strings, sampling, logprobs. Stop strings need the engine's tokenizer.
  SequenceConfig sequence;
  std::optional<std::string> prompt_cache_key;
  // Session-cache snapshot points: prompt positions, ascending, where the state is
  // snapshotted during prefill, e.g. where the prompt ends before its generation prompt, so
  // that the next turn, which drops this turn's reasoning, still reuses the prompt up to
  // there. Points at or below the reused prefix, or not below prompt.size(), are skipped.
  // Empty (--strict): Lily's strict-prefix reuse only.
  std::vector<int64_t> snapshot_points;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  // Optional, called on the inference thread after each generated token, before the
  // cancellation flag is checked. Must not throw.
  std::function<void(int32_t)> on_token;
  // Optional (streaming), called on the inference thread whenever the sequence released text
  // or logprob entries, in order; the last call comes before on_complete. Must be cheap (hand
  // the delta to another thread) and must not throw.
  std::function<void(SequenceDelta)> on_delta;
  // Optional. When set, the result is handed to this callback instead of Submission::result
  // (which is then not valid): on the inference thread, or on the thread calling shutdown()
  // for requests still queued then. Lets an asynchronous caller resume without blocking a
  // thread on a future. Must not throw.
  std::function<void(EngineResult)> on_complete;
};

struct EngineResult {
  std::vector<int32_t> tokens;  // includes the stop token when one ended generation
  std::string finish_reason;    // "stop", "length" or "cancelled" ("" on error)
  std::string text;             // the released text (empty without a tokenizer)
  std::vector<TokenLogprobs> logprobs;  // when the request asked for logprobs
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // reused prefix from the session cache
  int64_t reasoning_tokens = 0;  // of completion_tokens, inside the reasoning (thinking on)
  double prefill_seconds = 0;
  double decode_seconds = 0;
  std::string error;  // non-empty when the request failed (no other field is meaningful then)

  bool ok() const { return error.empty(); }
};

enum class SubmitStatus {
  accepted,       // `result` will be fulfilled
  queue_full,     // refused at once (HTTP 429)
  shutting_down,  // refused, the engine no longer accepts work (HTTP 503)
  device_failed,  // refused, the device is lost (DeviceFault); the process must restart (503)
};

struct Submission {
  SubmitStatus status = SubmitStatus::shutting_down;
  std::future<EngineResult> result;  // valid only when accepted without an on_complete callback
};

// Error text of requests failed because the engine shut down while they were queued.
inline constexpr const char* kShuttingDownError = "shutting down";
// Start of the error text of requests failed by a DeviceFault (in flight or queued then);
// the fault's own text follows, for the log.
inline constexpr const char* kDeviceFailedError = "device failed: ";

// Called once, on the inference thread, when a DeviceFault ends the engine: new submissions
// are already refused, and the requests it held are failed right after the call returns.
// `what` is the fault's text. Must not throw.
using DeviceFaultHandler = std::function<void(const std::string& what)>;

// Owns the inference thread. The model and cache must outlive the engine; nothing else may use
// them while it runs. Thread-safe: submit/shutdown may be called from any thread.
class Engine {
 public:
  static constexpr size_t kDefaultQueueCapacity = 16;

  // `tokenizer` (may be null: no text in results, stop strings refused) must outlive the engine.
  // A DeviceFault from the model fails the request in flight and every queued one (error
  // kDeviceFailedError + the fault), refuses later submissions (device_failed), stops the
  // inference thread and calls `on_device_fault` (may be empty). Any other exception fails
  // only its request.
  Engine(Qwen36Model& model, SessionCache& cache, size_t queue_capacity = kDefaultQueueCapacity,
         const Tokenizer* tokenizer = nullptr, DeviceFaultHandler on_device_fault = {});
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();  // shutdown()

  // Returns immediately. Accepted requests run in FIFO order; the queue holds at most
  // queue_capacity requests waiting behind the one in flight.
  Submission submit(EngineRequest request);

  // Stops accepting (later submits answer shutting_down), lets the request in flight finish,
  // fails the still-queued ones with kShuttingDownError and joins the thread. Idempotent.
  void shutdown();

  size_t queue_capacity() const { return capacity_; }
  size_t queued() const;  // requests waiting (not counting the one in flight)
  bool device_failed() const;  // a DeviceFault has ended the engine

 private:
  struct Job {
    EngineRequest request;
    std::promise<EngineResult> promise;
  };

  void loop();
  EngineResult run(const EngineRequest& request);
  static void finish(Job& job, EngineResult result);
  // After a DeviceFault in `job`: fails it and every queued job, refuses new ones.
  void fail_device(Job& job, const std::string& what);

  Qwen36Model& model_;
  SessionCache& cache_;
  const Tokenizer* tokenizer_;
  // The one running sequence's sampler buffers, uploaded at the start of each request that
  // samples or asks for logprobs.
  SamplerState sampler_;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  bool device_failed_ = false;  // under mutex_
  DeviceFaultHandler on_device_fault_;
  std::mutex join_mutex_;
  std::thread thread_;
};

}  // namespace lily

// The engine loop: bounded FIFO queue, one inference thread, session-cache leases, cancellation.
#include "engine/engine.h"

#include <exception>
#include <span>
#include <utility>

#include "engine/generator.h"

namespace lily {
namespace {

EngineResult error_result(const EngineRequest& request, std::string message) {
  EngineResult result;
  result.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  result.error = std::move(message);
  return result;
}

bool is_cancelled(const EngineRequest& request) {
  return request.cancelled && request.cancelled->load(std::memory_order_acquire);
}

}  // namespace

Engine::Engine(Qwen36Model& model, SessionCache& cache, size_t queue_capacity)
    : model_(model), cache_(cache), capacity_(queue_capacity) {
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

Submission Engine::submit(EngineRequest request) {
  Submission submission;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      submission.status = SubmitStatus::shutting_down;
      return submission;
    }
    if (queue_.size() >= capacity_) {
      submission.status = SubmitStatus::queue_full;
      return submission;
    }
    Job job{std::move(request), std::promise<EngineResult>()};
    if (!job.request.on_complete) submission.result = job.promise.get_future();
    submission.status = SubmitStatus::accepted;
    queue_.push_back(std::move(job));
  }
  wake_.notify_one();
  return submission;
}

void Engine::shutdown() {
  std::deque<Job> abandoned;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    abandoned.swap(queue_);
  }
  wake_.notify_all();
  // Queued requests fail at once; the one in flight (if any) finishes on the thread.
  for (Job& job : abandoned) {
    finish(job, error_result(job.request, kShuttingDownError));
  }
  std::lock_guard<std::mutex> join_lock(join_mutex_);
  if (thread_.joinable()) thread_.join();
}

size_t Engine::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size();
}

void Engine::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;  // shutdown() has taken over whatever was still queued
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    EngineResult result;
    try {
      result = run(job.request);
    } catch (const std::exception& e) {
      result = error_result(job.request, std::string("internal error: ") + e.what());
    } catch (...) {
      result = error_result(job.request, "internal error");
    }
    finish(job, std::move(result));
  }
}

void Engine::finish(Job& job, EngineResult result) {
  if (job.request.on_complete) {
    job.request.on_complete(std::move(result));
  } else {
    job.promise.set_value(std::move(result));
  }
}

EngineResult Engine::run(const EngineRequest& request) {
  const auto prompt_size = static_cast<int64_t>(request.prompt.size());
  if (request.prompt.empty()) return error_result(request, "invalid request: empty prompt");
  if (request.max_tokens < 1) return error_result(request, "invalid request: max_tokens < 1");
  if (prompt_size + request.max_tokens + 1 > cache_.max_seq()) {
    return error_result(request, "invalid request: prompt + max_tokens exceeds max_seq");
  }

  EngineResult result;
  result.prompt_tokens = prompt_size;
  if (is_cancelled(request)) {  // cancelled while queued: skipped without running
    result.finish_reason = "cancelled";
    return result;
  }

  const std::span<const int32_t> prompt(request.prompt);
  SessionLease lease;
  try {
    lease = cache_.acquire(prompt, request.prompt_cache_key);
    GenerationOptions options;
    options.max_tokens = request.max_tokens;
    options.stop_tokens = request.stop_tokens;
    options.on_token = [&request](int32_t token) {
      if (request.on_token) request.on_token(token);
      return !is_cancelled(request);
    };
    options.cancel_prefill = [&request] { return is_cancelled(request); };
    const int64_t cached = lease.cached_tokens();
    GenerationResult generated = generate_greedy(
        model_, lease.state(), prompt.subspan(static_cast<size_t>(cached)), options);
    cache_.release(lease, SessionCache::consumed_tokens(prompt, generated));
    result.cached_tokens = cached;
    result.completion_tokens = static_cast<int64_t>(generated.tokens.size());
    result.tokens = std::move(generated.tokens);
    result.finish_reason = std::move(generated.finish_reason);
    result.prefill_seconds = generated.prefill_seconds;
    result.decode_seconds = generated.decode_seconds;
    return result;
  } catch (const std::exception& e) {
    cache_.drop(lease);
    return error_result(request, std::string("generation failed: ") + e.what());
  }
}

}  // namespace lily

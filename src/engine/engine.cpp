// The engine loop: bounded FIFO queue, one inference thread, session-cache leases, cancellation.
#include "engine/engine.h"

#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
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

// Why the snapshot points cannot be served ("" when they can). Points outside the prompt are
// skipped by the generator; only the order is the caller's to get right.
std::string snapshot_points_error(const std::vector<int64_t>& points) {
  for (size_t i = 1; i < points.size(); ++i) {
    if (points[i] < points[i - 1]) {
      return "snapshot points must be ascending, found " + std::to_string(points[i]) +
             " after " + std::to_string(points[i - 1]);
    }
  }
  return "";
}

}  // namespace

Engine::Engine(Qwen36Model& model, SessionCache& cache, size_t queue_capacity,
               const Tokenizer* tokenizer, DeviceFaultHandler on_device_fault)
    : model_(model),
      cache_(cache),
      tokenizer_(tokenizer),
      sampler_(model.backend(), static_cast<int64_t>(model.shape().vocab_size)),
      capacity_(queue_capacity),
      on_device_fault_(std::move(on_device_fault)) {
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

Submission Engine::submit(EngineRequest request) {
  Submission submission;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device_failed_) {
      submission.status = SubmitStatus::device_failed;
      return submission;
    }
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

bool Engine::device_failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return device_failed_;
}

void Engine::fail_device(Job& job, const std::string& what) {
  std::deque<Job> queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    device_failed_ = true;
    queued.swap(queue_);
  }
  // The handler first: by the time a client holds its 500, /health already says "failed".
  if (on_device_fault_) on_device_fault_(what);
  const std::string error = kDeviceFailedError + what;
  finish(job, error_result(job.request, error));
  for (Job& waiting : queued) finish(waiting, error_result(waiting.request, error));
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
    } catch (const DeviceFault& fault) {
      // Nothing can run on the device any more: fail everything, end the thread.
      fail_device(job, fault.what());
      return;
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
  const int64_t max_tokens = request.sequence.max_tokens;
  if (request.prompt.empty()) return error_result(request, "invalid request: empty prompt");
  if (max_tokens < 1) return error_result(request, "invalid request: max_tokens < 1");
  if (prompt_size + max_tokens + 1 > cache_.max_seq()) {
    return error_result(request, "invalid request: prompt + max_tokens exceeds max_seq");
  }
  if (tokenizer_ == nullptr && !request.sequence.stop_strings.empty()) {
    return error_result(request, "invalid request: stop strings without a tokenizer");
  }
  if (const std::string why = snapshot_points_error(request.snapshot_points);
      !why.empty()) {
    return error_result(request, "invalid request: " + why);
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
    Sequence sequence(tokenizer_, request.sequence);
    GenerationOptions options;
    options.max_tokens = max_tokens;
    options.stop_tokens = request.sequence.stop_tokens;
    if (request.sequence.sampling || sequence.wants_logprobs()) {
      SamplerParams params = request.sequence.sampling.value_or(SamplerParams{});
      params.top_logprobs = request.sequence.top_logprobs;
      sampler_.upload(params, request.sequence.sampling.has_value(), prompt);
    }
    if (request.sequence.sampling) options.choice.sampler = &sampler_.buffers();
    options.choice.logprobs = sequence.wants_logprobs();
    options.choice.logprob_params = &sampler_.buffers();
    auto emit = [&request, &sequence, &result] {
      SequenceDelta delta = sequence.take_delta();
      if (delta.text.empty() && delta.logprobs.empty()) return;
      result.logprobs.insert(result.logprobs.end(), delta.logprobs.begin(), delta.logprobs.end());
      if (request.on_delta) request.on_delta(std::move(delta));
    };
    // The sequence decides the stop token, stop strings and length; the generator's own
    // checks agree with it on the first two and on max_tokens.
    options.on_token = [&](int32_t token, const int32_t* record) {
      if (request.on_token) request.on_token(token);
      const bool more = sequence.accept(token, record);
      if (is_cancelled(request)) {
        sequence.cancel();
        return TokenAction::cancel;
      }
      emit();
      if (!more && sequence.end() == SequenceEnd::stop_string) return TokenAction::stop;
      return TokenAction::proceed;
    };
    options.cancel_prefill = [&request] { return is_cancelled(request); };
    options.snapshot_at = request.snapshot_points;
    options.on_snapshot = [this, &lease](DecodeState&) { cache_.snapshot(lease); };
    options.take_forced = [&sequence] { return sequence.take_forced(); };
    const int64_t cached = lease.cached_tokens();
    GenerationResult generated = generate(
        model_, lease.state(), prompt.subspan(static_cast<size_t>(cached)), options);
    cache_.release(lease, SessionCache::consumed_tokens(prompt, generated));
    sequence.set_fed(generated.fed);
    if (generated.finish_reason == "cancelled") sequence.cancel();
    result.cached_tokens = cached;
    result.completion_tokens = static_cast<int64_t>(generated.tokens.size());
    result.tokens = std::move(generated.tokens);
    result.finish_reason = std::move(generated.finish_reason);
    result.text = sequence.text();
    result.reasoning_tokens = sequence.reasoning_tokens();
    result.prefill_seconds = generated.prefill_seconds;
    result.decode_seconds = generated.decode_seconds;
    return result;
  } catch (const DeviceFault&) {
    throw;  // the engine's end, not this request's (loop); the lease's state is lost with it
  } catch (const std::exception& e) {
    cache_.drop(lease);
    return error_result(request, std::string("generation failed: ") + e.what());
  }
}

}  // namespace lily

// Engine loop: results match generate, cache reuse, queue limit, cancellation, shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../model/tiny_model_fixture.h"
#include "backend/backend.h"
#include "backend/fault_injection.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/session_cache.h"
#include "model/qwen36_model.h"

namespace lily {
namespace {

constexpr int64_t kMaxSeq = 128;

testing::TinyModel& tiny() { return testing::tiny_model(); }

std::unique_ptr<SessionCache> make_cache() {
  return std::make_unique<SessionCache>(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq);
}

// `n` deterministic token ids starting from `seed`.
std::vector<int32_t> tokens(size_t n, uint32_t seed) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int32_t>((seed * 7919u + static_cast<uint32_t>(i) * 2654435761u) % 997u);
  }
  return ids;
}

// generate on a fresh state, without the engine.
GenerationResult direct(const std::vector<int32_t>& prompt, const GenerationOptions& options) {
  auto cache = make_cache();
  SessionLease lease = cache->acquire(prompt);
  GenerationResult result = generate(tiny().model, lease.state(), prompt, options);
  cache->drop(lease);
  return result;
}

EngineRequest request(std::vector<int32_t> prompt, int64_t max_tokens) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.sequence.max_tokens = max_tokens;
  return r;
}

// A one-shot gate the inference thread blocks on (inside on_token) until the test opens it.
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Opens the gate when a test leaves early, so the engine's shutdown never waits on it forever.
struct OpenOnExit {
  Gate& gate;
  ~OpenOnExit() { gate.open(); }
};

// A request that signals `started` on its first token and then holds the thread until `gate`.
EngineRequest blocking_request(std::latch& started, Gate& gate, int64_t max_tokens = 64) {
  EngineRequest r = request(tokens(10, 9), max_tokens);
  auto first = std::make_shared<bool>(true);
  r.on_token = [&started, &gate, first](int32_t) {
    if (*first) {
      *first = false;
      started.count_down();
      gate.wait();
    }
  };
  return r;
}

TEST(EngineLoop, ResultMatchesGenerateGreedy) {
  const auto prompt = tokens(10, 1);
  GenerationOptions options;
  options.max_tokens = 12;
  const GenerationResult plain = direct(prompt, options);
  options.stop_tokens = {plain.tokens[3]};
  const GenerationResult stopped = direct(prompt, options);

  auto cache = make_cache();
  Engine engine(tiny().model, *cache);
  Submission a = engine.submit(request(prompt, 12));
  EngineRequest with_stop = request(prompt, 12);
  with_stop.sequence.stop_tokens = options.stop_tokens;
  Submission b = engine.submit(std::move(with_stop));
  ASSERT_EQ(a.status, SubmitStatus::accepted);
  ASSERT_EQ(b.status, SubmitStatus::accepted);

  const EngineResult ra = a.result.get();
  ASSERT_TRUE(ra.ok()) << ra.error;
  EXPECT_EQ(ra.tokens, plain.tokens);
  EXPECT_EQ(ra.finish_reason, plain.finish_reason);
  EXPECT_EQ(ra.prompt_tokens, 10);
  EXPECT_EQ(ra.completion_tokens, 12);
  EXPECT_EQ(ra.cached_tokens, 0);

  const EngineResult rb = b.result.get();
  ASSERT_TRUE(rb.ok()) << rb.error;
  EXPECT_EQ(rb.tokens, stopped.tokens);
  EXPECT_EQ(rb.finish_reason, "stop");
  EXPECT_EQ(rb.completion_tokens, static_cast<int64_t>(stopped.tokens.size()));
}

TEST(EngineLoop, SecondTurnReusesFirstTurnState) {
  auto cache = make_cache();
  Engine engine(tiny().model, *cache);
  const auto turn1 = tokens(10, 1);
  const EngineResult r1 = engine.submit(request(turn1, 6)).result.get();
  ASSERT_TRUE(r1.ok()) << r1.error;
  ASSERT_EQ(r1.finish_reason, "length");  // fed = 5 (the last token is not fed)

  auto turn2 = turn1;
  turn2.insert(turn2.end(), r1.tokens.begin(), r1.tokens.end());
  const auto extra = tokens(3, 2);
  turn2.insert(turn2.end(), extra.begin(), extra.end());
  const EngineResult r2 = engine.submit(request(turn2, 4)).result.get();
  ASSERT_TRUE(r2.ok()) << r2.error;
  EXPECT_EQ(r2.cached_tokens, 10 + 5);
  EXPECT_EQ(r2.prompt_tokens, static_cast<int64_t>(turn2.size()));

  GenerationOptions options;
  options.max_tokens = 4;
  EXPECT_EQ(r2.tokens, direct(turn2, options).tokens);  // reuse gives the same tokens as fresh
}

TEST(EngineLoop, FullQueueRefusesAtOnceWhileAcceptedOnesComplete) {
  auto cache = make_cache();
  Gate gate;
  std::latch started(1);
  Engine engine(tiny().model, *cache, 2);
  OpenOnExit opener{gate};
  EXPECT_EQ(engine.queue_capacity(), 2u);

  Submission busy = engine.submit(blocking_request(started, gate));
  ASSERT_EQ(busy.status, SubmitStatus::accepted);
  started.wait();  // the thread is now inside the first request; the queue is empty
  Submission q1 = engine.submit(request(tokens(5, 3), 3));
  Submission q2 = engine.submit(request(tokens(5, 4), 3));
  ASSERT_EQ(q1.status, SubmitStatus::accepted);
  ASSERT_EQ(q2.status, SubmitStatus::accepted);
  EXPECT_EQ(engine.queued(), 2u);
  Submission refused = engine.submit(request(tokens(5, 5), 3));
  EXPECT_EQ(refused.status, SubmitStatus::queue_full);
  EXPECT_FALSE(refused.result.valid());

  gate.open();
  const EngineResult rb = busy.result.get();
  ASSERT_TRUE(rb.ok()) << rb.error;
  EXPECT_EQ(rb.finish_reason, "length");
  EXPECT_EQ(rb.completion_tokens, 64);
  for (Submission* s : {&q1, &q2}) {
    const EngineResult r = s->result.get();
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.completion_tokens, 3);
  }
  // Room again once drained.
  EXPECT_EQ(engine.submit(request(tokens(5, 5), 2)).result.get().completion_tokens, 2);
}

TEST(EngineLoop, CancellingInFlightRequestStopsItAndNextRuns) {
  auto cache = make_cache();
  Gate gate;
  std::latch started(1);
  Engine engine(tiny().model, *cache);
  OpenOnExit opener{gate};

  EngineRequest long_request = blocking_request(started, gate);
  const auto cancel = long_request.cancelled;
  Submission a = engine.submit(std::move(long_request));
  started.wait();
  Submission b = engine.submit(request(tokens(8, 6), 5));
  cancel->store(true);  // as the HTTP side does on disconnect
  gate.open();

  const EngineResult ra = a.result.get();
  ASSERT_TRUE(ra.ok()) << ra.error;
  EXPECT_EQ(ra.finish_reason, "cancelled");
  EXPECT_EQ(ra.completion_tokens, 1);  // stopped on the token where the flag was seen

  const EngineResult rb = b.result.get();
  ASSERT_TRUE(rb.ok()) << rb.error;
  EXPECT_EQ(rb.finish_reason, "length");
  GenerationOptions options;
  options.max_tokens = 5;
  EXPECT_EQ(rb.tokens, direct(tokens(8, 6), options).tokens);
}

TEST(EngineLoop, RequestCancelledWhileQueuedIsSkipped) {
  auto cache = make_cache();
  Gate gate;
  std::latch started(1);
  Engine engine(tiny().model, *cache);
  OpenOnExit opener{gate};

  Submission a = engine.submit(blocking_request(started, gate, 4));
  started.wait();
  auto ran = std::make_shared<std::atomic<bool>>(false);
  EngineRequest skipped = request(tokens(6, 7), 4);
  skipped.on_token = [ran](int32_t) { ran->store(true); };
  const auto cancel = skipped.cancelled;
  Submission b = engine.submit(std::move(skipped));
  Submission c = engine.submit(request(tokens(6, 8), 4));
  cancel->store(true);
  gate.open();

  EXPECT_TRUE(a.result.get().ok());
  const EngineResult rb = b.result.get();
  ASSERT_TRUE(rb.ok()) << rb.error;
  EXPECT_EQ(rb.finish_reason, "cancelled");
  EXPECT_TRUE(rb.tokens.empty());
  EXPECT_EQ(rb.completion_tokens, 0);
  EXPECT_EQ(rb.prompt_tokens, 6);
  const EngineResult rc = c.result.get();
  ASSERT_TRUE(rc.ok()) << rc.error;
  EXPECT_EQ(rc.completion_tokens, 4);
  EXPECT_FALSE(ran->load());
}

TEST(EngineLoop, ShutdownFinishesInFlightAndFailsQueued) {
  auto cache = make_cache();
  Gate gate;
  std::latch started(1);
  auto engine = std::make_unique<Engine>(tiny().model, *cache);
  OpenOnExit opener{gate};

  Submission a = engine->submit(blocking_request(started, gate, 8));
  started.wait();
  Submission b = engine->submit(request(tokens(5, 3), 3));
  Submission c = engine->submit(request(tokens(5, 4), 3));
  std::thread stopper([&engine] { engine->shutdown(); });

  // shutdown() fails the queued requests before it waits for the one in flight.
  const EngineResult rb = b.result.get();
  const EngineResult rc = c.result.get();
  EXPECT_EQ(rb.error, kShuttingDownError);
  EXPECT_EQ(rc.error, kShuttingDownError);
  EXPECT_EQ(engine->submit(request(tokens(5, 5), 3)).status, SubmitStatus::shutting_down);

  gate.open();
  stopper.join();
  const EngineResult ra = a.result.get();
  ASSERT_TRUE(ra.ok()) << ra.error;
  EXPECT_EQ(ra.finish_reason, "length");
  EXPECT_EQ(ra.completion_tokens, 8);
  engine.reset();  // destructor after shutdown: no-op
}

TEST(EngineLoop, SubmitAfterShutdownIsRefused) {
  auto cache = make_cache();
  Engine engine(tiny().model, *cache);
  engine.shutdown();
  Submission s = engine.submit(request(tokens(5, 1), 2));
  EXPECT_EQ(s.status, SubmitStatus::shutting_down);
  EXPECT_FALSE(s.result.valid());
  engine.shutdown();  // idempotent
}

TEST(EngineLoop, BadRequestFailsWithoutStoppingTheThread) {
  auto cache = make_cache();
  Engine engine(tiny().model, *cache);
  const EngineResult too_long = engine.submit(request(tokens(100, 1), kMaxSeq)).result.get();
  EXPECT_FALSE(too_long.ok());
  EngineRequest bad_id = request({1, 2, 1 << 30}, 2);  // out-of-vocab id: the model throws
  const EngineResult failed = engine.submit(std::move(bad_id)).result.get();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.error.find("generation failed"), std::string::npos) << failed.error;
  EXPECT_EQ(cache->checked_out_count(), 0u);  // the lease was dropped
  const EngineResult after = engine.submit(request(tokens(5, 2), 2)).result.get();
  ASSERT_TRUE(after.ok()) << after.error;
  EXPECT_EQ(after.completion_tokens, 2);
}

// A decode op failing with an ordinary error fails its request only; the queued one behind
// it runs as if nothing happened (--test-fault step:error on the CPU backend).
TEST(EngineLoop, OpErrorFailsOnlyItsRequest) {
  auto cache = make_cache();
  Gate gate;
  std::latch started(1);
  bool fault_handler_called = false;
  Engine engine(tiny().model, *cache, Engine::kDefaultQueueCapacity, nullptr,
                [&fault_handler_called](const std::string&) { fault_handler_called = true; });
  OpenOnExit opener{gate};
  tiny().backend->arm_fault({FaultSite::step, FaultKind::error, 3});
  Submission a = engine.submit(blocking_request(started, gate, 16));
  started.wait();
  const auto next_prompt = tokens(6, 11);
  Submission b = engine.submit(request(next_prompt, 5));
  gate.open();

  const EngineResult ra = a.result.get();
  EXPECT_FALSE(ra.ok());
  EXPECT_NE(ra.error.find("generation failed: injected error (--test-fault) at cpu backend, step"),
            std::string::npos)
      << ra.error;
  const EngineResult rb = b.result.get();
  ASSERT_TRUE(rb.ok()) << rb.error;
  GenerationOptions options;
  options.max_tokens = 5;
  EXPECT_EQ(rb.tokens, direct(next_prompt, options).tokens);
  EXPECT_FALSE(engine.device_failed());
  EXPECT_FALSE(fault_handler_called);
  EXPECT_EQ(cache->checked_out_count(), 0u);
}

// A lost device (DeviceFault) fails the request in flight and every queued one, refuses new
// ones, and reports once to the handler (--test-fault step:device on the CPU backend).
TEST(EngineLoop, DeviceFaultFailsEverythingHeldAndRefusesNewRequests) {
  auto cache = make_cache();
  Gate gate;
  std::latch started(1);
  std::mutex mutex;
  std::vector<std::string> reports;
  auto engine = std::make_unique<Engine>(
      tiny().model, *cache, Engine::kDefaultQueueCapacity, nullptr,
      [&](const std::string& what) {
        std::lock_guard<std::mutex> lock(mutex);
        reports.push_back(what);
      });
  OpenOnExit opener{gate};
  // Past the steps the pipelined decode issues before the first token reaches on_token.
  tiny().backend->arm_fault({FaultSite::step, FaultKind::device, 3});
  Submission a = engine->submit(blocking_request(started, gate, 16));
  started.wait();
  Submission b = engine->submit(request(tokens(5, 3), 3));
  Submission c = engine->submit(request(tokens(5, 4), 3));
  ASSERT_EQ(engine->queued(), 2u);
  gate.open();

  const std::string expected =
      std::string(kDeviceFailedError) + "injected device fault (--test-fault) at cpu backend, step";
  for (Submission* s : {&a, &b, &c}) {
    const EngineResult r = s->result.get();
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.error, expected);
  }
  EXPECT_TRUE(engine->device_failed());
  Submission later = engine->submit(request(tokens(5, 5), 3));
  EXPECT_EQ(later.status, SubmitStatus::device_failed);
  EXPECT_FALSE(later.result.valid());
  engine->shutdown();  // the thread has already ended; shutdown still joins it
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0], "injected device fault (--test-fault) at cpu backend, step");
}

}  // namespace
}  // namespace lily

namespace lily {
namespace {

TEST(EngineLoop, OnCompleteReceivesTheResultInsteadOfTheFuture) {
  auto cache = make_cache();
  Engine engine(tiny().model, *cache);
  std::promise<EngineResult> delivered;
  EngineRequest r = request(tokens(9, 12), 4);
  r.on_complete = [&delivered](EngineResult result) { delivered.set_value(std::move(result)); };
  Submission s = engine.submit(std::move(r));
  ASSERT_EQ(s.status, SubmitStatus::accepted);
  EXPECT_FALSE(s.result.valid());
  const EngineResult result = delivered.get_future().get();
  ASSERT_TRUE(result.ok()) << result.error;
  GenerationOptions options;
  options.max_tokens = 4;
  EXPECT_EQ(result.tokens, direct(tokens(9, 12), options).tokens);
}

TEST(EngineLoop, OnCompleteOfQueuedRequestsFiresOnShutdown) {
  auto cache = make_cache();
  Gate gate;
  std::latch started(1);
  auto engine = std::make_unique<Engine>(tiny().model, *cache);
  OpenOnExit opener{gate};
  Submission a = engine->submit(blocking_request(started, gate, 3));
  started.wait();
  std::promise<EngineResult> delivered;
  EngineRequest queued = request(tokens(5, 13), 3);
  queued.on_complete = [&delivered](EngineResult result) { delivered.set_value(std::move(result)); };
  ASSERT_EQ(engine->submit(std::move(queued)).status, SubmitStatus::accepted);
  std::thread stopper([&engine] { engine->shutdown(); });
  EXPECT_EQ(delivered.get_future().get().error, kShuttingDownError);
  gate.open();
  stopper.join();
  EXPECT_TRUE(a.result.get().ok());
}

// A model that prefills in chunks of 8 tokens, so that a 30-token prompt has four chunks.
Qwen36Model& small_chunk_model() {
  static Qwen36Model model(tiny().checkpoint, *tiny().backend, 8);
  return model;
}

TEST(Generator, PrefillCancelledBetweenChunksKeepsTheFedPrefix) {
  const std::vector<int32_t> prompt = tokens(30, 3);
  auto cache = make_cache();
  SessionLease lease = cache->acquire(prompt);
  int checks = 0;
  GenerationOptions options;
  options.max_tokens = 5;
  options.cancel_prefill = [&checks] { return ++checks > 2; };  // two chunks, then cancel
  const GenerationResult cancelled =
      generate(small_chunk_model(), lease.state(), prompt, options);
  EXPECT_EQ(cancelled.finish_reason, "cancelled");
  EXPECT_TRUE(cancelled.tokens.empty());
  EXPECT_EQ(cancelled.prompt_unfed, 14);
  EXPECT_EQ(lease.state().position, 16);
  const std::vector<int32_t> held = SessionCache::consumed_tokens(prompt, cancelled);
  EXPECT_EQ(held, std::vector<int32_t>(prompt.begin(), prompt.begin() + 16));

  // Resuming from the cancelled state gives exactly what a fresh run gives.
  options.cancel_prefill = nullptr;
  const GenerationResult resumed = generate(
      small_chunk_model(), lease.state(), std::span<const int32_t>(prompt).subspan(16), options);
  cache->drop(lease);
  EXPECT_EQ(resumed.tokens, direct(prompt, options).tokens);
}

TEST(Generator, PrefillInChunksEqualsOneShotPrefill) {
  const std::vector<int32_t> prompt = tokens(30, 4);
  GenerationOptions options;
  options.max_tokens = 6;
  options.cancel_prefill = [] { return false; };
  auto cache = make_cache();
  SessionLease lease = cache->acquire(prompt);
  const GenerationResult chunked = generate(small_chunk_model(), lease.state(), prompt, options);
  cache->drop(lease);
  EXPECT_EQ(chunked.prompt_unfed, 0);
  EXPECT_EQ(chunked.tokens, direct(prompt, options).tokens);
}

}  // namespace
}  // namespace lily

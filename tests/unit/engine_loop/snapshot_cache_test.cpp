// Engine with snapshot points: a conversation that drops its reasoning reuses each previous prompt.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "../model/tiny_model_fixture.h"
#include "engine/engine.h"
#include "engine/session_cache.h"

namespace lily {
namespace {

constexpr int64_t kMaxSeq = 160;

testing::TinyModel& tiny() {
  return testing::tiny_model();
}

std::unique_ptr<SessionCache> make_cache(size_t snapshots) {
  return std::make_unique<SessionCache>(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq,
                                        SessionCache::kDefaultEntries, snapshots);
}

// `n` deterministic token ids from `seed`.
std::vector<int32_t> tokens(size_t n, uint32_t seed) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int32_t>((seed * 7919u + static_cast<uint32_t>(i) * 2654435761u) % 997u);
  }
  return ids;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Stands for `<|im_start|>assistant\n<think>\n`: the generation prompt, where the snapshot goes.
const std::vector<int32_t>& generation_prompt() {
  static const std::vector<int32_t> ids = tokens(4, 999);
  return ids;
}

EngineRequest request(const std::vector<int32_t>& prompt, std::vector<int64_t> points) {
  EngineRequest r;
  r.prompt = prompt;
  r.sequence.max_tokens = 5;
  r.snapshot_points = std::move(points);
  return r;
}

EngineResult run_on(Engine& engine, const std::vector<int32_t>& prompt,
                    std::vector<int64_t> points) {
  EngineResult result = engine.submit(request(prompt, std::move(points))).result.get();
  EXPECT_TRUE(result.ok()) << result.error;
  return result;
}

struct Turn {
  std::vector<int32_t> prompt;
  int64_t point = 0;  // where the generation prompt starts
};

// Turn k + 1 = turn k's prompt up to its generation prompt + the answer as the template
// re-renders it (reasoning dropped: it starts differently from what was generated) + new user
// text + the generation prompt.
Turn next_turn(const Turn& previous, uint32_t k) {
  std::vector<int32_t> prompt(previous.prompt.begin(), previous.prompt.begin() + previous.point);
  prompt = concat(concat(prompt, tokens(3 + k % 3, 300 + k)), tokens(6, 400 + k));
  Turn next{prompt, static_cast<int64_t>(prompt.size())};
  next.prompt = concat(next.prompt, generation_prompt());
  return next;
}

// Each turn: the cached engine's result against a fresh cache and engine given the same request.
// Every turn after the first reuses exactly the previous prompt up to its snapshot point: the
// prompt diverges from the entry right there, so more would reuse tokens it no longer holds.
TEST(EngineSnapshots, SixTurnsDroppingReasoningReuseEachPreviousPromptLikeAFreshRun) {
  auto cache = make_cache(8);
  Engine engine(tiny().model, *cache);
  Turn turn{concat(tokens(10, 200), generation_prompt()), 10};
  int64_t previous_point = 0;
  for (uint32_t k = 0; k < 6; ++k) {
    const EngineResult cached = run_on(engine, turn.prompt, {turn.point});
    auto fresh_cache = make_cache(8);
    Engine fresh_engine(tiny().model, *fresh_cache);
    const EngineResult fresh = run_on(fresh_engine, turn.prompt, {turn.point});
    fresh_engine.shutdown();

    EXPECT_EQ(cached.cached_tokens, previous_point) << "turn " << k;
    EXPECT_EQ(fresh.cached_tokens, 0) << "turn " << k;
    ASSERT_EQ(cached.tokens.size(), 5u) << "turn " << k;
    EXPECT_EQ(cached.tokens, fresh.tokens) << "turn " << k;
    EXPECT_EQ(cached.finish_reason, fresh.finish_reason) << "turn " << k;
    EXPECT_EQ(cached.prompt_tokens, static_cast<int64_t>(turn.prompt.size())) << "turn " << k;

    const Turn next = next_turn(turn, k);
    ASSERT_NE(next.prompt[static_cast<size_t>(turn.point)],
              turn.prompt[static_cast<size_t>(turn.point)])
        << "turn " << k << ": the re-rendered answer must diverge at the boundary";
    previous_point = turn.point;
    turn = next;
  }
  EXPECT_EQ(previous_point, 10 + 9 + 10 + 11 + 9 + 10);  // the last turn's point: 59
}

// The same conversation without snapshot points (--strict): Lily's strict prefix never
// matches a prompt that dropped the previous answer, so every turn prefills everything.
TEST(EngineSnapshots, WithoutSnapshotPointsEveryTurnMisses) {
  auto cache = make_cache(8);
  Engine engine(tiny().model, *cache);
  Turn turn{concat(tokens(10, 200), generation_prompt()), 10};
  for (uint32_t k = 0; k < 6; ++k) {
    EXPECT_EQ(run_on(engine, turn.prompt, {}).cached_tokens, 0) << "turn " << k;
    turn = next_turn(turn, k);
  }
  EXPECT_TRUE(cache->snapshot_positions().empty());
}

TEST(EngineSnapshots, DescendingPointsAreRefused) {
  auto cache = make_cache(8);
  Engine engine(tiny().model, *cache);
  const EngineResult result = engine.submit(request(tokens(12, 210), {8, 4})).result.get();
  EXPECT_EQ(result.error, "invalid request: snapshot points must be ascending, found 4 after 8");
}

}  // namespace
}  // namespace lily

// Session prefix cache: strict-prefix hits, key steering, LRU, leases, fed accounting, reuse == fresh.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../model/tiny_model_fixture.h"
#include "backend/backend.h"
#include "engine/generator.h"
#include "engine/session_cache.h"
#include "model/qwen36_model.h"

namespace lily {
namespace {

constexpr int64_t kMaxSeq = 128;

testing::TinyModel& tiny() { return testing::tiny_model(); }

std::unique_ptr<SessionCache> make_cache(size_t entries = SessionCache::kDefaultEntries) {
  return std::make_unique<SessionCache>(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq,
                                        entries);
}

// `n` deterministic token ids starting from `seed`.
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

// Acquires for `prompt`, feeds the uncached suffix into the state and releases the whole prompt.
int64_t serve(SessionCache& cache, const std::vector<int32_t>& prompt,
              const std::optional<std::string>& key = std::nullopt) {
  SessionLease lease = cache.acquire(prompt, key);
  const int64_t cached = lease.cached_tokens();
  EXPECT_EQ(lease.state().position, cached);
  tiny().model.forward(lease.state(),
                       std::span<const int32_t>(prompt).subspan(static_cast<size_t>(cached)));
  EXPECT_TRUE(cache.release(lease, prompt));
  EXPECT_FALSE(lease.held());
  return cached;
}

TEST(SessionCache, MissThenHitOnExtendedPrompt) {
  auto cache = make_cache();
  const auto turn1 = tokens(10, 1);
  EXPECT_EQ(serve(*cache, turn1), 0);
  EXPECT_EQ(cache->cached_count(), 1u);
  const auto turn2 = concat(turn1, tokens(4, 2));
  EXPECT_EQ(serve(*cache, turn2), 10);
  const auto turn3 = concat(turn2, tokens(3, 3));
  EXPECT_EQ(serve(*cache, turn3), 14);
  EXPECT_EQ(cache->cached_count(), 1u);  // the conversation kept one entry, extended in place
}

TEST(SessionCache, PromptThatIsNotAStrictExtensionMisses) {
  auto cache = make_cache();
  const auto base = tokens(10, 1);
  serve(*cache, base);
  auto diverged = concat(base, tokens(3, 2));
  diverged[4] += 1;  // differs inside the cached part
  SessionLease lease = cache->acquire(diverged);
  EXPECT_EQ(lease.cached_tokens(), 0);
  EXPECT_EQ(lease.state().position, 0);
  cache->drop(lease);
  // A prompt shorter than the entry (a prefix of it) cannot reuse it either.
  SessionLease shorter = cache->acquire(std::vector<int32_t>(base.begin(), base.begin() + 6));
  EXPECT_EQ(shorter.cached_tokens(), 0);
  EXPECT_EQ(shorter.state().position, 0);
}

TEST(SessionCache, EqualPromptIsNotAHit) {
  auto cache = make_cache();
  const auto prompt = tokens(10, 1);
  serve(*cache, prompt);
  // §7: an exact full match is not a hit (a token must be prefilled to get logits).
  SessionLease lease = cache->acquire(prompt);
  EXPECT_EQ(lease.cached_tokens(), 0);
  EXPECT_EQ(lease.state().position, 0);
  EXPECT_EQ(cache->cached_count(), 1u);  // the equal entry stays; the miss took the free state
  cache->drop(lease);
  EXPECT_EQ(serve(*cache, concat(prompt, tokens(1, 9))), 10);  // and still serves extensions
}

TEST(SessionCache, CacheKeySteersAmongPrefixCandidatesOnly) {
  const auto shared = tokens(8, 1);
  const auto longer = concat(shared, tokens(5, 2));
  const auto next = concat(longer, tokens(3, 3));
  // Two entries: `longer` (key "b") and `shared` (key "a"), a prefix of it. Serving `longer`
  // first keeps `shared` from hitting it (equal-or-shorter prompts never hit).
  auto setup = [&] {
    auto cache = make_cache();
    EXPECT_EQ(serve(*cache, longer, "b"), 0);
    EXPECT_EQ(serve(*cache, shared, "a"), 0);
    EXPECT_EQ(cache->cached_count(), 2u);
    return cache;
  };
  {
    auto cache = setup();  // key match beats a longer other-key prefix
    SessionLease lease = cache->acquire(next, "a");
    EXPECT_EQ(lease.cached_tokens(), 8);
  }
  {
    auto cache = setup();
    SessionLease lease = cache->acquire(next, "b");
    EXPECT_EQ(lease.cached_tokens(), 13);
  }
  {
    auto cache = setup();  // no key: the longest prefix
    SessionLease lease = cache->acquire(next);
    EXPECT_EQ(lease.cached_tokens(), 13);
  }
  {
    auto cache = setup();  // an unknown key: the longest prefix
    SessionLease lease = cache->acquire(next, "zzz");
    EXPECT_EQ(lease.cached_tokens(), 13);
  }
  {
    auto cache = setup();  // the key never bypasses token equality
    auto other = next;
    other[2] += 1;  // not an extension of either entry
    SessionLease lease = cache->acquire(other, "a");
    EXPECT_EQ(lease.cached_tokens(), 0);
    // A prompt extending only the short entry hits it whatever the key.
    SessionLease second = cache->acquire(concat(shared, tokens(2, 8)), "b");
    EXPECT_EQ(second.cached_tokens(), 8);
  }
}

// Equal (key match, length) ranks: the most recently used entry wins.
TEST(SessionCache, TiesGoToTheMostRecentlyUsedEntry) {
  auto cache = make_cache();
  const auto prompt = tokens(6, 81);
  const DecodeState* states[2] = {nullptr, nullptr};
  for (int turn = 0; turn < 2; ++turn) {
    SessionLease lease = cache->acquire(prompt, turn == 0 ? std::optional<std::string>("a")
                                                          : std::nullopt);
    EXPECT_EQ(lease.cached_tokens(), 0);  // an equal prompt never hits: two entries, same tokens
    states[turn] = &lease.state();
    tiny().model.forward(lease.state(), prompt);
    EXPECT_TRUE(cache->release(lease, prompt));
  }
  ASSERT_NE(states[0], states[1]);
  const auto next = concat(prompt, tokens(1, 82));
  // Returns which state serves `next` with `key`, and puts it back unchanged (marked used).
  auto pick = [&](const std::optional<std::string>& key) {
    SessionLease lease = cache->acquire(next, key);
    EXPECT_EQ(lease.cached_tokens(), 6);
    const DecodeState* state = &lease.state();
    EXPECT_TRUE(cache->release(lease, prompt));
    return state;
  };
  EXPECT_EQ(pick(std::nullopt), states[1]);  // newer of two equal candidates
  EXPECT_EQ(pick("a"), states[0]);           // a key match beats recency
  EXPECT_EQ(pick(std::nullopt), states[0]);  // now the newer one
  EXPECT_EQ(pick("b"), states[0]);           // other key: no match, recency again
}

TEST(SessionCache, TwoConversationsWithKeysStayWarm) {
  auto cache = make_cache();
  const auto a1 = tokens(9, 11);
  const auto b1 = tokens(7, 12);
  EXPECT_EQ(serve(*cache, a1, "alice"), 0);
  EXPECT_EQ(serve(*cache, b1, "bob"), 0);
  const auto a2 = concat(a1, tokens(3, 13));
  const auto b2 = concat(b1, tokens(3, 14));
  EXPECT_EQ(serve(*cache, a2, "alice"), 9);
  EXPECT_EQ(serve(*cache, b2, "bob"), 7);
  EXPECT_EQ(cache->cached_count(), 2u);
}

TEST(SessionCache, LeastRecentlyUsedEntryIsEvicted) {
  auto cache = make_cache();
  const auto a = tokens(6, 21);
  const auto b = tokens(6, 22);
  const auto c = tokens(6, 23);
  serve(*cache, a);
  serve(*cache, b);
  const auto a2 = concat(a, tokens(2, 24));
  EXPECT_EQ(serve(*cache, a2), 6);  // A is now the most recently used; B the least
  EXPECT_EQ(serve(*cache, c), 0);   // evicts B
  EXPECT_EQ(cache->cached_count(), 2u);
  EXPECT_EQ(serve(*cache, concat(a2, tokens(1, 25))), 8);  // A survived
  EXPECT_EQ(serve(*cache, concat(b, tokens(2, 26))), 0);   // B is gone
}

TEST(SessionCache, LruOrderAfterEviction) {
  auto cache = make_cache();
  const auto a = tokens(6, 31);
  const auto b = tokens(6, 32);
  const auto c = tokens(6, 33);
  serve(*cache, a);
  serve(*cache, b);
  serve(*cache, c);  // evicts A (least recently used)
  EXPECT_EQ(serve(*cache, concat(b, tokens(1, 34))), 6);
  EXPECT_EQ(serve(*cache, concat(c, tokens(1, 35))), 6);
  EXPECT_EQ(serve(*cache, concat(a, tokens(1, 36))), 0);
}

TEST(SessionCache, CheckedOutEntryIsNotHandedOutTwice) {
  auto cache = make_cache();
  const auto base = tokens(10, 41);
  serve(*cache, base);
  const auto prompt = concat(base, tokens(2, 42));
  SessionLease first = cache->acquire(prompt);
  EXPECT_EQ(first.cached_tokens(), 10);
  EXPECT_EQ(cache->cached_count(), 0u);
  EXPECT_EQ(cache->checked_out_count(), 1u);
  SessionLease second = cache->acquire(prompt);  // the entry is out: a miss on the other state
  EXPECT_EQ(second.cached_tokens(), 0);
  EXPECT_NE(&first.state(), &second.state());
  EXPECT_EQ(first.state().position, 10);  // the second acquire did not reset the first's state
  EXPECT_THROW(cache->acquire(prompt), SessionCacheExhausted);
  cache->drop(first);  // unusable: its contents are forgotten
  EXPECT_FALSE(first.held());
  {
    SessionLease third = cache->acquire(prompt);
    EXPECT_EQ(third.cached_tokens(), 0);
    EXPECT_EQ(third.state().position, 0);
  }  // destroyed while held: dropped
  EXPECT_EQ(cache->checked_out_count(), 1u);
  cache->drop(second);
  EXPECT_EQ(cache->checked_out_count(), 0u);
  EXPECT_EQ(cache->cached_count(), 0u);
}

TEST(SessionCache, ReleaseStoresPromptPlusFedTokens) {
  auto cache = make_cache();
  const auto prompt = tokens(12, 51);
  GenerationOptions options;
  options.max_tokens = 5;
  SessionLease lease = cache->acquire(prompt);
  const GenerationResult result = generate(tiny().model, lease.state(), prompt, options);
  ASSERT_EQ(result.finish_reason, "length");
  ASSERT_EQ(result.fed, 4);  // the last token is not fed
  const std::vector<int32_t> consumed = SessionCache::consumed_tokens(prompt, result);
  ASSERT_EQ(consumed.size(), 16u);
  EXPECT_TRUE(cache->release(lease, consumed));

  // The client sends back the whole completion plus a new user turn: reuse = prompt + fed.
  std::vector<int32_t> turn2 = concat(concat(prompt, result.tokens), tokens(4, 52));
  SessionLease hit = cache->acquire(turn2);
  EXPECT_EQ(hit.cached_tokens(), 16);
  EXPECT_EQ(hit.state().position, 16);
  // Releasing with a token count that does not match the state drops the entry.
  EXPECT_FALSE(cache->release(hit, turn2));
  EXPECT_EQ(cache->cached_count(), 0u);

  // A stop on token i >= 1 feeds the stop token too.
  SessionLease again = cache->acquire(prompt);
  options.max_tokens = 20;
  options.stop_tokens = {result.tokens[2]};
  const GenerationResult stopped = generate(tiny().model, again.state(), prompt, options);
  ASSERT_EQ(stopped.finish_reason, "stop");
  EXPECT_TRUE(cache->release(again, SessionCache::consumed_tokens(prompt, stopped)));
  SessionLease next = cache->acquire(concat(concat(prompt, stopped.tokens), tokens(1, 53)));
  EXPECT_EQ(next.cached_tokens(), static_cast<int64_t>(prompt.size() + stopped.tokens.size()));
}

TEST(SessionCache, ZeroEntriesKeepsNothing) {
  auto cache = make_cache(0);
  const auto prompt = tokens(5, 61);
  SessionLease lease = cache->acquire(prompt);
  tiny().model.forward(lease.state(), prompt);
  EXPECT_FALSE(cache->release(lease, prompt));
  SessionLease next = cache->acquire(concat(prompt, tokens(1, 62)));
  EXPECT_EQ(next.cached_tokens(), 0);
  EXPECT_EQ(next.state().position, 0);
  EXPECT_EQ(cache->cached_count(), 0u);
}

// Generating turn 2 on the cached state == generating it from a fresh state over the full prompt.
TEST(SessionCache, ReusedStateGeneratesLikeAFreshOne) {
  auto cache = make_cache();
  const auto prompt1 = tokens(20, 71);
  GenerationOptions options;
  options.max_tokens = 6;
  options.top_logits = 8;
  SessionLease lease = cache->acquire(prompt1);
  const GenerationResult turn1 = generate(tiny().model, lease.state(), prompt1, options);
  ASSERT_TRUE(cache->release(lease, SessionCache::consumed_tokens(prompt1, turn1)));

  const auto prompt2 = concat(concat(prompt1, turn1.tokens), tokens(7, 72));
  SessionLease hit = cache->acquire(prompt2);
  ASSERT_EQ(hit.cached_tokens(), 20 + turn1.fed);
  const GenerationResult cached = generate(
      tiny().model, hit.state(),
      std::span<const int32_t>(prompt2).subspan(static_cast<size_t>(hit.cached_tokens())), options);

  DecodeState fresh_state(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq);
  const GenerationResult fresh = generate(tiny().model, fresh_state, prompt2, options);

  EXPECT_EQ(cached.tokens, fresh.tokens);
  EXPECT_EQ(cached.fed, fresh.fed);
  EXPECT_EQ(hit.state().position, fresh_state.position);
  ASSERT_EQ(cached.steps.size(), fresh.steps.size());
  for (size_t i = 0; i < fresh.steps.size(); ++i) {
    ASSERT_EQ(cached.steps[i].size(), fresh.steps[i].size());
    for (size_t j = 0; j < fresh.steps[i].size(); ++j) {
      EXPECT_EQ(cached.steps[i][j].first, fresh.steps[i][j].first) << "step " << i << " rank " << j;
      EXPECT_NEAR(cached.steps[i][j].second, fresh.steps[i][j].second, 1e-4)
          << "step " << i << " rank " << j;
    }
  }
}

}  // namespace
}  // namespace lily

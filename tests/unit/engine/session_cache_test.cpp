// Session prefix cache: strict-prefix and snapshot hits, keys, LRU, leases, fed accounting, reuse.
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
  // An exact full match is not a hit (a token must be prefilled to get logits).
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

// --- Snapshots at message boundaries -------------------------------------------------------

std::unique_ptr<SessionCache> make_snapshot_cache(size_t entries, size_t snapshots) {
  return std::make_unique<SessionCache>(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq,
                                        entries, snapshots);
}

struct Served {
  int64_t cached = 0;
  bool from_snapshot = false;
};

// Like serve, snapshotting the state at each point above the reused prefix (the generator's
// on_snapshot), and keeping the whole prompt.
Served serve_points(SessionCache& cache, const std::vector<int32_t>& prompt,
                    const std::vector<int64_t>& points,
                    const std::optional<std::string>& key = std::nullopt) {
  SessionLease lease = cache.acquire(prompt, key);
  Served served{lease.cached_tokens(), lease.from_snapshot()};
  EXPECT_EQ(lease.state().position, served.cached);
  auto feed_to = [&](int64_t end) {
    const auto begin = static_cast<size_t>(lease.state().position);
    tiny().model.forward(lease.state(), std::span<const int32_t>(prompt).subspan(
                                            begin, static_cast<size_t>(end) - begin));
  };
  for (int64_t point : points) {
    if (point <= lease.state().position || point >= static_cast<int64_t>(prompt.size())) continue;
    feed_to(point);
    EXPECT_TRUE(cache.snapshot(lease));
  }
  feed_to(static_cast<int64_t>(prompt.size()));
  EXPECT_TRUE(cache.release(lease, prompt));
  return served;
}

std::vector<int32_t> head(const std::vector<int32_t>& ids, size_t n) {
  return std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
}

// The case snapshots exist for: turn 1 = user text + generation prompt (snapshot where the
// generation prompt starts) + the answer with its reasoning; turn 2 re-renders the answer
// without the reasoning, so it diverges right at the snapshot point.
TEST(SessionCacheSnapshots, DivergenceAtTheBoundaryReusesThePromptBeforeIt) {
  auto cache = make_snapshot_cache(2, 4);
  const auto user1 = tokens(12, 101);
  const auto generation_prompt = tokens(3, 102);
  const auto turn1 = concat(user1, generation_prompt);
  EXPECT_EQ(serve_points(*cache, turn1, {12}).cached, 0);
  EXPECT_EQ(cache->snapshot_positions(), (std::vector<int64_t>{12}));

  const auto turn2 = concat(concat(user1, tokens(4, 103)), tokens(5, 104));
  ASSERT_NE(turn2[12], turn1[12]);
  SessionLease lease = cache->acquire(turn2);
  EXPECT_EQ(lease.cached_tokens(), 12);
  EXPECT_TRUE(lease.from_snapshot());
  EXPECT_EQ(lease.state().position, 12);
  // The restored state continues exactly like a fresh one over the whole turn-2 prompt.
  tiny().model.forward(lease.state(), std::span<const int32_t>(turn2).subspan(12));
  std::vector<float> restored;
  tiny().model.logits_to_host(restored);
  DecodeState fresh(*tiny().backend, tiny().checkpoint.config.shape, kMaxSeq);
  tiny().model.forward(fresh, head(turn2, 12));
  tiny().model.forward(fresh, std::span<const int32_t>(turn2).subspan(12));
  std::vector<float> expected;
  tiny().model.logits_to_host(expected);
  EXPECT_EQ(restored, expected);  // same chunks ([0, 12) then the rest): bit for bit
  cache->drop(lease);

  // The same prompts without snapshots: Lily's strict prefix only, a miss.
  auto strict = make_snapshot_cache(2, 4);
  EXPECT_EQ(serve_points(*strict, turn1, {}).cached, 0);
  EXPECT_TRUE(strict->snapshot_positions().empty());
  EXPECT_EQ(serve_points(*strict, turn2, {}).cached, 0);
}

// Regenerating the same prompt: the entry (prompt + answer) is no strict prefix of it, but
// its snapshot is.
TEST(SessionCacheSnapshots, TheSamePromptAgainHitsItsSnapshot) {
  auto cache = make_snapshot_cache(2, 4);
  const auto prompt = tokens(15, 111);
  GenerationOptions options;
  options.max_tokens = 4;
  SessionLease lease = cache->acquire(prompt);
  options.snapshot_at = {11};
  options.on_snapshot = [&](DecodeState& state) {
    EXPECT_EQ(state.position, 11);
    EXPECT_TRUE(cache->snapshot(lease));
  };
  const GenerationResult first = generate(tiny().model, lease.state(), prompt, options);
  ASSERT_TRUE(cache->release(lease, SessionCache::consumed_tokens(prompt, first)));
  EXPECT_EQ(cache->snapshot_positions(), (std::vector<int64_t>{11}));

  SessionLease again = cache->acquire(prompt);
  EXPECT_EQ(again.cached_tokens(), 11);
  EXPECT_TRUE(again.from_snapshot());
  options.on_snapshot = nullptr;
  const GenerationResult second =
      generate(tiny().model, again.state(), std::span<const int32_t>(prompt).subspan(11), options);
  EXPECT_EQ(second.tokens, first.tokens);
}

TEST(SessionCacheSnapshots, TheLongestReuseWinsAndAStrictPrefixWinsTies) {
  const auto base = tokens(16, 121);
  {
    // Entry tokens extended by the prompt (20 reused) beat its own snapshot at 12.
    auto cache = make_snapshot_cache(2, 4);
    serve_points(*cache, concat(base, tokens(4, 122)), {12});
    const Served hit =
        serve_points(*cache, concat(concat(base, tokens(4, 122)), tokens(2, 123)), {});
    EXPECT_EQ(hit.cached, 20);
    EXPECT_FALSE(hit.from_snapshot);
  }
  // In the cases below B is served first, so that A (a prefix of B's prompt, shorter than B's
  // snapshot point) misses it and takes the other state.
  {
    // A's 8 tokens are a strict prefix; B's snapshot at 12 reuses more.
    auto cache = make_snapshot_cache(2, 4);
    serve_points(*cache, concat(head(base, 12), tokens(5, 124)), {12});
    EXPECT_EQ(serve_points(*cache, head(base, 8), {}).cached, 0);
    const Served hit = serve_points(*cache, concat(head(base, 12), tokens(3, 125)), {});
    EXPECT_EQ(hit.cached, 12);
    EXPECT_TRUE(hit.from_snapshot);
  }
  {
    // Equal reuse (10): A's strict prefix over B's snapshot, although B is the newer entry.
    auto cache = make_snapshot_cache(2, 4);
    const auto b = concat(head(base, 10), tokens(5, 126));
    serve_points(*cache, b, {10});
    EXPECT_EQ(serve_points(*cache, head(base, 10), {}).cached, 0);
    SessionLease touch = cache->acquire(concat(b, tokens(1, 127)));  // B, put back as it was
    ASSERT_EQ(touch.cached_tokens(), 15);
    ASSERT_TRUE(cache->release(touch, b));
    const Served hit = serve_points(*cache, concat(head(base, 10), tokens(3, 128)), {});
    EXPECT_EQ(hit.cached, 10);
    EXPECT_FALSE(hit.from_snapshot);
  }
  {
    // A key match beats a longer reuse, as for strict prefixes: A (key "a") holds a snapshot
    // at 6, B (no key) one at 12.
    auto cache = make_snapshot_cache(2, 4);
    serve_points(*cache, concat(head(base, 12), tokens(4, 129)), {12});
    EXPECT_EQ(serve_points(*cache, concat(head(base, 6), tokens(4, 130)), {6}, "a").cached, 0);
    const auto prompt = concat(head(base, 12), tokens(3, 131));
    SessionLease keyed = cache->acquire(prompt, "a");
    EXPECT_EQ(keyed.cached_tokens(), 6);
    EXPECT_TRUE(keyed.from_snapshot());
    SessionLease keyless = cache->acquire(prompt);  // A is out: B's snapshot
    EXPECT_EQ(keyless.cached_tokens(), 12);
    EXPECT_TRUE(keyless.from_snapshot());
  }
}

TEST(SessionCacheSnapshots, SnapshotsAboveTheReusePointAreDropped) {
  auto cache = make_snapshot_cache(2, 4);
  const auto old_history = tokens(20, 141);
  serve_points(*cache, old_history, {5, 10, 15});
  EXPECT_EQ(cache->snapshot_positions(), (std::vector<int64_t>{5, 10, 15}));
  // Matches the old history up to 12, then diverges: restored at 10; 15 is gone with the old
  // history, 5 and 10 stay (the state's tokens below 10 are unchanged).
  auto branch = concat(head(old_history, 12), tokens(6, 142));
  ASSERT_NE(branch[12], old_history[12]);
  const Served hit = serve_points(*cache, branch, {});
  EXPECT_EQ(hit.cached, 10);
  EXPECT_TRUE(hit.from_snapshot);
  EXPECT_EQ(cache->snapshot_positions(), (std::vector<int64_t>{5, 10}));
  // The old history up to 16 reuses 10 now, not 15.
  const Served back = serve_points(*cache, concat(head(old_history, 16), tokens(2, 143)), {});
  EXPECT_EQ(back.cached, 10);
  EXPECT_TRUE(back.from_snapshot);
}

TEST(SessionCacheSnapshots, AResetEntryLosesItsSnapshots) {
  auto cache = make_snapshot_cache(1, 4);
  const auto a = tokens(14, 151);
  serve_points(*cache, a, {6, 9});
  EXPECT_EQ(cache->snapshot_positions(), (std::vector<int64_t>{6, 9}));
  EXPECT_EQ(serve_points(*cache, tokens(10, 152), {}).cached, 0);  // one entry: A is evicted
  EXPECT_TRUE(cache->snapshot_positions().empty());
  EXPECT_EQ(serve_points(*cache, concat(head(a, 9), tokens(2, 153)), {}).cached, 0);

  // A dropped lease (a generation error) takes the snapshots it made with it, and so does a
  // release whose token count does not match the state.
  SessionLease lease = cache->acquire(a);
  tiny().model.forward(lease.state(), head(a, 6));
  EXPECT_TRUE(cache->snapshot(lease));
  EXPECT_EQ(cache->snapshot_positions(), (std::vector<int64_t>{6}));
  cache->drop(lease);
  EXPECT_TRUE(cache->snapshot_positions().empty());
  EXPECT_FALSE(cache->snapshot(lease));  // an empty lease
  SessionLease mismatched = cache->acquire(a);
  tiny().model.forward(mismatched.state(), head(a, 6));
  EXPECT_TRUE(cache->snapshot(mismatched));
  EXPECT_FALSE(cache->release(mismatched, a));  // position 6, 14 tokens claimed
  EXPECT_TRUE(cache->snapshot_positions().empty());
}

// --cache-snapshots N: N snapshots in all, allocated up front, the least recently used evicted.
TEST(SessionCacheSnapshots, TheTotalIsBoundedAndTheLeastRecentlyUsedGoesFirst) {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const ModelShape& shape = tiny().checkpoint.config.shape;
  const uint64_t before = backend->allocated_bytes();
  SessionCache none(*backend, shape, kMaxSeq, 2, 0);
  const uint64_t states = backend->allocated_bytes() - before;
  SessionCache three(*backend, shape, kMaxSeq, 2, 3);
  EXPECT_EQ(backend->allocated_bytes() - before, 2 * states + 3 * 1'646'592u);
  EXPECT_EQ(three.snapshot_capacity(), 3u);
  EXPECT_EQ(three.snapshot_bytes(), 3 * 1'646'592u);
  EXPECT_EQ(none.snapshot_capacity(), 0u);
  EXPECT_EQ(SessionCache(*backend, shape, kMaxSeq, 0, 3).snapshot_capacity(), 0u);  // no entries

  // A conversation: each turn drops the previous answer's reasoning, so each snapshot point
  // is where the previous prompt's generation prompt began.
  auto cache = make_snapshot_cache(2, 3);
  std::vector<int32_t> prompt = concat(tokens(8, 161), tokens(2, 99));
  std::vector<int64_t> expected_positions;
  int64_t point = 8;
  for (uint32_t turn = 0; turn < 5; ++turn) {
    const Served served = serve_points(*cache, prompt, {point});
    EXPECT_EQ(served.cached, turn == 0 ? 0 : point - 6) << "turn " << turn;
    expected_positions.push_back(point);
    if (expected_positions.size() > 3) expected_positions.erase(expected_positions.begin());
    EXPECT_EQ(cache->snapshot_positions(), expected_positions) << "turn " << turn;
    // Next: the prompt up to the point, the answer without reasoning, new user text.
    prompt = concat(concat(head(prompt, static_cast<size_t>(point)), tokens(2, 170 + turn)),
                    concat(tokens(4, 180 + turn), tokens(2, 99)));
    point += 6;
  }
  // 8 and 14 were evicted, the oldest.
  EXPECT_EQ(cache->snapshot_positions(), (std::vector<int64_t>{20, 26, 32}));
  // Another conversation evicts the least recently used snapshot (20), not the newest.
  serve_points(*cache, concat(tokens(6, 190), tokens(2, 99)), {6});
  EXPECT_EQ(cache->snapshot_positions(), (std::vector<int64_t>{6, 26, 32}));
}

// Without snapshot points (--strict), the cache is Lily's strict-prefix cache even when it
// holds snapshot buffers; and with none to hold, snapshot() refuses.
TEST(SessionCacheSnapshots, NoPointsMeansStrictPrefixOnly) {
  auto cache = make_snapshot_cache(2, 4);
  const auto prompt = tokens(12, 201);
  EXPECT_EQ(serve_points(*cache, prompt, {}).cached, 0);
  EXPECT_EQ(serve_points(*cache, concat(prompt, tokens(2, 202)), {}).cached, 12);
  EXPECT_EQ(serve_points(*cache, concat(head(prompt, 10), tokens(4, 203)), {}).cached, 0);
  EXPECT_TRUE(cache->snapshot_positions().empty());

  auto without = make_snapshot_cache(2, 0);
  SessionLease lease = without->acquire(prompt);
  tiny().model.forward(lease.state(), head(prompt, 5));
  EXPECT_FALSE(without->snapshot(lease));
  EXPECT_TRUE(without->snapshot_positions().empty());
}

}  // namespace
}  // namespace lily

// Session prefix cache (lily-reference §7): a few DecodeStates reused across requests on a strict token prefix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/model_config.h"
#include "engine/generator.h"
#include "model/decode_state.h"

namespace lily {

class SessionCache;

// Thrown by SessionCache::acquire when every state is checked out by another request.
class SessionCacheExhausted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Exclusive use of one cached state by one request. Move-only. Give it back with
// SessionCache::release (keeps the state for later requests) or SessionCache::drop (state is
// unusable); a lease destroyed while still held is dropped. The cache must outlive its leases.
class SessionLease {
 public:
  SessionLease() = default;
  SessionLease(const SessionLease&) = delete;
  SessionLease& operator=(const SessionLease&) = delete;
  SessionLease(SessionLease&& other) noexcept;
  SessionLease& operator=(SessionLease&& other) noexcept;
  ~SessionLease();

  bool held() const { return cache_ != nullptr; }
  // The state, already holding the first cached_tokens() tokens of the prompt (position ==
  // cached_tokens()). Feed prompt[cached_tokens()..] on top of it, then generate.
  DecodeState& state() const { return *state_; }
  // Reused prefix length: usage.prompt_tokens_details.cached_tokens (0 on a miss).
  int64_t cached_tokens() const { return cached_tokens_; }
  // The request's prompt_cache_key, stored with the entry on release.
  const std::optional<std::string>& cache_key() const { return cache_key_; }

 private:
  friend class SessionCache;
  SessionCache* cache_ = nullptr;
  size_t slot_ = 0;
  DecodeState* state_ = nullptr;
  int64_t cached_tokens_ = 0;
  std::optional<std::string> cache_key_;
};

// The cache. All states are allocated at construction (max(entries, 1) of them, `max_seq`
// tokens each); nothing is allocated afterwards except token vectors. Thread-safe.
//
//   SessionLease lease = cache.acquire(prompt, key);
//   GenerationResult r = generate(model, lease.state(), prompt.subspan(lease.cached_tokens()), opts);
//   cache.release(lease, SessionCache::consumed_tokens(prompt, r));   // or cache.drop(lease) on error
class SessionCache {
 public:
  static constexpr size_t kDefaultEntries = 2;  // SESSION_CACHE_ENTRIES

  // `entries` = how many states stay warm between requests. 0 keeps nothing (every request
  // misses) but still owns one working state.
  SessionCache(Backend& backend, const ModelShape& shape, int64_t max_seq,
               size_t entries = kDefaultEntries);
  SessionCache(const SessionCache&) = delete;
  SessionCache& operator=(const SessionCache&) = delete;

  // Hit: the best entry whose tokens are a strict prefix of `prompt` (shorter and element-wise
  // equal; an equal-length match is not a hit) is checked out, keeping its state. Preference:
  // a prompt_cache_key match first, then the longest prefix, then the most recently used.
  // Miss: a free state, else the least recently used entry is evicted; either way it is reset
  // (position 0, cached_tokens 0). Throws SessionCacheExhausted if every state is checked out.
  SessionLease acquire(std::span<const int32_t> prompt,
                       const std::optional<std::string>& cache_key = std::nullopt);

  // Returns the lease's state to the cache as an entry holding exactly `consumed` (every token
  // whose effect is in the state: prompt + generated tokens[0, fed)), tagged with the lease's
  // cache key and marked most recently used. If state().position != consumed.size(), or the
  // cache keeps no entries, the state is dropped instead. Returns whether it was kept. The
  // lease is empty afterwards. No-op (false) on an empty lease.
  bool release(SessionLease& lease, std::vector<int32_t> consumed);

  // Gives the state back without keeping its contents (e.g. after a generation error); it is
  // reset before its next use. The lease is empty afterwards. No-op on an empty lease.
  void drop(SessionLease& lease);

  // prompt (less result.prompt_unfed at its end) + result.tokens[0, result.fed): what the
  // state holds after generate.
  static std::vector<int32_t> consumed_tokens(std::span<const int32_t> prompt,
                                              const GenerationResult& result);

  size_t entries() const { return entries_; }  // warm-entry capacity
  int64_t max_seq() const { return max_seq_; }
  size_t cached_count() const;       // entries available for reuse now
  size_t checked_out_count() const;  // leases held now

 private:
  struct Slot {
    std::unique_ptr<DecodeState> state;
    std::vector<int32_t> tokens;  // every token whose effect is in the state (when cached)
    std::optional<std::string> cache_key;
    uint64_t last_used = 0;
    bool cached = false;       // an entry: available for reuse
    bool checked_out = false;  // held by a lease
  };

  void give_back(SessionLease& lease, std::vector<int32_t>* consumed);

  Backend& backend_;
  int64_t max_seq_;
  size_t entries_;
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
};

}  // namespace lily

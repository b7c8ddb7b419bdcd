// Session prefix cache (docs/session-cache.md): DecodeStates reused on a strict prefix or snapshot.
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
#include "model/state_snapshot.h"

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
  // Whether the hit restored a snapshot (rather than continuing the entry's whole tokens).
  bool from_snapshot() const { return from_snapshot_; }
  // The request's prompt_cache_key, stored with the entry on release.
  const std::optional<std::string>& cache_key() const { return cache_key_; }

 private:
  friend class SessionCache;
  SessionCache* cache_ = nullptr;
  size_t slot_ = 0;
  DecodeState* state_ = nullptr;
  int64_t cached_tokens_ = 0;
  bool from_snapshot_ = false;
  std::optional<std::string> cache_key_;
};

// The cache. All states are allocated at construction (max(entries, 1) of them, `max_seq`
// tokens each), and so are the snapshots (`snapshots` StateSnapshots shared by the entries,
// none when entries is 0); nothing is allocated afterwards except token vectors. Thread-safe.
//
//   SessionLease lease = cache.acquire(prompt, key);
//   options.snapshot_at = points;
//   options.on_snapshot = [&](DecodeState&) { cache.snapshot(lease); };
//   GenerationResult r = generate(model, lease.state(), prompt.subspan(lease.cached_tokens()), opts);
//   cache.release(lease, SessionCache::consumed_tokens(prompt, r));   // or cache.drop(lease) on error
//
// Snapshots (docs/server.md, "Session cache"): the chat template drops earlier turns'
// reasoning, so the next turn's prompt diverges from an entry's tokens right after the previous
// prompt's generation prompt; the GDN layers' state cannot be rolled back there, but a snapshot
// taken during that prefill restores it (the KV rows below it are still this history's).
class SessionCache {
 public:
  static constexpr size_t kDefaultEntries = 2;            // SESSION_CACHE_ENTRIES
  static constexpr size_t kDefaultSnapshotsPerEntry = 4;  // x entries: --cache-snapshots default

  // `entries` = how many states stay warm between requests. 0 keeps nothing (every request
  // misses) but still owns one working state. `snapshots` = snapshots kept in total across the
  // entries (StateSnapshot::bytes(shape) each); 0: strict-prefix reuse only. `kv_dtype`: the
  // states' KV cache element type (--kv-cache; DecodeState). Snapshots hold no KV rows, so
  // their size does not depend on it.
  SessionCache(Backend& backend, const ModelShape& shape, int64_t max_seq,
               size_t entries = kDefaultEntries, size_t snapshots = 0,
               KvDtype kv_dtype = KvDtype::f32);
  SessionCache(const SessionCache&) = delete;
  SessionCache& operator=(const SessionCache&) = delete;

  // Hit: the best reuse of `prompt` among the cached entries, checked out with its state:
  //  - an entry whose tokens are a strict prefix of the prompt (shorter and element-wise equal;
  //    an equal-length match is not a hit): reuse = its tokens, the state as it is;
  //  - an entry holding a snapshot at p < prompt.size() with tokens[0, p) == prompt[0, p):
  //    reuse = p, the snapshot is restored (state position p) and the entry's snapshots above p
  //    are dropped (the state moves on from p).
  // Preference (Lily's order with snapshot reuse counted as prefix length): a prompt_cache_key
  // match first, then the longest reuse, then a strict prefix over a snapshot (no copy), then
  // the most recently used entry. Miss: a free state, else the least recently used entry is
  // evicted (with its snapshots); either way it is reset (position 0, cached_tokens 0). Throws
  // SessionCacheExhausted if every state is checked out.
  SessionLease acquire(std::span<const int32_t> prompt,
                       const std::optional<std::string>& cache_key = std::nullopt);

  // Snapshots the lease's state at its current position for its entry (the generator's
  // on_snapshot at a snapshot point). Takes a free snapshot, else evicts the least recently used
  // one (taken or restored longest ago, whichever entry holds it). Returns false when the cache
  // keeps no snapshots or the lease is empty. The snapshot is kept only if the entry is
  // released holding at least that many tokens.
  bool snapshot(SessionLease& lease);

  // Returns the lease's state to the cache as an entry holding exactly `consumed` (every token
  // whose effect is in the state: prompt + generated tokens[0, fed)), tagged with the lease's
  // cache key and marked most recently used, with its snapshots at positions <= consumed.size().
  // If state().position != consumed.size(), or the cache keeps no entries, the state and its
  // snapshots are dropped instead. Returns whether it was kept. The lease is empty afterwards.
  // No-op (false) on an empty lease.
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
  size_t snapshot_capacity() const { return snapshots_.size(); }
  // Positions of the snapshots held now (cached entries and leases), ascending.
  std::vector<int64_t> snapshot_positions() const;
  // Backend bytes of the snapshots (allocated at construction).
  uint64_t snapshot_bytes() const { return snapshots_.size() * snapshot_bytes_; }

 private:
  static constexpr size_t kNoSlot = static_cast<size_t>(-1);
  struct Snapshot {
    std::unique_ptr<StateSnapshot> data;
    size_t slot = kNoSlot;   // the slot whose state it was taken from; kNoSlot: free
    uint64_t last_used = 0;  // clock when taken or last restored
  };
  struct Slot {
    std::unique_ptr<DecodeState> state;
    std::vector<int32_t> tokens;  // every token whose effect is in the state (when cached)
    std::optional<std::string> cache_key;
    uint64_t last_used = 0;
    bool cached = false;       // an entry: available for reuse
    bool checked_out = false;  // held by a lease
  };

  void give_back(SessionLease& lease, std::vector<int32_t>* consumed);
  // Frees the slot's snapshots at positions above `keep_up_to` (all of them for -1).
  void drop_snapshots(size_t slot, int64_t keep_up_to);

  Backend& backend_;
  int64_t max_seq_;
  size_t entries_;
  uint64_t snapshot_bytes_;
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<Snapshot> snapshots_;
  uint64_t clock_ = 0;
};

}  // namespace lily

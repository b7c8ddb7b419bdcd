// Session prefix cache (docs/session-cache.md): prefix and snapshot lookup, keys, LRU, leases.
#include "engine/session_cache.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace lily {

SessionLease::SessionLease(SessionLease&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)),
      slot_(other.slot_),
      state_(std::exchange(other.state_, nullptr)),
      cached_tokens_(std::exchange(other.cached_tokens_, 0)),
      from_snapshot_(std::exchange(other.from_snapshot_, false)),
      cache_key_(std::move(other.cache_key_)) {
  other.cache_key_.reset();
}

SessionLease& SessionLease::operator=(SessionLease&& other) noexcept {
  if (this != &other) {
    if (cache_ != nullptr) cache_->drop(*this);
    cache_ = std::exchange(other.cache_, nullptr);
    slot_ = other.slot_;
    state_ = std::exchange(other.state_, nullptr);
    cached_tokens_ = std::exchange(other.cached_tokens_, 0);
    from_snapshot_ = std::exchange(other.from_snapshot_, false);
    cache_key_ = std::move(other.cache_key_);
    other.cache_key_.reset();
  }
  return *this;
}

SessionLease::~SessionLease() {
  if (cache_ != nullptr) cache_->drop(*this);
}

SessionCache::SessionCache(Backend& backend, const ModelShape& shape, int64_t max_seq,
                           size_t entries, size_t snapshots, KvDtype kv_dtype)
    : backend_(backend),
      max_seq_(max_seq),
      entries_(entries),
      snapshot_bytes_(StateSnapshot::bytes(shape)) {
  if (max_seq <= 0) throw std::invalid_argument("SessionCache: max_seq must be positive");
  slots_.resize(std::max<size_t>(entries, 1));
  for (Slot& slot : slots_) {
    slot.state = std::make_unique<DecodeState>(backend, shape, max_seq, kv_dtype);
  }
  // Without entries nothing outlives its request, so no snapshot could ever be restored.
  snapshots_.resize(entries == 0 ? 0 : snapshots);
  for (Snapshot& snapshot : snapshots_) {
    snapshot.data = std::make_unique<StateSnapshot>(backend, shape);
  }
}

namespace {

// True when `tokens` is shorter than `prompt` and equals its beginning.
bool strict_prefix(const std::vector<int32_t>& tokens, std::span<const int32_t> prompt) {
  return tokens.size() < prompt.size() && std::equal(tokens.begin(), tokens.end(), prompt.begin());
}

}  // namespace

SessionLease SessionCache::acquire(std::span<const int32_t> prompt,
                                   const std::optional<std::string>& cache_key) {
  SessionLease lease;
  bool needs_reset = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // 1-2. Best candidate by (key match, reuse length, strict prefix, last_used): an entry
    // whose tokens are a strict prefix (reuse = its tokens), or one of its snapshots at p whose
    // prefix matches (reuse = p). A keyless request matches no key; the key only ranks
    // token-prefix candidates, it never bypasses them.
    Slot* best = nullptr;
    Snapshot* best_snapshot = nullptr;  // null: the strict prefix of `best`
    using Rank = std::tuple<bool, size_t, bool, uint64_t>;
    Rank best_rank;
    auto consider = [&](Slot& slot, size_t reuse, Snapshot* snapshot) {
      const bool key_match = cache_key.has_value() && slot.cache_key == cache_key;
      const Rank rank(key_match, reuse, snapshot == nullptr, slot.last_used);
      if (best == nullptr || rank > best_rank) {
        best = &slot;
        best_snapshot = snapshot;
        best_rank = rank;
      }
    };
    for (Slot& slot : slots_) {
      if (slot.cached && strict_prefix(slot.tokens, prompt)) {
        consider(slot, slot.tokens.size(), nullptr);
      }
    }
    for (Snapshot& snapshot : snapshots_) {
      if (snapshot.slot == kNoSlot) continue;
      Slot& slot = slots_[snapshot.slot];
      const auto p = static_cast<size_t>(snapshot.data->position());
      // p <= tokens.size() always (release keeps no snapshot above its tokens).
      if (!slot.cached || p >= prompt.size() || p > slot.tokens.size()) continue;
      if (!std::equal(slot.tokens.begin(), slot.tokens.begin() + static_cast<std::ptrdiff_t>(p),
                      prompt.begin())) {
        continue;
      }
      consider(slot, p, &snapshot);
    }
    if (best != nullptr && best_snapshot != nullptr) {
      // The state moves on from p: what it held above p (tokens, snapshots) is history no
      // longer. Restored under the lock so that no other lease's snapshot() reuses the
      // buffer mid-copy (on a device the copies are only enqueued).
      const auto slot_index = static_cast<size_t>(best - slots_.data());
      const int64_t p = best_snapshot->data->position();
      drop_snapshots(slot_index, p);
      try {
        best_snapshot->data->restore(backend_, *best->state);
      } catch (...) {
        // The state may be half restored: no entry any more; a later miss resets it.
        drop_snapshots(slot_index, -1);
        best->tokens.clear();
        best->cache_key.reset();
        best->cached = false;
        throw;
      }
      best_snapshot->last_used = ++clock_;
      best->tokens.resize(static_cast<size_t>(p));
      lease.from_snapshot_ = true;
    }
    if (best == nullptr) {
      // 4. Miss: a state holding no entry, else evict the least recently used entry.
      for (Slot& slot : slots_) {
        if (!slot.cached && !slot.checked_out) {
          best = &slot;
          break;
        }
      }
      if (best == nullptr) {
        for (Slot& slot : slots_) {
          if (slot.cached && (best == nullptr || slot.last_used < best->last_used)) best = &slot;
        }
      }
      if (best == nullptr) throw SessionCacheExhausted("session cache: every state is checked out");
      drop_snapshots(static_cast<size_t>(best - slots_.data()), -1);
      best->tokens.clear();
      best->cache_key.reset();
      needs_reset = true;
    }
    // 3. Hit (or the fresh state): removed from the cache and handed to the request.
    best->cached = false;
    best->checked_out = true;
    lease.cache_ = this;
    lease.slot_ = static_cast<size_t>(best - slots_.data());
    lease.state_ = best->state.get();
    lease.cached_tokens_ = static_cast<int64_t>(best->tokens.size());
    lease.cache_key_ = cache_key;
  }
  // The slot is ours now; reset outside the lock.
  if (needs_reset) {
    try {
      lease.state_->reset(backend_);
    } catch (...) {
      drop(lease);
      throw;
    }
  }
  if (lease.state_->position != lease.cached_tokens_) {
    drop(lease);
    throw std::logic_error("session cache: state position does not match its tokens");
  }
  return lease;
}

bool SessionCache::snapshot(SessionLease& lease) {
  if (lease.cache_ != this || snapshots_.empty()) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t position = lease.state_->position;
  Snapshot* target = nullptr;
  for (Snapshot& snapshot : snapshots_) {
    if (snapshot.slot == lease.slot_ && snapshot.data->position() == position) {
      target = &snapshot;  // the same point again (same history): refresh it
      break;
    }
  }
  if (target == nullptr) {
    for (Snapshot& snapshot : snapshots_) {
      if (snapshot.slot == kNoSlot) {
        target = &snapshot;
        break;
      }
    }
  }
  if (target == nullptr) {
    // Full: the least recently taken or restored goes. For a conversation that is its oldest
    // turn boundary, which only an edit of old history would return to.
    for (Snapshot& snapshot : snapshots_) {
      if (target == nullptr || snapshot.last_used < target->last_used) target = &snapshot;
    }
  }
  target->slot = kNoSlot;  // not trusted until the copy is issued
  target->data->capture(backend_, *lease.state_);
  target->slot = lease.slot_;
  target->last_used = ++clock_;
  return true;
}

void SessionCache::drop_snapshots(size_t slot, int64_t keep_up_to) {
  for (Snapshot& snapshot : snapshots_) {
    if (snapshot.slot == slot && snapshot.data->position() > keep_up_to) snapshot.slot = kNoSlot;
  }
}

bool SessionCache::release(SessionLease& lease, std::vector<int32_t> consumed) {
  if (lease.cache_ == nullptr) return false;
  const bool keep = entries_ > 0 && lease.state_->position == static_cast<int64_t>(consumed.size());
  give_back(lease, keep ? &consumed : nullptr);
  return keep;
}

void SessionCache::drop(SessionLease& lease) {
  if (lease.cache_ == nullptr) return;
  give_back(lease, nullptr);
}

void SessionCache::give_back(SessionLease& lease, std::vector<int32_t>* consumed) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Slot& slot = slots_.at(lease.slot_);
    slot.checked_out = false;
    if (consumed != nullptr) {
      drop_snapshots(lease.slot_, static_cast<int64_t>(consumed->size()));
      slot.tokens = std::move(*consumed);
      slot.cache_key = lease.cache_key_;
      slot.last_used = ++clock_;
      slot.cached = true;
    } else {
      // Contents untrusted: not an entry; acquire resets it before handing it out again.
      drop_snapshots(lease.slot_, -1);
      slot.tokens.clear();
      slot.cache_key.reset();
      slot.cached = false;
    }
  }
  lease.cache_ = nullptr;
  lease.state_ = nullptr;
  lease.cached_tokens_ = 0;
  lease.from_snapshot_ = false;
  lease.cache_key_.reset();
}

std::vector<int32_t> SessionCache::consumed_tokens(std::span<const int32_t> prompt,
                                                   const GenerationResult& result) {
  const auto unfed = static_cast<size_t>(
      std::clamp<int64_t>(result.prompt_unfed, 0, static_cast<int64_t>(prompt.size())));
  std::vector<int32_t> out(prompt.begin(), prompt.end() - static_cast<std::ptrdiff_t>(unfed));
  const auto fed = static_cast<size_t>(std::clamp<int64_t>(
      result.fed, 0, static_cast<int64_t>(result.tokens.size())));
  out.insert(out.end(), result.tokens.begin(),
             result.tokens.begin() + static_cast<std::ptrdiff_t>(fed));
  return out;
}

size_t SessionCache::cached_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<size_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.cached; }));
}

std::vector<int64_t> SessionCache::snapshot_positions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> out;
  for (const Snapshot& snapshot : snapshots_) {
    if (snapshot.slot != kNoSlot) out.push_back(snapshot.data->position());
  }
  std::sort(out.begin(), out.end());
  return out;
}

size_t SessionCache::checked_out_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<size_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.checked_out; }));
}

}  // namespace lily

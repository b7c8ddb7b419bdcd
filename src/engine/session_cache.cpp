// Session prefix cache (lily-reference §7): strict-prefix lookup, key preference, LRU eviction, leases.
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
    cache_key_ = std::move(other.cache_key_);
    other.cache_key_.reset();
  }
  return *this;
}

SessionLease::~SessionLease() {
  if (cache_ != nullptr) cache_->drop(*this);
}

SessionCache::SessionCache(Backend& backend, const ModelShape& shape, int64_t max_seq,
                           size_t entries)
    : backend_(backend), max_seq_(max_seq), entries_(entries) {
  if (max_seq <= 0) throw std::invalid_argument("SessionCache: max_seq must be positive");
  slots_.resize(std::max<size_t>(entries, 1));
  for (Slot& slot : slots_) slot.state = std::make_unique<DecodeState>(backend, shape, max_seq);
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
    // 1-2. Best strict-prefix candidate by (key match, length, last_used). A keyless request
    // matches no key; the key only ranks token-prefix candidates, it never bypasses them.
    Slot* best = nullptr;
    auto rank = [&](const Slot& slot) {
      const bool key_match = cache_key.has_value() && slot.cache_key == cache_key;
      return std::make_tuple(key_match, slot.tokens.size(), slot.last_used);
    };
    for (Slot& slot : slots_) {
      if (!slot.cached || !strict_prefix(slot.tokens, prompt)) continue;
      if (best == nullptr || rank(slot) > rank(*best)) best = &slot;
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
      slot.tokens = std::move(*consumed);
      slot.cache_key = lease.cache_key_;
      slot.last_used = ++clock_;
      slot.cached = true;
    } else {
      // Contents untrusted: not an entry; acquire resets it before handing it out again.
      slot.tokens.clear();
      slot.cache_key.reset();
      slot.cached = false;
    }
  }
  lease.cache_ = nullptr;
  lease.state_ = nullptr;
  lease.cached_tokens_ = 0;
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

size_t SessionCache::checked_out_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<size_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.checked_out; }));
}

}  // namespace lily

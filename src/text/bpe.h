// Byte-level BPE merging exactly as HF tokenizers' BPE model does it, with a word cache.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lily {

// One merge rule of tokenizer.json: the adjacent symbols (left, right) become `merged`.
// A rule's rank is its index in the merges list (lower merges first).
struct MergeRule {
  uint32_t left;
  uint32_t right;
  uint32_t merged;
};

// The BPE model. Immutable after construction except for the internal word cache, which
// is synchronised, so encode_word may be called from several threads at once.
class BpeModel {
 public:
  // `byte_ids[b]` is the id of the one-character vocab token that stands for byte b.
  // `merges` in rank order; when a (left, right) pair repeats, the later rule wins, as in
  // HF (its merge map is collected from the list). Ids must be below 2^31.
  BpeModel(const std::array<uint32_t, 256>& byte_ids, const std::vector<MergeRule>& merges);
  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-token, given as its raw bytes (the ByteLevel mapping from
  // bytes to one character each is implied). Words shorter than kMaxCachedWord bytes are
  // cached. Empty input appends nothing.
  void encode_word(std::string_view bytes, std::vector<uint32_t>& out) const;

  // The same without the cache: HF's Word::merge_all. Every adjacent pair with a rule
  // goes into a priority queue ordered by (rank, position); the top is merged unless it
  // is stale (either symbol already consumed, or the pair now there maps to a different
  // merged id), and the new pairs with its neighbours are queued. O(n log n).
  void merge_word(std::string_view bytes, std::vector<uint32_t>& out) const;

  // Drops all cached words (benchmarks use it to measure cold encoding).
  void clear_cache() const;

  static constexpr size_t kMaxCachedWord = 256;

 private:
  struct Entry {
    uint64_t key;  // left << 32 | right; kEmpty marks a free slot
    uint32_t rank;
    uint32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  const Entry* find(uint32_t left, uint32_t right) const;
  void insert(uint32_t left, uint32_t right, uint32_t rank, uint32_t merged);

  std::array<uint32_t, 256> byte_ids_{};
  std::vector<Entry> table_;
  unsigned shift_ = 64;

  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace lily

// Byte-level BPE merging exactly as HF tokenizers' BPE model does it, with a word cache.
#include "text/bpe.h"

#include <algorithm>
#include <bit>

namespace lily {

namespace {

// Transparent string hashing so that cache lookups take a string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StringEqual {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

struct Symbol {
  uint32_t id;
  int32_t prev;  // -1: none
  int32_t next;  // -1: none
  bool alive;
};

struct QueuedMerge {
  uint32_t rank;
  uint32_t pos;
  uint32_t merged;
};

// Heap order: the smallest rank on top, then the smallest position (HF's Ord for Merge).
struct LowerPriority {
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

}  // namespace

struct BpeModel::Cache {
  static constexpr size_t kShards = 16;
  static constexpr size_t kEntriesPerShard = 4096;
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<uint32_t>, StringHash, StringEqual> words;
  };
  std::array<Shard, kShards> shards;
};

BpeModel::BpeModel(const std::array<uint32_t, 256>& byte_ids, const std::vector<MergeRule>& merges)
    : byte_ids_(byte_ids), cache_(std::make_unique<Cache>()) {
  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  table_.assign(capacity, Entry{kEmpty, 0, 0});
  shift_ = 64u - static_cast<unsigned>(std::countr_zero(capacity));
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const MergeRule& m = merges[rank];
    insert(m.left, m.right, static_cast<uint32_t>(rank), m.merged);
  }
}

BpeModel::~BpeModel() = default;

void BpeModel::insert(uint32_t left, uint32_t right, uint32_t rank, uint32_t merged) {
  const uint64_t key = (static_cast<uint64_t>(left) << 32) | right;
  const size_t mask = table_.size() - 1;
  size_t slot = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  while (table_[slot].key != kEmpty && table_[slot].key != key) slot = (slot + 1) & mask;
  table_[slot] = Entry{key, rank, merged};  // a repeated pair: the later rule wins
}

const BpeModel::Entry* BpeModel::find(uint32_t left, uint32_t right) const {
  const uint64_t key = (static_cast<uint64_t>(left) << 32) | right;
  const size_t mask = table_.size() - 1;
  size_t slot = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  while (true) {
    const Entry& e = table_[slot];
    if (e.key == key) return &e;
    if (e.key == kEmpty) return nullptr;
    slot = (slot + 1) & mask;
  }
}

void BpeModel::merge_word(std::string_view bytes, std::vector<uint32_t>& out) const {
  const size_t n = bytes.size();
  if (n == 0) return;
  if (n == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(bytes[0])]);
    return;
  }
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<QueuedMerge> queue;
  symbols.clear();
  queue.clear();
  symbols.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    symbols.push_back(Symbol{byte_ids_[static_cast<uint8_t>(bytes[i])],
                             static_cast<int32_t>(i) - 1,
                             i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true});
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const Entry* e = find(symbols[i].id, symbols[i + 1].id)) {
      queue.push_back(QueuedMerge{e->rank, static_cast<uint32_t>(i), e->merged});
    }
  }
  std::make_heap(queue.begin(), queue.end(), LowerPriority{});
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), LowerPriority{});
    const QueuedMerge top = queue.back();
    queue.pop_back();
    Symbol& current = symbols[top.pos];
    if (!current.alive || current.next < 0) continue;
    const auto right_pos = static_cast<size_t>(current.next);
    const Symbol right = symbols[right_pos];
    const Entry* now = find(current.id, right.id);
    if (now == nullptr || now->merged != top.merged) continue;  // stale queue entry
    current.id = top.merged;
    current.next = right.next;
    symbols[right_pos].alive = false;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (current.prev >= 0) {
      const Symbol& prev = symbols[static_cast<size_t>(current.prev)];
      if (const Entry* e = find(prev.id, current.id)) {
        queue.push_back(QueuedMerge{e->rank, static_cast<uint32_t>(current.prev), e->merged});
        std::push_heap(queue.begin(), queue.end(), LowerPriority{});
      }
    }
    if (current.next >= 0) {
      const Symbol& next = symbols[static_cast<size_t>(current.next)];
      if (const Entry* e = find(current.id, next.id)) {
        queue.push_back(QueuedMerge{e->rank, top.pos, e->merged});
        std::push_heap(queue.begin(), queue.end(), LowerPriority{});
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    out.push_back(symbols[static_cast<size_t>(i)].id);
  }
  if (symbols.capacity() > (size_t{1} << 20)) {
    symbols = {};
    queue = {};
  }
}

void BpeModel::encode_word(std::string_view bytes, std::vector<uint32_t>& out) const {
  if (bytes.size() <= 1 || bytes.size() >= kMaxCachedWord) {
    merge_word(bytes, out);
    return;
  }
  const size_t hash = StringHash{}(bytes);
  Cache::Shard& shard = cache_->shards[(hash >> 7) % Cache::kShards];
  {
    const std::lock_guard<std::mutex> lock(shard.mutex);
    if (auto it = shard.words.find(bytes); it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_word(bytes, out);
  std::vector<uint32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
  const std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.words.size() >= Cache::kEntriesPerShard) shard.words.clear();
  shard.words.emplace(std::string(bytes), std::move(ids));
}

void BpeModel::clear_cache() const {
  for (Cache::Shard& shard : cache_->shards) {
    const std::lock_guard<std::mutex> lock(shard.mutex);
    shard.words.clear();
  }
}

}  // namespace lily

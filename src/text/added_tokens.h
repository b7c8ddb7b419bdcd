// Finding added tokens (<|im_start|>, <think>, ...) in raw text, leftmost-longest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lily {

// Byte trie over the added tokens' contents. HF tokenizers splits the raw input on added
// tokens before normalisation and pre-tokenisation, with an Aho-Corasick automaton in
// LeftmostLongest mode: the match that starts first wins, and of those starting at the
// same byte, the longest; scanning resumes after it. find() gives the same matches.
class AddedTokenMatcher {
 public:
  struct Match {
    size_t begin;
    size_t end;
    uint32_t id;
  };

  // `content` must be non-empty and not already added.
  void add(std::string_view content, uint32_t id);

  // The leftmost-longest match in text[from..], if any. O((text.size() - from) * L) in the
  // worst case, L the longest token; bytes that start no token are skipped quickly.
  std::optional<Match> find(std::string_view text, size_t from) const;

  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;  // sorted by byte
    int64_t id = -1;                                     // token ending here, or -1
  };
  std::optional<Match> match_at(std::string_view text, size_t at) const;

  std::vector<Node> nodes_{Node{}};
  bool first_byte_[256] = {};
};

}  // namespace lily

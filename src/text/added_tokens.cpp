// Finding added tokens (<|im_start|>, <think>, ...) in raw text, leftmost-longest.
#include "text/added_tokens.h"

#include <algorithm>
#include <cstring>

namespace lily {

void AddedTokenMatcher::add(std::string_view content, uint32_t id) {
  uint32_t node = 0;
  for (char c : content) {
    const auto b = static_cast<uint8_t>(c);
    auto& children = nodes_[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), b,
                               [](const auto& edge, uint8_t key) { return edge.first < key; });
    if (it != children.end() && it->first == b) {
      node = it->second;
      continue;
    }
    const auto child = static_cast<uint32_t>(nodes_.size());
    children.insert(it, {b, child});
    nodes_.emplace_back();  // invalidates `children`; not used below
    node = child;
  }
  nodes_[node].id = id;
  if (!content.empty()) first_byte_[static_cast<uint8_t>(content[0])] = true;
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::match_at(std::string_view text,
                                                                    size_t at) const {
  uint32_t node = 0;
  std::optional<Match> best;
  for (size_t i = at; i < text.size(); ++i) {
    const auto b = static_cast<uint8_t>(text[i]);
    const auto& children = nodes_[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), b,
                               [](const auto& edge, uint8_t key) { return edge.first < key; });
    if (it == children.end() || it->first != b) break;
    node = it->second;
    if (nodes_[node].id >= 0) best = Match{at, i + 1, static_cast<uint32_t>(nodes_[node].id)};
  }
  return best;
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::find(std::string_view text,
                                                                size_t from) const {
  if (empty()) return std::nullopt;
  for (size_t at = from; at < text.size(); ++at) {
    if (!first_byte_[static_cast<uint8_t>(text[at])]) continue;
    if (auto m = match_at(text, at)) return m;
  }
  return std::nullopt;
}

}  // namespace lily

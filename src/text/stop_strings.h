// Stop strings on streamed text: the earliest match across token boundaries, and the hold-back.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lily {

// Feeds detokenized text (whole UTF-8 characters) piece by piece and releases it once no stop
// string can begin in it. Text that could still turn into a stop string (a suffix that is a
// proper prefix of one) is held back; when a stop string appears, the text before its first
// occurrence is released and the rest (the stop string and anything after it) is dropped.
// The concatenation of everything released equals the whole text cut at the first occurrence
// of any stop string (earliest start; at equal starts any, they cut at the same place).
class StopStringMatcher {
 public:
  // `stops`: non-empty strings (empty ones are refused with std::invalid_argument).
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Release {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string matched: nothing more will be released
  };
  // Adds a piece of text; returns what can be released.
  Release push(std::string_view piece);
  // End of the text: everything still held is released (no stop string matched).
  std::string flush();
  // Bytes held back now.
  size_t held() const { return held_.size(); }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace lily

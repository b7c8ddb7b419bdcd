// The Split pre-tokenizer of Qwen's tokenizer.json, hand-written over Unicode classes.
#include "text/pretokenizer.h"

#include <cstdint>

#include "text/unicode.h"
#include "text/utf8.h"

namespace lily {

const std::string_view kQwen35SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string_view kQwen2SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

using unicode::kCrLf;
using unicode::kLetter;
using unicode::kMark;
using unicode::kNumber;
using unicode::kSpace;

// Decoded text: code point, its class bits and its byte offset; offset[n] = text size.
struct Decoded {
  std::vector<char32_t> cp;
  std::vector<uint8_t> cls;
  std::vector<size_t> offset;
};

void decode_text(std::string_view text, Decoded& d) {
  d.cp.clear();
  d.cls.clear();
  d.offset.clear();
  size_t i = 0;
  while (i < text.size()) {
    d.offset.push_back(i);
    const char32_t c = utf8::decode(text, i);
    d.cp.push_back(c);
    d.cls.push_back(unicode::char_class(c));
  }
  d.offset.push_back(text.size());
}

// Simple case-insensitive match of a letter of the contraction alternatives. Only 's'
// has a non-ASCII case-fold partner (U+017F LATIN SMALL LETTER LONG S).
bool letter_is(char32_t c, char lower) {
  const auto l = static_cast<char32_t>(lower);
  if (c == l || c == l - 0x20) return true;
  return lower == 's' && c == 0x017F;
}

class Splitter {
 public:
  Splitter(const Decoded& d, SplitPattern pattern)
      : cp_(d.cp), cls_(d.cls), n_(d.cp.size()), qwen35_(pattern == SplitPattern::qwen35) {
    // Letter-run class of the second alternative, and the excluded set of the fourth.
    word_ = qwen35_ ? static_cast<uint8_t>(kLetter | kMark) : static_cast<uint8_t>(kLetter);
    not_punct_ = qwen35_ ? static_cast<uint8_t>(kSpace | kLetter | kMark | kNumber)
                         : static_cast<uint8_t>(kSpace | kLetter | kNumber);
  }

  // End (exclusive, code point index) of the match at p, or p when nothing matches.
  size_t match(size_t p) const {
    if (size_t e = contraction(p); e != p) return e;
    if (size_t e = word(p); e != p) return e;
    if ((cls_[p] & kNumber) != 0) return p + 1;
    if (size_t e = punctuation(p); e != p) return e;
    if ((cls_[p] & kSpace) != 0) return whitespace(p);
    return p;
  }

 private:
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  size_t contraction(size_t p) const {
    if (cp_[p] != U'\'' || p + 1 >= n_) return p;
    const char32_t x = cp_[p + 1];
    if (letter_is(x, 's') || letter_is(x, 't') || letter_is(x, 'm') || letter_is(x, 'd')) {
      return p + 2;
    }
    if (p + 2 >= n_) return p;
    const char32_t y = cp_[p + 2];
    if ((letter_is(x, 'r') && letter_is(y, 'e')) || (letter_is(x, 'v') && letter_is(y, 'e')) ||
        (letter_is(x, 'l') && letter_is(y, 'l'))) {
      return p + 3;
    }
    return p;
  }

  size_t run(size_t p, uint8_t mask) const {
    while (p < n_ && (cls_[p] & mask) != 0) ++p;
    return p;
  }

  // [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+   (qwen2: [^\r\n\p{L}\p{N}]?\p{L}+)
  size_t word(size_t p) const {
    const bool optional_ok = (cls_[p] & (kCrLf | kLetter | kNumber)) == 0;
    if (optional_ok && p + 1 < n_ && (cls_[p + 1] & word_) != 0) return run(p + 1, word_);
    if ((cls_[p] & word_) != 0) return run(p, word_);
    return p;
  }

  //  ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*   (qwen2: without \p{M})
  size_t punctuation(size_t p) const {
    size_t start = p;
    if (cp_[p] == U' ' && p + 1 < n_ && (cls_[p + 1] & not_punct_) == 0) start = p + 1;
    if ((cls_[start] & not_punct_) != 0) return p;
    size_t e = start;
    while (e < n_ && (cls_[e] & not_punct_) == 0) ++e;
    return run(e, kCrLf);
  }

  // \s*[\r\n]+ | \s+(?!\S) | \s+   at a whitespace character p.
  size_t whitespace(size_t p) const {
    const size_t q = run(p, kSpace);
    for (size_t k = q; k > p; --k) {
      if ((cls_[k - 1] & kCrLf) != 0) return k;
    }
    if (q == n_) return q;
    if (q - p >= 2) return q - 1;
    return q;
  }

  const std::vector<char32_t>& cp_;
  const std::vector<uint8_t>& cls_;
  size_t n_;
  bool qwen35_;
  uint8_t word_ = 0;
  uint8_t not_punct_ = 0;
};

}  // namespace

void split_pretokens(std::string_view text, SplitPattern pattern, std::vector<Piece>& out) {
  out.clear();
  thread_local Decoded decoded;
  decode_text(text, decoded);
  const Splitter splitter(decoded, pattern);
  const size_t n = decoded.cp.size();
  size_t p = 0;
  size_t gap_start = SIZE_MAX;  // Isolated keeps unmatched stretches as their own pieces
  while (p < n) {
    const size_t e = splitter.match(p);
    if (e == p) {
      if (gap_start == SIZE_MAX) gap_start = p;
      ++p;
      continue;
    }
    if (gap_start != SIZE_MAX) {
      out.push_back({decoded.offset[gap_start], decoded.offset[p]});
      gap_start = SIZE_MAX;
    }
    out.push_back({decoded.offset[p], decoded.offset[e]});
    p = e;
  }
  if (gap_start != SIZE_MAX) out.push_back({decoded.offset[gap_start], decoded.offset[n]});
  // Do not keep megabytes of scratch per thread after a pathological input.
  if (decoded.cp.capacity() > (size_t{1} << 20)) decoded = Decoded{};
}

}  // namespace lily

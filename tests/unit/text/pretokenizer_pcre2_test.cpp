// The hand-written pre-tokenizer against PCRE2 running the same regexes, on random strings.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <gtest/gtest.h>
#include <pcre2.h>

#include <random>
#include <string>
#include <vector>

#include "text/pretokenizer.h"

namespace lily {
namespace {

// PCRE2 (UTF + UCP) is another backtracking engine with the same semantics for these
// patterns as Oniguruma, given an alphabet whose properties agree between PCRE2's Unicode
// tables and utf8proc's, and without U+0085 and U+180E (PCRE2's \s is not Oniguruma's
// there; the HF cases in pretokenizer_test.cpp cover them).
std::vector<std::string> pcre2_split(const std::string& text, std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  EXPECT_NE(code, nullptr) << "PCRE2 error " << error << " at " << offset;
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
  std::vector<std::string> out;
  size_t at = 0;
  size_t gap = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, 0,
                               match, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    if (ovector[0] > gap) out.push_back(text.substr(gap, ovector[0] - gap));
    out.push_back(text.substr(ovector[0], ovector[1] - ovector[0]));
    at = gap = ovector[1];
  }
  if (gap < text.size()) out.push_back(text.substr(gap));
  pcre2_match_data_free(match);
  pcre2_code_free(code);
  return out;
}

std::vector<std::string> lily_split(const std::string& text, SplitPattern pattern) {
  std::vector<Piece> pieces;
  split_pretokens(text, pattern, pieces);
  std::vector<std::string> out;
  for (const Piece& p : pieces) out.push_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

TEST(PreTokenizerPcre2, AgreesOnRandomStrings) {
  const std::vector<std::string> alphabet = {
      "a", "b", "Z", "s", "S", "t", "T", "e", "E", "r", "v", "m", "l", "L", "d", "'", "'", " ", " ",
      " ", "\t", "\n", "\r", "\v", "\f", "1", "9", "\u00b2", "\u216b", ".", "!", "-", "(", "_",
      "\u00a0", "\u3000", "\u2028", "\u0301", "\u093e", "\u0915", "\u4e2d", "\U0001F600",
      "\u200d", "\u0338", "\u017f", "\x1c", "\u01c5", "\u02b0", "\u20dd", "\u0660", "\u00e9"};
  std::mt19937 rng(11);
  int compared = 0;
  for (SplitPattern pattern : {SplitPattern::qwen35, SplitPattern::qwen2}) {
    const std::string regex(pattern == SplitPattern::qwen35 ? kQwen35SplitRegex : kQwen2SplitRegex);
    for (int trial = 0; trial < 20000; ++trial) {
      std::string text;
      const size_t n = 1 + rng() % 14;
      for (size_t k = 0; k < n; ++k) text += alphabet[rng() % alphabet.size()];
      ASSERT_EQ(lily_split(text, pattern), pcre2_split(text, regex))
          << "pattern " << (pattern == SplitPattern::qwen35 ? "qwen35" : "qwen2") << ", text \""
          << text << "\"";
      ++compared;
    }
  }
  EXPECT_EQ(compared, 40000);
}

}  // namespace
}  // namespace lily

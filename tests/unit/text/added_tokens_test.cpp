// Added tokens: leftmost-longest matching in raw text, before normalisation.
#include "text/added_tokens.h"

#include <gtest/gtest.h>

#include "test_tokenizers.h"

namespace lily {
namespace {

std::vector<std::pair<std::string, uint32_t>> all_matches(const AddedTokenMatcher& m, std::string_view text) {
  std::vector<std::pair<std::string, uint32_t>> out;
  size_t at = 0;
  while (auto match = m.find(text, at)) {
    out.emplace_back(std::string(text.substr(match->begin, match->end - match->begin)), match->id);
    at = match->end;
  }
  return out;
}

using M = std::vector<std::pair<std::string, uint32_t>>;

TEST(AddedTokens, LongestAtTheLeftmostStart) {
  AddedTokenMatcher m;
  m.add("<a>", 1);
  m.add("<a>b", 2);
  m.add("<", 3);
  m.add("b>", 4);
  EXPECT_EQ(all_matches(m, "x<a>by"), (M{{"<a>b", 2}}));
  EXPECT_EQ(all_matches(m, "<a>"), (M{{"<a>", 1}}));
  EXPECT_EQ(all_matches(m, "<x"), (M{{"<", 3}}));
  EXPECT_EQ(all_matches(m, "b><a>b>"), (M{{"b>", 4}, {"<a>b", 2}}));
}

TEST(AddedTokens, AnEarlierStartBeatsALongerLaterMatch) {
  AddedTokenMatcher m;
  m.add("ab", 1);
  m.add("bcd", 2);
  EXPECT_EQ(all_matches(m, "abcd"), (M{{"ab", 1}}));
  EXPECT_EQ(all_matches(m, "xbcd"), (M{{"bcd", 2}}));
}

TEST(AddedTokens, NoTokensNoMatches) {
  const AddedTokenMatcher m;
  EXPECT_TRUE(m.empty());
  EXPECT_FALSE(m.find("anything", 0).has_value());
}

TEST(AddedTokens, TokenizerMatchesThemInText) {
  const Tokenizer& t = test::tiny();
  const uint32_t im_start = *t.token_to_id("<|im_start|>");
  const uint32_t im_end = *t.token_to_id("<|im_end|>");
  const uint32_t think = *t.token_to_id("<think>");
  EXPECT_EQ(im_start, 4063u + 1);
  EXPECT_EQ(im_end, 4063u + 2);
  const std::vector<uint32_t> user = t.encode("user\nhi");
  std::vector<uint32_t> expected{im_start};
  expected.insert(expected.end(), user.begin(), user.end());
  expected.push_back(im_end);
  EXPECT_EQ(t.encode("<|im_start|>user\nhi<|im_end|>"), expected);
  EXPECT_EQ(t.encode("<think><think>"), (std::vector<uint32_t>{think, think}));
  // Partial and case-changed markers are ordinary text.
  for (const char* text : {"<|im_end", "|im_end|>", "<|IM_END|>", "< think>"}) {
    for (uint32_t id : t.encode(text)) EXPECT_LT(id, t.vocab_size()) << text;
  }
  // "<<|im_end|>>" is "<", the token, ">".
  const std::vector<uint32_t> nested = t.encode("<<|im_end|>>");
  ASSERT_EQ(nested.size(), 3u);
  EXPECT_EQ(nested[1], im_end);
}

TEST(AddedTokens, StretchesAroundThemAreNormalisedSeparately) {
  const Tokenizer& t = test::tiny();
  // The U+0301 after <think> stays a lone mark, it does not join the "e" before it.
  const std::vector<uint32_t> ids = t.encode("e<think>\u0301");
  EXPECT_EQ(t.decode(ids, false), "e<think>\u0301");
  // Whole-string NFC would turn ">" + U+0338 into U+226F; stretch-wise it stays.
  EXPECT_EQ(t.decode(t.encode("<think>\u0338"), false), "<think>\u0338");
  EXPECT_EQ(t.decode(t.encode("=\u0338"), false), "\u2260");
}

}  // namespace
}  // namespace lily

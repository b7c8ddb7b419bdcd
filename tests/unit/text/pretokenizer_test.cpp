// The Split pre-tokenizer for both Qwen patterns, against pieces HF tokenizers produced.
#include "text/pretokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "text/unicode.h"

namespace lily {
namespace {

std::vector<std::string> split(std::string_view text, SplitPattern pattern) {
  std::vector<Piece> pieces;
  split_pretokens(text, pattern, pieces);
  std::vector<std::string> out;
  for (const Piece& p : pieces) out.emplace_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

struct Case {
  const char* text;
  std::vector<std::string> qwen35;
  std::vector<std::string> qwen2;
};

// Expected pieces from HF tokenizers 0.22.2 (npm @anush008/tokenizers 0.6.0):
// getPreTokenizer().preTokenizeString() of a Qwen3.5-pattern tokenizer (the synthetic
// one) and of Qwen3's real tokenizer.json (Qwen2 pattern), mapped back to text.
const std::vector<Case> kCases = {
    {"Hello world", {"Hello", " world"}, {"Hello", " world"}},
    {"I'M here's", {"I", "'M", " here", "'s"}, {"I", "'M", " here", "'s"}},
    {"'sbar", {"'s", "bar"}, {"'s", "bar"}},
    {"'Sbar", {"'S", "bar"}, {"'S", "bar"}},
    {"'\u017fx", {"'\u017f", "x"}, {"'\u017f", "x"}},
    {"'llama", {"'ll", "ama"}, {"'ll", "ama"}},
    {"'LL", {"'LL"}, {"'LL"}},
    {"'rE", {"'rE"}, {"'rE"}},
    {"'ve'", {"'ve", "'"}, {"'ve", "'"}},
    {"''s", {"''", "s"}, {"''", "s"}},
    {"'", {"'"}, {"'"}},
    {"'s", {"'s"}, {"'s"}},
    {"' s", {"'", " s"}, {"'", " s"}},
    {"it\u2019s", {"it", "\u2019s"}, {"it", "\u2019s"}},
    {"a  b", {"a", " ", " b"}, {"a", " ", " b"}},
    {"a   \n\n  b", {"a", "   \n\n", " ", " b"}, {"a", "   \n\n", " ", " b"}},
    {"  \n\n  ", {"  \n\n", "  "}, {"  \n\n", "  "}},
    {"x\r\n\r\ny", {"x", "\r\n\r\n", "y"}, {"x", "\r\n\r\n", "y"}},
    {"x \r\n y", {"x", " \r\n", " y"}, {"x", " \r\n", " y"}},
    {"hello   ", {"hello", "   "}, {"hello", "   "}},
    {"a\t\tb", {"a", "\t", "\tb"}, {"a", "\t", "\tb"}},
    {"e\u0301x", {"e\u0301x"}, {"e", "\u0301x"}},
    {"\u0301abc", {"\u0301abc"}, {"\u0301abc"}},
    {"\u0300\u0301 a", {"\u0300\u0301", " a"}, {"\u0300\u0301", " a"}},
    {"1234", {"1", "2", "3", "4"}, {"1", "2", "3", "4"}},
    {"x\u00b2\u00b3", {"x", "\u00b2", "\u00b3"}, {"x", "\u00b2", "\u00b3"}},
    {"...!!!\n\n", {"...!!!\n\n"}, {"...!!!\n\n"}},
    {" ...\n", {" ...\n"}, {" ...\n"}},
    {"a\u00a0b", {"a", "\u00a0b"}, {"a", "\u00a0b"}},
    {"a\u3000\u3000b", {"a", "\u3000", "\u3000b"}, {"a", "\u3000", "\u3000b"}},
    {"a\u0085b", {"a", "\u0085b"}, {"a", "\u0085b"}},
    {"a\u2028b", {"a", "\u2028b"}, {"a", "\u2028b"}},
    {"\v\f", {"\v\f"}, {"\v\f"}},
    {"a\x1c""b", {"a", "\x1c""b"}, {"a", "\x1c""b"}},
    {"\U0001f600\U0001f44d\U0001f3fd", {"\U0001f600\U0001f44d\U0001f3fd"}, {"\U0001f600\U0001f44d\U0001f3fd"}},
    {"\u4e2d\u6587\u5b57", {"\u4e2d\u6587\u5b57"}, {"\u4e2d\u6587\u5b57"}},
    {"\u0926\u093f\u0932\u094d\u0932\u0940", {"\u0926\u093f\u0932\u094d\u0932\u0940"}, {"\u0926", "\u093f\u0932", "\u094d\u0932", "\u0940"}},
    {"a\u200db", {"a", "\u200db"}, {"a", "\u200db"}},
    {"<|im_end|>", {"<|", "im", "_end", "|>"}, {"<|", "im", "_end", "|>"}},
    {"hello\n", {"hello", "\n"}, {"hello", "\n"}},
    {" \n", {" \n"}, {" \n"}},
    {"a \n b", {"a", " \n", " b"}, {"a", " \n", " b"}},
    {"  a", {" ", " a"}, {" ", " a"}},
    {"x=1;", {"x", "=", "1", ";"}, {"x", "=", "1", ";"}},
    {"\u01c5ungla \u02b0a", {"\u01c5ungla", " \u02b0a"}, {"\u01c5ungla", " \u02b0a"}},
    {"\r", {"\r"}, {"\r"}},
    {"\n\n\n", {"\n\n\n"}, {"\n\n\n"}},
    {"\u216b", {"\u216b"}, {"\u216b"}},
    {" \u0301", {" \u0301"}, {" \u0301"}},
    {" 1", {" ", "1"}, {" ", "1"}},
    {"\t\ta", {"\t", "\ta"}, {"\t", "\ta"}},
    {"a\r\n", {"a", "\r\n"}, {"a", "\r\n"}},
    {"? \n", {"?", " \n"}, {"?", " \n"}},
    {"a ,b", {"a", " ,", "b"}, {"a", " ,", "b"}},
    {"\U0001f468\u200d\U0001f469\u200d\U0001f467", {"\U0001f468\u200d\U0001f469\u200d\U0001f467"}, {"\U0001f468\u200d\U0001f469\u200d\U0001f467"}},
    {"\u0627\u0644\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u0651\u064e\u0629", {"\u0627\u0644\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u0651\u064e\u0629"}, {"\u0627\u0644\u0639", "\u064e\u0631", "\u064e\u0628", "\u0650\u064a", "\u0651\u064e", "\u0629"}},
    {"a\u0085\u0085b", {"a", "\u0085", "\u0085b"}, {"a", "\u0085", "\u0085b"}},
    {"\u0085\u0085", {"\u0085\u0085"}, {"\u0085\u0085"}},
    {"x\u0085", {"x", "\u0085"}, {"x", "\u0085"}},
    {"a\x1c""\x1c""b", {"a", "\x1c""\x1c", "b"}, {"a", "\x1c""\x1c", "b"}},
    {"\u180e\u180e", {"\u180e\u180e"}, {"\u180e\u180e"}},
    {"a  \u0085b", {"a", "  ", "\u0085b"}, {"a", "  ", "\u0085b"}},
    {"\u00a0\u00a0x", {"\u00a0", "\u00a0x"}, {"\u00a0", "\u00a0x"}},
    {"x \u3000 ", {"x", " \u3000 "}, {"x", " \u3000 "}},
    {"  \r\n  \r\n", {"  \r\n  \r\n"}, {"  \r\n  \r\n"}},
    {"\t\n\t", {"\t\n", "\t"}, {"\t\n", "\t"}},
    {"x\n\n ", {"x", "\n\n", " "}, {"x", "\n\n", " "}},
    {"x\u2028\n y", {"x", "\u2028\n", " y"}, {"x", "\u2028\n", " y"}},
    {"x  \t y", {"x", "  \t", " y"}, {"x", "  \t", " y"}},
    {"$$ 100", {"$$", " ", "1", "0", "0"}, {"$$", " ", "1", "0", "0"}},
    {"a\u180eb", {"a", "\u180eb"}, {"a", "\u180eb"}},
    {"a\u200bb", {"a", "\u200bb"}, {"a", "\u200bb"}},
    {"a\ufeffb", {"a", "\ufeffb"}, {"a", "\ufeffb"}},
    {"\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", {"\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35"}, {"\u0e2a\u0e27", "\u0e31\u0e2a\u0e14", "\u0e35"}},
    {"  \u0301x", {" ", " \u0301x"}, {" ", " \u0301", "x"}},
    {"\n\u0301", {"\n", "\u0301"}, {"\n", "\u0301"}},
    {"1\u0301", {"1", "\u0301"}, {"1", "\u0301"}},
};

TEST(PreTokenizer, MatchesHfOnTrickyCasesQwen35) {
  for (const Case& c : kCases) {
    EXPECT_EQ(split(c.text, SplitPattern::qwen35), c.qwen35) << "text: " << c.text;
  }
}

TEST(PreTokenizer, MatchesHfOnTrickyCasesQwen2) {
  for (const Case& c : kCases) {
    EXPECT_EQ(split(c.text, SplitPattern::qwen2), c.qwen2) << "text: " << c.text;
  }
}

TEST(PreTokenizer, EmptyTextHasNoPieces) {
  EXPECT_TRUE(split("", SplitPattern::qwen35).empty());
}

TEST(PreTokenizer, PatternStringsAreTheTokenizerJsonOnes) {
  EXPECT_EQ(kQwen35SplitRegex,
            R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  EXPECT_EQ(kQwen2SplitRegex,
            R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
}

// Long runs are single pieces (or one piece per digit) and take linear time: these
// complete quickly even though each is a megabyte.
TEST(PreTokenizer, PathologicalRunsAreLinear) {
  std::vector<Piece> pieces;
  const std::string letters(1 << 20, 'a');
  split_pretokens(letters, SplitPattern::qwen35, pieces);
  EXPECT_EQ(pieces.size(), 1u);
  const std::string spaces(1 << 20, ' ');
  split_pretokens(spaces, SplitPattern::qwen35, pieces);
  EXPECT_EQ(pieces.size(), 1u);
  split_pretokens(spaces + "x", SplitPattern::qwen35, pieces);
  ASSERT_EQ(pieces.size(), 2u);  // all spaces but the last, then " x"
  EXPECT_EQ(pieces[0].end, spaces.size() - 1);
  std::string newlines_and_spaces;
  for (int i = 0; i < 100000; ++i) newlines_and_spaces += " \n \t";
  split_pretokens(newlines_and_spaces, SplitPattern::qwen35, pieces);
  EXPECT_EQ(pieces.size(), 2u);  // up to the last newline, then the trailing " \t"
  const std::string digits(1 << 20, '7');
  split_pretokens(digits, SplitPattern::qwen35, pieces);
  EXPECT_EQ(pieces.size(), digits.size());
  std::string punctuation;
  for (int i = 0; i < 200000; ++i) punctuation += "!?";
  split_pretokens(punctuation + "\n\n", SplitPattern::qwen2, pieces);
  EXPECT_EQ(pieces.size(), 1u);
}

// Pieces always tile the text, whatever it holds.
TEST(PreTokenizer, PiecesTileTheText) {
  const std::string text =
      "Hi  there\r\n\r\n\t x'LL 12\u00b3 \u0301\u0301 \U0001F600\u200d \u3000\u3000\n\u0085 ok ";
  for (SplitPattern pattern : {SplitPattern::qwen35, SplitPattern::qwen2}) {
    std::vector<Piece> pieces;
    split_pretokens(text, pattern, pieces);
    size_t at = 0;
    for (const Piece& p : pieces) {
      EXPECT_EQ(p.begin, at);
      EXPECT_LT(p.begin, p.end);
      at = p.end;
    }
    EXPECT_EQ(at, text.size());
  }
}

}  // namespace
}  // namespace lily

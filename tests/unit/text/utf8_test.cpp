// UTF-8 primitives: classification, validation and Rust-compatible lossy repair.
#include "text/utf8.h"

#include <gtest/gtest.h>

namespace lily::utf8 {
namespace {

using Kind = Sequence::Kind;

TEST(Utf8, InspectClassifiesWellFormedSequences) {
  EXPECT_EQ(inspect("a", 0).length, 1);
  EXPECT_EQ(inspect("\xC3\xA9", 0).kind, Kind::valid);
  EXPECT_EQ(inspect("\xC3\xA9", 0).length, 2);
  EXPECT_EQ(inspect("\xE2\x82\xAC", 0).length, 3);
  EXPECT_EQ(inspect("\xF0\x9F\x98\x80", 0).length, 4);
  EXPECT_EQ(inspect("\xF4\x8F\xBF\xBF", 0).kind, Kind::valid);  // U+10FFFF
}

TEST(Utf8, InspectFindsMaximalIllFormedSubparts) {
  EXPECT_EQ(inspect("\x80", 0).kind, Kind::invalid);            // lone continuation
  EXPECT_EQ(inspect("\xC0\x80", 0).length, 1);                  // overlong lead
  EXPECT_EQ(inspect("\xE0\x80\x80", 0).length, 1);              // overlong 3-byte
  EXPECT_EQ(inspect("\xED\xA0\x80", 0).kind, Kind::invalid);    // surrogate U+D800
  EXPECT_EQ(inspect("\xED\xA0\x80", 0).length, 1);
  EXPECT_EQ(inspect("\xF4\x90\x80\x80", 0).length, 1);          // above U+10FFFF
  EXPECT_EQ(inspect("\xF5", 0).kind, Kind::invalid);
  EXPECT_EQ(inspect("\xE2\x82" "A", 0).kind, Kind::invalid);
  EXPECT_EQ(inspect("\xE2\x82" "A", 0).length, 2);
  EXPECT_EQ(inspect("\xF0\x9F\x98" "A", 0).length, 3);
}

TEST(Utf8, InspectReportsCharactersCutByTheEnd) {
  EXPECT_EQ(inspect("\xC3", 0).kind, Kind::incomplete);
  EXPECT_EQ(inspect("\xE2\x82", 0).kind, Kind::incomplete);
  EXPECT_EQ(inspect("\xE2\x82", 0).length, 2);
  EXPECT_EQ(inspect("\xF0\x9F\x98", 0).length, 3);
  EXPECT_EQ(inspect("\xE0", 0).kind, Kind::incomplete);
  EXPECT_EQ(inspect("\xE0\x80", 0).kind, Kind::invalid);  // can never become valid
}

TEST(Utf8, FindInvalid) {
  EXPECT_EQ(find_invalid(""), std::string_view::npos);
  EXPECT_EQ(find_invalid("plain ASCII text, longer than eight bytes"), std::string_view::npos);
  EXPECT_EQ(find_invalid("caf\xC3\xA9 \xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(find_invalid("abcdefghij\xFF"), 10u);
  EXPECT_EQ(find_invalid("ab\xC3"), 2u);
  EXPECT_EQ(find_invalid(std::string("a\0b", 3)), std::string_view::npos);
}

TEST(Utf8, LossyMatchesTheUnicodeStandardExample) {
  // Unicode Standard 15.0, section 3.9, Table 3-8 (and Rust's from_utf8_lossy).
  EXPECT_EQ(lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd");
  EXPECT_EQ(lossy("Hello\xF0\x90\x80World"), "Hello\uFFFDWorld");
  EXPECT_EQ(lossy("\xE0\x80"), "\uFFFD\uFFFD");
  EXPECT_EQ(lossy("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(lossy("\xF0\x9F\x98"), "\uFFFD");
}

TEST(Utf8, DecodeAndAppendRoundTrip) {
  for (char32_t cp : {U'\0', U'a', U'\u00e9', U'\u20ac', U'\U0001F600', U'\U0010FFFF'}) {
    std::string s;
    append(s, cp);
    size_t i = 0;
    EXPECT_EQ(decode(s, i), cp);
    EXPECT_EQ(i, s.size());
  }
}

}  // namespace
}  // namespace lily::utf8

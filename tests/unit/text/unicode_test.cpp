// Unicode classes for the pre-tokenizer and HF-compatible NFC (Unicode 9.0 data).
#include "text/unicode.h"

#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <random>

#include "text/utf8.h"

namespace lily::unicode {
namespace {

std::string nfc(std::string_view s) {
  std::string out;
  append_nfc(s, out);
  return out;
}

std::string utf8proc_nfc(const std::string& s) {
  utf8proc_uint8_t* mapped = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &mapped,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string out = n < 0 ? std::string("<error>") : std::string(reinterpret_cast<char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}

TEST(Unicode, Classes) {
  EXPECT_EQ(char_class(U'a'), kLetter);
  EXPECT_EQ(char_class(U'\u01c5'), kLetter);   // Lt
  EXPECT_EQ(char_class(U'\u02b0'), kLetter);   // Lm
  EXPECT_EQ(char_class(U'\u4e2d'), kLetter);   // Lo
  EXPECT_EQ(char_class(U'\u0301') & kMark, kMark);
  EXPECT_EQ(char_class(U'\u093e') & kMark, kMark);  // Mc
  EXPECT_EQ(char_class(U'\u20dd') & kMark, kMark);  // Me
  EXPECT_EQ(char_class(U'7'), kNumber);
  EXPECT_EQ(char_class(U'\u00b2'), kNumber);   // No
  EXPECT_EQ(char_class(U'\u216b'), kNumber);   // Nl
  EXPECT_EQ(char_class(U'\n'), kSpace | kCrLf);
  EXPECT_EQ(char_class(U'\r'), kSpace | kCrLf);
  for (char32_t s : {U'\t', U'\v', U'\f', U' ', U'\u0085', U'\u00a0', U'\u1680', U'\u2000',
                     U'\u200a', U'\u2028', U'\u2029', U'\u202f', U'\u205f', U'\u3000'}) {
    EXPECT_EQ(char_class(s) & kSpace, kSpace) << std::hex << static_cast<uint32_t>(s);
  }
  // Not \s for Oniguruma: the information separators, ZWSP, BOM, Mongolian vowel separator.
  for (char32_t s : {U'\x1c', U'\x1f', U'\u200b', U'\ufeff', U'\u180e'}) {
    EXPECT_EQ(char_class(s), 0) << std::hex << static_cast<uint32_t>(s);
  }
  EXPECT_EQ(char_class(U'!'), 0);
  EXPECT_EQ(char_class(0x110000), 0);
}

TEST(Unicode, NfcComposesReordersAndKeepsTheRest) {
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(nfc("\u212b"), "\u00c5");                      // singleton decomposition
  EXPECT_EQ(nfc("a\u0307\u0323"), "\u1ea1\u0307");         // reordered, then composed
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");          // Hangul L V T
  EXPECT_EQ(nfc("\uac00\u11a8"), "\uac01");                // LV + T
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc("\u4e2d\u6587"), "\u4e2d\u6587");
  EXPECT_EQ(nfc(std::string("a\0\u0301", 4)), std::string("a\0\u0301", 4));
}

TEST(Unicode, NfcUsesUnicode9DataLikeHfTokenizers) {
  // U+1DFA (Unicode 14, ccc 218) is an inert starter to Unicode 9.0: no reordering, and it
  // blocks the composition of a + U+0301. utf8proc alone (Unicode 15) composes.
  EXPECT_EQ(utf8proc_nfc("a\u1dfa\u0301"), "\u00e1\u1dfa");
  EXPECT_EQ(nfc("a\u1dfa\u0301"), "a\u1dfa\u0301");
  // U+08CE (Unicode 14, ccc 230) before U+05BD (ccc 22): utf8proc reorders, HF does not.
  EXPECT_EQ(utf8proc_nfc("\u08ce\u05bd"), "\u05bd\u08ce");
  EXPECT_EQ(nfc("\u08ce\u05bd"), "\u08ce\u05bd");
  // Dives Akuru (Unicode 13): U+11935 U+11930 composes to U+11938 in 15.0, not in 9.0.
  EXPECT_EQ(nfc("\U00011935\U00011930"), "\U00011935\U00011930");
  EXPECT_EQ(nfc("\U00011938"), "\U00011938");
  // Around such a character the rest is still normalised.
  EXPECT_EQ(nfc("e\u0301\u1dfae\u0301"), "\u00e9\u1dfa\u00e9");
}

TEST(Unicode, Unicode9TableOnlyHoldsAssignedNfcRelevantCharacters) {
  size_t count = 0;
  char32_t previous = 0;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (!unknown_to_unicode9_nfc(cp)) continue;
    ++count;
    EXPECT_GT(cp, previous);
    previous = cp;
    EXPECT_TRUE(is_assigned(cp));
    const auto* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
    EXPECT_TRUE((char_class(cp) & kNfcTrigger) != 0 || p->comb_index != UINT16_MAX)
        << std::hex << static_cast<uint32_t>(cp);
  }
  EXPECT_EQ(count, 111u);
  EXPECT_FALSE(unknown_to_unicode9_nfc(U'\u0301'));
  EXPECT_TRUE(unknown_to_unicode9_nfc(U'\u1dfa'));
}

// The quick check is sound: every character without the trigger bit is NFC on its own,
// and strings made only of such characters are NFC.
TEST(Unicode, QuickCheckIsSound) {
  std::vector<char32_t> inert;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    if ((char_class(cp) & kNfcTrigger) != 0) continue;
    std::string s;
    utf8::append(s, cp);
    ASSERT_EQ(utf8proc_nfc(s), s) << std::hex << static_cast<uint32_t>(cp);
    if (is_assigned(cp)) inert.push_back(cp);
  }
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20000; ++trial) {
    std::string s;
    for (int k = 0; k < 6; ++k) utf8::append(s, inert[rng() % inert.size()]);
    ASSERT_TRUE(nfc_quick_check(s));
    ASSERT_EQ(utf8proc_nfc(s), s);
  }
}

}  // namespace
}  // namespace lily::unicode

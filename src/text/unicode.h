// Unicode character classes (utf8proc, Unicode 15) for the pre-tokenizer, and NFC.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lily::unicode {

// Bits of char_class(). The pre-tokenizer patterns only ever ask these questions:
//   kLetter  \p{L}  (Lu Ll Lt Lm Lo)
//   kMark    \p{M}  (Mn Mc Me)
//   kNumber  \p{N}  (Nd Nl No)
//   kSpace   \s as Oniguruma defines it for Unicode text: U+0009..U+000D, U+0085 and the
//            categories Zs, Zl, Zp (the same set as the White_Space property)
//   kCrLf    U+000D or U+000A
//   kNfcTrigger  the character can change under NFC or make its neighbour change:
//            canonical combining class != 0, a canonical decomposition, a possible
//            second character of a canonical composition, or a Hangul jamo vowel/trailer.
//            A string without such characters is already in NFC.
enum : uint8_t {
  kLetter = 1,
  kMark = 2,
  kNumber = 4,
  kSpace = 8,
  kCrLf = 16,
  kNfcTrigger = 32,
};

// Class bits of a Unicode scalar value (anything above U+10FFFF gives 0).
uint8_t char_class(char32_t cp);

// Whether utf8proc (Unicode 15.0) considers `cp` assigned (general category other than Cn).
bool is_assigned(char32_t cp);

// Appends the NFC form of `text` (valid UTF-8) to `out`. Strings without NFC triggers are
// copied as they are; others go through utf8proc (UTF8PROC_STABLE | UTF8PROC_COMPOSE).
void append_nfc(std::string_view text, std::string& out);

// True when `text` (valid UTF-8) contains no NFC trigger, so its NFC form is itself.
bool nfc_quick_check(std::string_view text);

}  // namespace lily::unicode

// UTF-8 primitives for the tokenizer: validation, decoding, encoding, lossy repair.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lily::utf8 {

// What the bytes at one position hold. `length` is the number of bytes the status covers:
//   valid:      a complete, well-formed character of `length` (1..4) bytes;
//   invalid:    a maximal ill-formed subpart of `length` (1..3) bytes, as Unicode's
//               "substitution of maximal subparts" and Rust's String::from_utf8_lossy define
//               it (one U+FFFD replaces it);
//   incomplete: the input ends inside a character whose first `length` (1..3) bytes are
//               well-formed so far (more bytes could complete it).
struct Sequence {
  enum class Kind : uint8_t { valid, invalid, incomplete };
  Kind kind;
  uint8_t length;
};

// Classifies the bytes of `s` starting at `i` (i < s.size()).
Sequence inspect(std::string_view s, size_t i);

// Byte offset of the first byte that is not part of a well-formed character (including a
// character cut off by the end), or std::string_view::npos when `s` is valid UTF-8.
// Surrogates (U+D800..U+DFFF), overlong forms and values above U+10FFFF are ill-formed.
size_t find_invalid(std::string_view s);

// Decodes the character at s[i] and advances i past it. Precondition: `s` is valid UTF-8
// and i < s.size().
char32_t decode(std::string_view s, size_t& i);

// Appends the UTF-8 encoding of `cp` (a Unicode scalar value).
void append(std::string& out, char32_t cp);

// Rust's String::from_utf8_lossy: valid characters are copied, each maximal ill-formed
// subpart (and a character cut off by the end) becomes one U+FFFD.
std::string lossy(std::string_view bytes);

// The UTF-8 encoding of U+FFFD.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace lily::utf8

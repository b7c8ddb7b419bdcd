// GPT-2's ByteLevel alphabet: every byte as one printable code point, and back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lily::byte_level {

// The code point that stands for byte `b` in vocab strings: printable bytes
// (0x21..0x7E, 0xA1..0xAC, 0xAE..0xFF) stand for themselves, the other 68 for
// U+0100 + n in byte order (so the space 0x20 is U+0120 'Ġ' and LF 0x0A is U+010A 'Ċ').
char32_t byte_to_char(uint8_t b);

// The byte a code point stands for, or -1 when it is not in the alphabet.
int char_to_byte(char32_t c);

// Maps every byte of `bytes` to its code point, as UTF-8 (a vocab string).
std::string encode(std::string_view bytes);

// HF's ByteLevel decoder for one token string (valid UTF-8): when every character is in
// the alphabet, the bytes they stand for; otherwise the token's own UTF-8 bytes.
std::string decode_token(std::string_view token);

}  // namespace lily::byte_level

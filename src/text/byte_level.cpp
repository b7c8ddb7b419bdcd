// GPT-2's ByteLevel alphabet: every byte as one printable code point, and back.
#include "text/byte_level.h"

#include <array>

#include "text/utf8.h"

namespace lily::byte_level {

namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 0x144> to_byte{};  // code points 0..0x143 cover the whole alphabet
  Tables() {
    to_byte.fill(-1);
    char32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? static_cast<char32_t>(b) : 0x100 + extra++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(uint8_t b) { return tables().to_char[b]; }

int char_to_byte(char32_t c) {
  if (c >= tables().to_byte.size()) return -1;
  return tables().to_byte[c];
}

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append(out, byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

std::string decode_token(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const int b = char_to_byte(utf8::decode(token, i));
    if (b < 0) return std::string(token);
    out.push_back(static_cast<char>(b));
  }
  return out;
}

}  // namespace lily::byte_level

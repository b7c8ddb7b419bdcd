// UTF-8 primitives for the tokenizer: validation, decoding, encoding, lossy repair.
#include "text/utf8.h"

namespace lily::utf8 {

namespace {

inline uint8_t byte_at(std::string_view s, size_t i) { return static_cast<uint8_t>(s[i]); }
inline bool is_continuation(uint8_t b) { return (b & 0xC0u) == 0x80u; }

}  // namespace

Sequence inspect(std::string_view s, size_t i) {
  const uint8_t b0 = byte_at(s, i);
  if (b0 < 0x80) return {Sequence::Kind::valid, 1};
  // Allowed range of the second byte and the total width, per the Unicode table of
  // well-formed byte sequences (Table 3-7).
  uint8_t width = 0;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    width = 2;
  } else if (b0 == 0xE0) {
    width = 3, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    width = 3;
  } else if (b0 == 0xED) {
    width = 3, hi = 0x9F;
  } else if (b0 == 0xF0) {
    width = 4, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    width = 4;
  } else if (b0 == 0xF4) {
    width = 4, hi = 0x8F;
  } else {
    return {Sequence::Kind::invalid, 1};
  }
  const size_t left = s.size() - i;
  if (left < 2) return {Sequence::Kind::incomplete, 1};
  const uint8_t b1 = byte_at(s, i + 1);
  if (b1 < lo || b1 > hi) return {Sequence::Kind::invalid, 1};
  for (uint8_t k = 2; k < width; ++k) {
    if (left <= k) return {Sequence::Kind::incomplete, k};
    if (!is_continuation(byte_at(s, i + k))) return {Sequence::Kind::invalid, k};
  }
  return {Sequence::Kind::valid, width};
}

size_t find_invalid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t word = 0;
      for (size_t k = 0; k < 8; ++k) word |= static_cast<uint64_t>(byte_at(s, i + k)) << (8 * k);
      if ((word & 0x8080808080808080ull) != 0) break;
      i += 8;
    }
    if (i >= n) break;
    const Sequence seq = inspect(s, i);
    if (seq.kind != Sequence::Kind::valid) return i;
    i += seq.length;
  }
  return std::string_view::npos;
}

char32_t decode(std::string_view s, size_t& i) {
  const uint8_t b0 = byte_at(s, i);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    const char32_t cp = (static_cast<char32_t>(b0 & 0x1Fu) << 6) | (byte_at(s, i + 1) & 0x3Fu);
    i += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    const char32_t cp = (static_cast<char32_t>(b0 & 0x0Fu) << 12) |
                        (static_cast<char32_t>(byte_at(s, i + 1) & 0x3Fu) << 6) |
                        (byte_at(s, i + 2) & 0x3Fu);
    i += 3;
    return cp;
  }
  const char32_t cp = (static_cast<char32_t>(b0 & 0x07u) << 18) |
                      (static_cast<char32_t>(byte_at(s, i + 1) & 0x3Fu) << 12) |
                      (static_cast<char32_t>(byte_at(s, i + 2) & 0x3Fu) << 6) |
                      (byte_at(s, i + 3) & 0x3Fu);
  i += 4;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0u | (cp >> 6)));
    out.push_back(static_cast<char>(0x80u | (cp & 0x3Fu)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0u | (cp >> 12)));
    out.push_back(static_cast<char>(0x80u | ((cp >> 6) & 0x3Fu)));
    out.push_back(static_cast<char>(0x80u | (cp & 0x3Fu)));
  } else {
    out.push_back(static_cast<char>(0xF0u | (cp >> 18)));
    out.push_back(static_cast<char>(0x80u | ((cp >> 12) & 0x3Fu)));
    out.push_back(static_cast<char>(0x80u | ((cp >> 6) & 0x3Fu)));
    out.push_back(static_cast<char>(0x80u | (cp & 0x3Fu)));
  }
}

std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const Sequence seq = inspect(bytes, i);
    if (seq.kind == Sequence::Kind::valid) {
      out.append(bytes.substr(i, seq.length));
    } else {
      out.append(kReplacement);
    }
    i += seq.length;
  }
  return out;
}

}  // namespace lily::utf8

// Lily's request log line: formatting and a single-write stderr sink.
#include "server/request_log.h"

#include <cstdio>
#include <unistd.h>

namespace lily {

namespace {

// Length of the valid UTF-8 sequence at text[i], or 0 if the bytes there are not one.
size_t utf8_sequence_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  uint32_t min = 0;
  uint32_t code = 0;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, min = 0x80, code = lead & 0x1Fu;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, min = 0x800, code = lead & 0x0Fu;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, min = 0x10000, code = lead & 0x07u;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0u) != 0x80u) return 0;
    code = (code << 6) | (byte(i + k) & 0x3Fu);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

void append_hex_escape(std::string& out, uint32_t code) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "\\u{%x}", code);
  out += buffer;
}

}  // namespace

std::string rust_debug_quote(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD, as String::from_utf8_lossy would have made it
      ++i;
      continue;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    if (length == 1) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\0': out += "\\0"; break;
        default:
          if (c < 0x20 || c == 0x7F) {
            append_hex_escape(out, c);
          } else {
            out += static_cast<char>(c);
          }
      }
    } else if (length == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {
      append_hex_escape(out, static_cast<unsigned char>(text[i + 1]));  // C1 controls
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  out += '"';
  return out;
}

std::string completion_log_detail(uint64_t prompt_tokens, uint64_t cached_tokens,
                                  uint64_t completion_tokens, double wall_seconds) {
  const double rate =
      wall_seconds > 0 ? static_cast<double>(completion_tokens) / wall_seconds : 0.0;
  char buffer[160];
  std::snprintf(buffer, sizeof buffer, " prompt=%llu cached=%llu completion=%llu tok/s=%.1f",
                static_cast<unsigned long long>(prompt_tokens),
                static_cast<unsigned long long>(cached_tokens),
                static_cast<unsigned long long>(completion_tokens), rate);
  return buffer;
}

std::string error_log_detail(std::string_view message) {
  return " error=" + rust_debug_quote(message);
}

void write_log_line(const std::string& line) {
  const std::string text = line + "\n";
  // One write(2) per line: atomic for pipes up to PIPE_BUF and never interleaved by stdio.
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace lily

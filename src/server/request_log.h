// Lily's one-line-per-request log format (docs/server.md, *One request*), Rust-style quoting.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lily {

// " prompt=P cached=K completion=C tok/s=X": X = C / wall seconds with one decimal (a request
// rate: the wall time includes prefill and queueing, as in Lily).
std::string completion_log_detail(uint64_t prompt_tokens, uint64_t cached_tokens,
                                  uint64_t completion_tokens, double wall_seconds);

// " error=\"<message>\"" with the message quoted as Rust's {:?} does.
std::string error_log_detail(std::string_view message);

// Rust's Debug formatting of a str: wrapped in double quotes; \" \\ \n \r \t \0 escaped;
// other control characters as \u{hex}; invalid UTF-8 bytes become U+FFFD first (a Rust
// String cannot hold them).
std::string rust_debug_quote(std::string_view text);

// Writes one line to stderr in a single call, so that lines from several threads never
// interleave.
void write_log_line(const std::string& line);

}  // namespace lily

// The line protocol of the text tools (render-chat, parse-output): one JSON answer per stdin line.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace lily {

// The longest input line read whole; the rest of a longer line is skipped (the answer is
// told, and says so).
inline constexpr size_t kMaxLineBytes = size_t{64} << 20;

// (line without its '\n', 1-based line number, whether it was longer than kMaxLineBytes) ->
// the answer line (without '\n').
using LineAnswer = std::function<std::string(const std::string&, size_t, bool)>;

// Answers every stdin line in order, each answer written and flushed before the next line is
// read (so a client can talk to it line by line). Returns 0, or 1 when stdout fails (after
// "internal error: <command>: writing to stdout failed" on stderr); throws InputError when
// reading stdin fails.
int run_line_protocol(const char* command, const LineAnswer& answer);

}  // namespace lily

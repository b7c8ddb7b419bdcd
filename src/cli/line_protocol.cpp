// The line protocol of the text tools (render-chat, parse-output): one JSON answer per stdin line.
#include "cli/line_protocol.h"

#include <cstdio>

#include "core/error.h"

namespace lily {

namespace {

// Reads one line (without its '\n') from `in` into `line`; returns false at end of input with
// nothing read. Sets `too_long` (and drops the rest of the line) past kMaxLineBytes.
bool read_line(FILE* in, std::string& line, bool& too_long) {
  line.clear();
  too_long = false;
  bool any = false;
  for (;;) {
    const int c = std::getc(in);
    if (c == EOF) return any;
    any = true;
    if (c == '\n') return true;
    if (line.size() < kMaxLineBytes) {
      line.push_back(static_cast<char>(c));
    } else {
      too_long = true;
    }
  }
}

}  // namespace

int run_line_protocol(const char* command, const LineAnswer& answer) {
  std::string line;
  bool too_long = false;
  size_t line_number = 0;
  while (read_line(stdin, line, too_long)) {
    ++line_number;
    std::string reply = answer(line, line_number, too_long);
    reply.push_back('\n');
    if (std::fwrite(reply.data(), 1, reply.size(), stdout) != reply.size() ||
        std::fflush(stdout) != 0) {
      std::fprintf(stderr, "internal error: %s: writing to stdout failed\n", command);
      return 1;
    }
  }
  if (std::ferror(stdin)) throw InputError(std::string(command) + ": reading stdin failed");
  return 0;
}

}  // namespace lily

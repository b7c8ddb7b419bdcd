// lily: command-line entry point; dispatches to the subcommands.
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/build_info.h"
#include "core/error.h"

namespace {

struct Command {
  std::string_view name;
  int (*run)(const std::vector<std::string>&);
  std::string_view synopsis;
};

// One line per subcommand (README.md, "Command line").
constexpr Command kCommands[] = {
    {"serve", lily::cmd_serve,
     "[--model DIR] [--bind 127.0.0.1:8000] [--max-seq 4096] [--config FILE]   "
     "the OpenAI-compatible server"},
    {"inspect", lily::cmd_inspect, "--model DIR [--json]   validate a checkpoint, print its summary"},
    {"make-checkpoint", lily::cmd_make_checkpoint,
     "--profile tiny|full --seed N --out DIR   write a synthetic checkpoint (MLX layout)"},
    {"tokenize", lily::cmd_tokenize, "--tokenizer FILE [--decode]   JSON lines: text <-> token ids"},
    {"run", lily::cmd_run,
     "--model DIR --prompt-ids 1,2,3 [--max-tokens N] [--top-logits K]   greedy generation"},
    {"bench", lily::cmd_bench,
     "--model DIR --prompt-len N [--decode-steps 64] --json-out FILE   the measurement contract"},
    {"render-chat", lily::cmd_render_chat, "< messages.jsonl   one rendered prompt per line"},
    {"parse-output", lily::cmd_parse_output,
     "[--tools FILE] [--thinking] [--deltas] < texts.jsonl   generated text -> assistant message"},
};

void print_usage(FILE* out) {
  std::fputs("usage: lily <command> [options]\n\ncommands:\n", out);
  for (const Command& c : kCommands) {
    std::fprintf(out, "  %-16.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.synopsis.size()), c.synopsis.data());
  }
  std::fputs("\n`lily <command> --help` lists a command's options; `lily --version` names the build."
             "\nexit codes: 0 success, 2 bad input or usage, other values internal faults\n", out);
}

// "lily 0.1.0 (commit <40 hex>[, dirty tree], Release, GNU 12.2.0)".
void print_version() {
  const lily::BuildInfo& build = lily::build_info();
  std::printf("lily %s (commit %s%s, %s, %s)\n", LILY_VERSION, build.commit,
              build.dirty ? ", dirty tree" : "", build.build_type, build.compiler);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "--help" || command == "-h" || command == "help") {
    print_usage(stdout);
    return 0;
  }
  if (command == "--version" || command == "version") {
    print_version();
    return 0;
  }
  try {
    for (const Command& c : kCommands) {
      if (c.name != command) continue;
      try {
        return c.run(args);
      } catch (const lily::HelpRequested& help) {
        std::printf("usage: lily %.*s %.*s\n\n%s", static_cast<int>(c.name.size()), c.name.data(),
                    static_cast<int>(c.synopsis.size()), c.synopsis.data(), help.text().c_str());
        return 0;
      }
    }
    std::fprintf(stderr, "error: unknown command \"%s\"\n", command.c_str());
    print_usage(stderr);
    return 2;
  } catch (const lily::InputError& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "internal error: %s\n", error.what());
    return 1;
  }
}

// lily: command-line entry point; dispatches to the subcommands.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

namespace {

constexpr const char* kUsage =
    "usage: lily <command> [options]\n"
    "\n"
    "commands:\n"
    "  inspect          --model DIR [--json]      validate a checkpoint and print its summary\n"
    "  make-checkpoint  --profile tiny|full --seed N --out DIR\n"
    "                                             write a synthetic checkpoint (MLX layout)\n"
    "\n"
    "exit codes: 0 success, 2 bad input or usage, other values internal faults\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (command == "inspect") return lily::cmd_inspect(args);
    if (command == "make-checkpoint") return lily::cmd_make_checkpoint(args);
    if (command == "--help" || command == "-h" || command == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "error: unknown command \"%s\"\n%s", command.c_str(), kUsage);
    return 2;
  } catch (const lily::InputError& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "internal error: %s\n", error.what());
    return 1;
  }
}

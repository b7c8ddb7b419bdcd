// Runs the built lily binary as a user would (arguments, stdin text) for the CLI tests: exit code, stdout, stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace lily::test {

struct LilyRun {
  int exit_code = -1;  // -1: killed by a signal
  std::string out;
  std::string err;
  // stdout split at '\n' (a final '\n' ends the last line, it does not start another).
  std::vector<std::string> lines() const {
    std::vector<std::string> result;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) result.push_back(line);
    return result;
  }
};

inline std::string slurp_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// `lily <args> < input`. Files go to a folder of their own per call (CTest runs the
// discovered tests of one binary in parallel processes), removed afterwards. `args` is
// passed to the shell as written.
inline LilyRun run_lily(const std::string& args, const std::string& input = "") {
  namespace fs = std::filesystem;
  static std::atomic<int> calls{0};
  const fs::path dir = fs::temp_directory_path() /
                       ("lily_cli_" + std::to_string(::getpid()) + "_" + std::to_string(calls++));
  fs::create_directories(dir);
  std::ofstream(dir / "in.txt", std::ios::binary) << input;
  // Appended piece by piece: GCC 12 raises a false -Wrestrict on `"literal" + std::string`.
  std::string command = "'";
  command += LILY_BINARY;
  command += "' " + args + " < '";
  command += (dir / "in.txt").string();
  command += "' > '";
  command += (dir / "out.txt").string();
  command += "' 2> '";
  command += (dir / "err.txt").string();
  command += "'";
  const int status = std::system(command.c_str());
  LilyRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = slurp_file(dir / "out.txt");
  run.err = slurp_file(dir / "err.txt");
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  return run;
}

}  // namespace lily::test

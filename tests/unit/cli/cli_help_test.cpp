// The command line as a whole: `--help` on every command (exit 0, its options listed) and `lily --version` (the build's commit).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/build_info.h"
#include "unit/cli_runner.h"

namespace lily {
namespace {

struct CliRun {
  int exit_code;
  std::string out;
  std::string err;
};

CliRun lily(const std::string& args) {
  const test::LilyRun run = test::run_lily(args);
  return {run.exit_code, run.out, run.err};
}

// Every command answers --help on stdout with exit 0, naming itself and an option it has,
// and does nothing else (serve would bind, make-checkpoint would write, render-chat would
// read stdin).
TEST(CliHelp, EveryCommandListsItsOptions) {
  const std::vector<std::pair<std::string, std::string>> commands = {
      {"serve", "--max-seq VALUE"},        {"inspect", "--model VALUE"},
      {"make-checkpoint", "--profile VALUE"}, {"tokenize", "--tokenizer VALUE"},
      {"run", "--prompt-ids VALUE"},       {"bench", "--prompt-len VALUE"},
      {"render-chat", "--help"},           {"parse-output", "--tools VALUE"},
  };
  for (const auto& [name, option] : commands) {
    for (const char* flag : {"--help", "-h"}) {
      const CliRun run = lily(name + " " + flag);
      EXPECT_EQ(run.exit_code, 0) << name << " " << flag << ": " << run.err;
      EXPECT_EQ(run.out.rfind("usage: lily " + name + " ", 0), 0u) << run.out;
      EXPECT_NE(run.out.find("options:\n"), std::string::npos) << run.out;
      EXPECT_NE(run.out.find(option), std::string::npos) << name << ": " << run.out;
      EXPECT_NE(run.out.find("  --help "), std::string::npos) << run.out;
      EXPECT_EQ(run.err, "") << name;
    }
  }
  // --help wins over anything else on the line, valid or not.
  EXPECT_EQ(lily("serve --bogus --help").exit_code, 0);
  // Without it, a bad option is still a usage error.
  EXPECT_EQ(lily("serve --bogus").exit_code, 2);
}

TEST(CliHelp, VersionNamesTheBuildsCommit) {
  for (const char* flag : {"--version", "version"}) {
    const CliRun run = lily(flag);
    EXPECT_EQ(run.exit_code, 0) << run.err;
    const BuildInfo& build = build_info();  // the test is built from the same tree
    EXPECT_EQ(run.out.rfind("lily 0.1.0 (commit " + std::string(build.commit), 0), 0u) << run.out;
    EXPECT_NE(run.out.find(build.build_type), std::string::npos) << run.out;
  }
  const CliRun usage = lily("--help");
  EXPECT_EQ(usage.exit_code, 0);
  EXPECT_NE(usage.out.find("lily --version"), std::string::npos) << usage.out;
}

}  // namespace
}  // namespace lily

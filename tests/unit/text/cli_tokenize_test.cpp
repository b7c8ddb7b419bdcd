// `lily tokenize` end to end: JSON lines in and out, error lines, exit codes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>

#include "core/strict_json.h"
#include "test_tokenizers.h"
#include "unit/cli_runner.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code;
  std::vector<std::string> lines;  // stdout
  std::string err;
};

fs::path work_dir() {
  // Created once per test process and removed when it exits.
  struct WorkDir {
    fs::path path;
    WorkDir() : path(fs::temp_directory_path() / ("lily_cli_tokenize_" + std::to_string(::getpid()))) {
      fs::create_directories(path);
      std::ofstream(path / "tokenizer.json") << test::tiny_files().tokenizer_json;
      std::ofstream(path / "empty.txt");  // an empty file is not JSON
    }
    ~WorkDir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const WorkDir dir;
  return dir.path;
}

CliRun lily_tokenize(const std::string& args, const std::string& input) {
  const test::LilyRun run = test::run_lily("tokenize " + args, input);
  return {run.exit_code, run.lines(), run.err};
}

std::string tokenizer_arg() { return "--tokenizer " + (work_dir() / "tokenizer.json").string(); }

std::string ids_json(const std::vector<uint32_t>& ids) { return Json(ids).dump(); }

TEST(CliTokenize, EncodesOneLinePerLine) {
  const Tokenizer& t = test::tiny();
  const CliRun run = lily_tokenize(tokenizer_arg(), "\"Hello, world!\"\n\"\"\n\"<|im_start|>user\\nhi\\u00e9\"\n");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 3u);
  EXPECT_EQ(run.lines[0], ids_json(t.encode("Hello, world!")));
  EXPECT_EQ(run.lines[1], "[]");
  EXPECT_EQ(run.lines[2], ids_json(t.encode("<|im_start|>user\nhi\u00e9")));
}

TEST(CliTokenize, LastLineWithoutNewlineAndCrlf) {
  const CliRun run = lily_tokenize(tokenizer_arg(), "\"a\"\r\n\"b\"");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 2u);
  EXPECT_EQ(run.lines[1], ids_json(test::tiny().encode("b")));
}

TEST(CliTokenize, BadLinesGiveErrorLinesAndExitTwo) {
  const CliRun run = lily_tokenize(tokenizer_arg(), "\"ok\"\n5\nnot json\n\"ok\\ud800\"\n\"\xC3(\"\n\n\"after\"\n");
  EXPECT_EQ(run.exit_code, 2);
  ASSERT_EQ(run.lines.size(), 7u);
  EXPECT_EQ(run.lines[0], ids_json(test::tiny().encode("ok")));
  for (size_t i = 1; i <= 5; ++i) {
    const Json line = Json::parse(run.lines[i]);
    ASSERT_TRUE(line.contains("error")) << run.lines[i];
    EXPECT_EQ(line["error"].get<std::string>().rfind("line " + std::to_string(i + 1), 0), 0u) << run.lines[i];
  }
  EXPECT_NE(run.lines[1].find("expected a JSON string"), std::string::npos);
  EXPECT_EQ(run.lines[6], ids_json(test::tiny().encode("after")));
  EXPECT_NE(run.err.find("error: 5 of 7 input lines could not be tokenized; first: line 2"), std::string::npos) << run.err;
}

TEST(CliTokenize, DecodesSkippingSpecialTokens) {
  const Tokenizer& t = test::tiny();
  const std::vector<uint32_t> ids = t.encode("<|im_start|>user\n<think>\u00e9</think><|im_end|>");
  const std::vector<uint32_t> cut = t.encode("\U0001F600");
  const CliRun run = lily_tokenize(tokenizer_arg() + " --decode",
                                ids_json(ids) + "\n[]\n" + ids_json({cut[0]}) + "\n[4096, 99999]\n");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 4u);
  EXPECT_EQ(Json::parse(run.lines[0]).get<std::string>(), "user\n<think>\u00e9</think>");
  EXPECT_EQ(run.lines[1], "\"\"");
  EXPECT_EQ(Json::parse(run.lines[2]).get<std::string>(), "\uFFFD");
  EXPECT_EQ(run.lines[3], "\"\"");  // unknown ids are dropped, as HF does
}

TEST(CliTokenize, DecodeRefusesWhatAreNotIds) {
  const CliRun run = lily_tokenize(tokenizer_arg() + " --decode",
                                "[1, -1]\n[1.5]\n[\"7\"]\n[4294967296]\n{\"ids\": [1]}\n[[1]]\n[1]\n");
  EXPECT_EQ(run.exit_code, 2);
  ASSERT_EQ(run.lines.size(), 7u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NE(run.lines[i].find("{\"error\":\"line " + std::to_string(i + 1)), std::string::npos) << run.lines[i];
  EXPECT_NE(run.lines[0].find("entry 1 is number -1, expected a token id"), std::string::npos) << run.lines[0];
  EXPECT_EQ(run.lines[6].rfind("\"", 0), 0u);
}

TEST(CliTokenize, UsageErrors) {
  EXPECT_EQ(lily_tokenize("", "").exit_code, 2);
  const CliRun missing = lily_tokenize("--tokenizer /nonexistent.json", "");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.err.rfind("error: ", 0), 0u) << missing.err;
  const CliRun bad_file = lily_tokenize("--tokenizer " + (work_dir() / "empty.txt").string(), "");
  EXPECT_EQ(bad_file.exit_code, 2);
  EXPECT_NE(bad_file.err.find("not valid JSON"), std::string::npos) << bad_file.err;
}

TEST(CliTokenize, EmptyInputIsFine) {
  const CliRun run = lily_tokenize(tokenizer_arg(), "");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_TRUE(run.lines.empty());
}

}  // namespace
}  // namespace lily

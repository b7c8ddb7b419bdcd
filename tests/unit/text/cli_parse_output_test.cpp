// `lily parse-output` end to end: messages and deltas in OpenAI's shape, error lines, exit codes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include "core/strict_json.h"
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
    WorkDir() : path(fs::temp_directory_path() / ("lily_cli_parse_output_" + std::to_string(::getpid()))) {
      fs::create_directories(path);
      std::ofstream(path / "tools.json") << R"([{"type": "function", "function": {"name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])";
      std::ofstream(path / "bad_tools.json") << R"([{"type": "function", "function": {"name": "a b"}}])";
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

CliRun lily_parse_output(const std::string& args, const std::string& input) {
  const test::LilyRun run = test::run_lily("parse-output " + args, input);
  return {run.exit_code, run.lines(), run.err};
}

std::string tools_arg() { return "--tools " + (work_dir() / "tools.json").string(); }

// Replaces each random call id (checked against its format) with "ID".
std::string without_ids(const std::string& line) {
  static const std::regex id("\"call_[A-Za-z0-9]{24}\"");
  return std::regex_replace(line, id, "\"ID\"");
}

// A JSON string line for `text`.
std::string line(const std::string& text) { return Json(text).dump() + "\n"; }

const std::string kCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "</function>\n</tool_call>";

TEST(CliParseOutput, Messages) {
  const CliRun run = lily_parse_output(tools_arg(), line("Hello") + line("Let me check.\n\n" + kCall) + line(kCall) +
                                                        line("a</think>b"));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 4u);
  EXPECT_EQ(run.lines[0], R"({"role":"assistant","content":"Hello"})");
  EXPECT_EQ(without_ids(run.lines[1]),
            R"({"role":"assistant","content":"Let me check.","tool_calls":[{"id":"ID","type":"function",)"
            R"("function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"days\": 3}"}}]})");
  EXPECT_EQ(without_ids(run.lines[2]),
            R"({"role":"assistant","content":null,"tool_calls":[{"id":"ID","type":"function",)"
            R"("function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"days\": 3}"}}]})");
  EXPECT_EQ(run.lines[3], R"({"role":"assistant","content":"a</think>b"})");  // thinking off
}

// An unfinished call: closed with what was parsed when the model ended the text (EOS), text
// again when max_tokens cut it (--truncated).
TEST(CliParseOutput, TruncatedKeepsAnUnfinishedCallAsText) {
  const std::string cut = "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRo";
  const CliRun ended = lily_parse_output(tools_arg(), line(cut));
  ASSERT_EQ(ended.lines.size(), 1u) << ended.err;
  EXPECT_EQ(without_ids(ended.lines[0]),
            R"({"role":"assistant","content":"Checking.","tool_calls":[{"id":"ID","type":"function",)"
            R"("function":{"name":"get_weather","arguments":"{\"city\": \"Ro\"}"}}]})");
  const CliRun truncated = lily_parse_output(tools_arg() + " --truncated", line(cut));
  ASSERT_EQ(truncated.lines.size(), 1u) << truncated.err;
  EXPECT_EQ(truncated.lines[0], R"({"role":"assistant","content":)" + Json(cut).dump() + "}");
}

TEST(CliParseOutput, ThinkingAndNoTools) {
  const CliRun run = lily_parse_output("--thinking", line("Hmm.\n</think>\n\nHi") + line("cut off") + line(kCall));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 3u);
  EXPECT_EQ(run.lines[0], R"({"role":"assistant","content":"Hi","reasoning_content":"Hmm."})");
  EXPECT_EQ(run.lines[1], R"({"role":"assistant","content":"","reasoning_content":"cut off"})");
  // Without --tools the markup is text.
  EXPECT_EQ(run.lines[2], R"({"role":"assistant","content":"","reasoning_content":)" + Json(kCall).dump() + "}");
}

TEST(CliParseOutput, Deltas) {
  const CliRun run = lily_parse_output(tools_arg() + " --thinking --deltas",
                                       line("ab\n</think>\n\nOK \xC3\xA9<tool_call>\n<function=get_weather>\n"
                                            "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                                            "</function>\n</tool_call>"));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 1u);
  // One code point at a time: "ab" in two pieces, the held "\n" dropped at </think>, "OK"
  // in two, then " \u00e9" together (the space was held back), then the call once complete.
  EXPECT_EQ(without_ids(run.lines[0]),
            "[{\"reasoning_content\":\"a\"},{\"reasoning_content\":\"b\"},{\"content\":\"O\"},{\"content\":\"K\"},"
            "{\"content\":\" \xC3\xA9\"},"
            R"({"tool_calls":[{"index":0,"id":"ID","type":"function","function":{"name":"get_weather","arguments":""}}]},)"
            R"({"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \"Paris\""}}]},)"
            R"({"tool_calls":[{"index":0,"function":{"arguments":", \"days\": 3"}}]},)"
            R"({"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}])");
}

TEST(CliParseOutput, BadLinesGiveErrorLinesAndGoOn) {
  const CliRun run = lily_parse_output(tools_arg(), "5\nnot json\n\"ok\"\n\n[\"x\"]\n\"after\"");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.lines.size(), 6u);
  EXPECT_EQ(run.lines[0], R"({"error":"line 1 is number 5, expected a JSON string"})");
  EXPECT_EQ(run.lines[1].rfind(R"({"error":"line 2: not valid JSON)", 0), 0u) << run.lines[1];
  EXPECT_EQ(run.lines[2], R"({"role":"assistant","content":"ok"})");
  EXPECT_EQ(run.lines[3].rfind(R"({"error":"line 4: not valid JSON)", 0), 0u) << run.lines[3];
  EXPECT_EQ(run.lines[4].rfind(R"({"error":"line 5 is array)", 0), 0u) << run.lines[4];
  EXPECT_EQ(run.lines[5], R"({"role":"assistant","content":"after"})");
}

TEST(CliParseOutput, UsageErrors) {
  const CliRun bad_tools = lily_parse_output("--tools " + (work_dir() / "bad_tools.json").string(), line("x"));
  EXPECT_EQ(bad_tools.exit_code, 2);
  EXPECT_TRUE(bad_tools.lines.empty());
  EXPECT_NE(bad_tools.err.find("tools[0].function.name: string \"a b\" holds whitespace"), std::string::npos)
      << bad_tools.err;
  const CliRun missing = lily_parse_output("--tools /nonexistent/tools.json", "");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("error: --tools /nonexistent/tools.json: not a readable regular file"), std::string::npos)
      << missing.err;
  const CliRun not_json = lily_parse_output("--tools " + (work_dir() / "empty.txt").string(), "");
  EXPECT_EQ(not_json.exit_code, 2);
  EXPECT_NE(not_json.err.find("not valid JSON"), std::string::npos) << not_json.err;
  EXPECT_EQ(lily_parse_output("--bogus", "").exit_code, 2);
  EXPECT_EQ(lily_parse_output("--tools", "").exit_code, 2);
}

TEST(CliParseOutput, EmptyInputIsFine) {
  const CliRun run = lily_parse_output("", "");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_TRUE(run.lines.empty());
}

}  // namespace
}  // namespace lily

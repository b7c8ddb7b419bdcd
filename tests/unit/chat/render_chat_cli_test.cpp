// Tests for `lily render-chat`: answer per line (array and object lines), errors, exit codes.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/strict_json.h"
#include "unit/cli_runner.h"

namespace {

struct CliRun {
  int exit_code = -1;
  std::vector<std::string> lines;  // stdout, split at '\n' (the final '\n' expected)
  std::string stdout_text;
  std::string stderr_text;
};

// Runs `lily render-chat <extra>` with `input` on stdin.
CliRun render_chat(const std::string& input, const std::string& extra = "") {
  const lily::test::LilyRun run = lily::test::run_lily("render-chat " + extra, input);
  return {run.exit_code, run.lines(), run.out, run.err};
}

lily::Json parse(const std::string& line) {
  return lily::parse_strict_json(line, "output", 8);
}

std::string error_text(const std::string& line) {
  const lily::Json j = parse(line);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_string()) {
    ADD_FAILURE() << "not an error line: " << line;
    return {};
  }
  return j["error"].get<std::string>();
}

TEST(RenderChatCli, OneAnswerPerLineAndErrorsDoNotStopProcessing) {
  const std::string input =
      "[{\"role\":\"system\",\"content\":\" S \"},{\"role\":\"user\",\"content\":\"Hello\"}]\n"
      "not json\n"
      "[]\n"
      "\n"
      "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"system\",\"content\":\"s\"}]\n"
      "[{\"role\":\"tool\",\"content\":\"x\"}]\n"
      "[{\"role\":\"user\",\"content\":\"a\",\"content\":\"b\"}]\n"
      "[{\"role\":\"user\",\"content\":\"\xff\"}]\n"
      "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
      "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n"
      "{\"role\":\"user\",\"content\":\"x\"}\n"
      "[{\"role\":\"user\",\"content\":\"crlf\"}]\r\n"
      "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\"}]";
  const CliRun run = render_chat(input);
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_EQ(run.stderr_text, "");
  ASSERT_EQ(run.lines.size(), 12u) << run.stdout_text;
  EXPECT_EQ(run.stdout_text.back(), '\n');
  EXPECT_EQ(parse(run.lines[0]).get<std::string>(),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(run.lines[0],
            "\"<|im_start|>system\\nS<|im_end|>\\n<|im_start|>user\\nHello<|im_end|>\\n"
            "<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n\"");
  EXPECT_EQ(error_text(run.lines[1]).rfind("line 2: not valid JSON: ", 0), 0u) << run.lines[1];
  EXPECT_EQ(error_text(run.lines[2]),
            "chat template: No messages provided. (the message list is empty)");
  EXPECT_EQ(error_text(run.lines[3]).rfind("line 4: not valid JSON: ", 0), 0u);
  EXPECT_EQ(error_text(run.lines[4]),
            "chat template: System message must be at the beginning. (messages[1] has role "
            "system)");
  EXPECT_NE(error_text(run.lines[5]).find("messages[0].role must be"), std::string::npos);
  EXPECT_EQ(error_text(run.lines[6]), "line 7: duplicate key \"content\"");
  EXPECT_EQ(error_text(run.lines[7]).rfind("line 8: not valid JSON: ", 0), 0u);
  EXPECT_EQ(error_text(run.lines[8]), "line 9: JSON nesting deeper than 64 levels");
  // An object line is an OpenAI-shaped conversation: without "messages" it is refused.
  EXPECT_EQ(error_text(run.lines[9]).rfind("missing field \"messages\"", 0), 0u) << run.lines[9];
  EXPECT_EQ(parse(run.lines[10]).get<std::string>(),
            "<|im_start|>user\ncrlf<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // The last line has no '\n' and still gets an answer; a trailing assistant turn renders.
  EXPECT_EQ(parse(run.lines[11]).get<std::string>(),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\na"
            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(RenderChatCli, ObjectLinesCarryToolsAndTemplateKwargs) {
  const std::string input =
      // Tools, a call with its arguments as a JSON string, a tool result last.
      R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1.0, "a": []}}}],)"
      R"( "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": null,)"
      R"( "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f",)"
      R"( "arguments": "{\"z\": 2.50, \"y\": \"s\"}"}}]}, {"role": "tool", "content": "r"}]})"
      "\n"
      // Thinking on: no rewrite, the open think block.
      R"({"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": {"enable_thinking": true}})"
      "\n"
      // OpenAI-shape errors name the field.
      R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]})"
      "\n"
      R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]})"
      "\n"
      R"({"messages": [{"role": "tool", "content": "r"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": {"enable_thinking": 1}})"
      "\n";
  const CliRun run = render_chat(input);
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_EQ(run.stderr_text, "");
  ASSERT_EQ(run.lines.size(), 6u) << run.stdout_text;
  const std::string first = parse(run.lines[0]).get<std::string>();
  EXPECT_EQ(first.rfind("<|im_start|>system\n# Tools\n\nYou have access to the following "
                        "functions:\n\n<tools>\n{\"type\": \"function\", \"function\": "
                        "{\"name\": \"f\", \"parameters\": {\"b\": 1.0, \"a\": []}}}\n</tools>",
                        0),
            0u)
      << first;
  const std::string tail =
      "</IMPORTANT><|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
      "</think>\n\n<tool_call>\n<function=f>\n<parameter=z>\n2.5\n</parameter>\n<parameter=y>\n"
      "s\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
      "r\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  ASSERT_GE(first.size(), tail.size());
  EXPECT_EQ(first.substr(first.size() - tail.size()), tail);
  EXPECT_EQ(parse(run.lines[1]).get<std::string>(),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(error_text(run.lines[2]), "messages[0].content[0]: image inputs are not supported");
  EXPECT_EQ(error_text(run.lines[3])
                .rfind("messages[0].tool_calls[0].function.arguments: not valid JSON: ", 0),
            0u)
      << run.lines[3];
  EXPECT_EQ(error_text(run.lines[4]),
            "chat template: No user query found in messages. (no message has role user)");
  EXPECT_EQ(error_text(run.lines[5]),
            "chat_template_kwargs.enable_thinking must be true, false or null, found number 1");
}

TEST(RenderChatCli, UnicodeIsWrittenAsUtf8) {
  const CliRun run =
      render_chat("[{\"role\":\"user\",\"content\":\"\\u00e9\\ud83d\\ude00 \\u2028\"}]\n");
  EXPECT_EQ(run.exit_code, 0);
  ASSERT_EQ(run.lines.size(), 1u);
  EXPECT_EQ(parse(run.lines[0]).get<std::string>(),
            "<|im_start|>user\n\u00e9\U0001F600<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
            "</think>\n\n");
}

TEST(RenderChatCli, EmptyInputGivesNoOutput) {
  const CliRun run = render_chat("");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_EQ(run.stdout_text, "");
}

TEST(RenderChatCli, ArgumentsAreAUsageError) {
  const CliRun run = render_chat("[]\n", "--model x");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.stdout_text, "");
  EXPECT_EQ(run.stderr_text.rfind("error: unknown option --model", 0), 0u) << run.stderr_text;
}

}  // namespace

// Tests for tools, tool calls, tool results and reasoning: prompts derived by hand.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/strict_json.h"
#include "text/chat_format.h"
#include "text/chat_messages.h"

namespace lily {
namespace {

constexpr const char* kGen = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
constexpr const char* kGenThinking = "<|im_start|>assistant\n<think>\n";

// The calling instructions of T53, read from the template itself (the '…' literal, with its
// \n escapes decoded), so that this test does not restate the renderer's copy.
std::string tools_instructions() {
  std::ifstream in(std::string(LILY_SOURCE_DIR) + "/tests/fixtures/qwen3.6-chat_template.jinja");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (n != 53) continue;
    const size_t open = line.find("{{- '");
    const size_t close = line.rfind("' }}");
    if (open == std::string::npos || close == std::string::npos) break;
    const std::string literal = line.substr(open + 5, close - open - 5);
    std::string out;
    for (size_t i = 0; i < literal.size(); ++i) {
      if (literal[i] == '\\' && i + 1 < literal.size() && literal[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += literal[i];
      }
    }
    return out;
  }
  ADD_FAILURE() << "line 53 of the template is not the instructions literal";
  return {};
}

// The tools system block (T46-60) for tools already written as tojson lines.
std::string tools_block(const std::vector<std::string>& tojson_lines, const std::string& system) {
  std::string out =
      "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
  for (const std::string& line : tojson_lines) out += "\n" + line;
  out += "\n</tools>" + tools_instructions();
  if (!system.empty()) out += "\n\n" + system;
  return out + "<|im_end|>\n";
}

OrderedJson json(const char* text) {
  return parse_strict_ordered_json(text, "test", 32);
}

// Renders an OpenAI-shaped conversation object.
std::string render(const char* conversation) {
  const ChatConversation c = parse_chat_conversation(json(conversation));
  return render_chat(c.messages, c.tools, c.options);
}

const char* kWeatherTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}})";
const char* kWeatherToolJson =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})";

TEST(ChatTools, ToolsBlockWithoutAndWithASystemMessage) {
  const std::vector<OrderedJson> tools = {json(kWeatherTool)};
  EXPECT_EQ(render_chat({{ChatRole::user, "What's the weather in Paris?"}}, tools),
            tools_block({kWeatherToolJson}, "") +
                "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n" + kGen);
  // The system message is trimmed and appended after a blank line (T54-59), not rendered again.
  EXPECT_EQ(
      render_chat({{ChatRole::system, " Be brief.\n"}, {ChatRole::user, "q"}}, tools),
      tools_block({kWeatherToolJson}, "Be brief.") + "<|im_start|>user\nq<|im_end|>\n" + kGen);
  // A system message that trims to nothing adds nothing (T56).
  EXPECT_EQ(render_chat({{ChatRole::system, " \n "}, {ChatRole::user, "q"}}, tools),
            tools_block({kWeatherToolJson}, "") + "<|im_start|>user\nq<|im_end|>\n" + kGen);
  // No tools: the plain system turn (T61-66).
  EXPECT_EQ(render_chat({{ChatRole::system, "S"}, {ChatRole::user, "q"}}, {}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq<|im_end|>\n" + std::string(kGen));
}

TEST(ChatTools, ToolsAreWrittenWithPythonsJsonDumpsInTheirKeyOrder) {
  const std::vector<OrderedJson> tools = {
      json(
          R"({"function":{"parameters":{"properties":{"n":{"type":"number","minimum":0.0,"maximum":1e-5}}},"name":"b"},"type":"function"})"),
      json(
          R"({"type":"function","function":{"name":"a","description":"Café \"quoted\"\n日本 \\ 😀"}})")};
  EXPECT_EQ(
      render_chat({{ChatRole::user, "q"}}, tools),
      tools_block(
          {R"({"function": {"parameters": {"properties": {"n": {"type": "number", "minimum": 0.0, "maximum": 1e-05}}}, "name": "b"}, "type": "function"})",
           R"({"type": "function", "function": {"name": "a", "description": "Café \"quoted\"\n日本 \\ 😀"}})"},
          "") +
          "<|im_start|>user\nq<|im_end|>\n" + kGen);
}

TEST(ChatTools, OneCallAndItsResultThinkingOff) {
  // The assistant turn is after the last query, so it keeps its (empty) think block; its
  // content is empty, so the call follows the block directly (T114). String arguments are
  // raw, the rest tojson (T122).
  const std::string prompt = render(R"({"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 3, \"units\": null, \"hourly\": false, \"coords\": [48.85, 2.35], \"opts\": {\"a\": 1.0, \"b\": \"x\\ny\"}, \"note\": \"  two\\nlines \\\"q\\\" <b> \"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18°C"}]})");
  EXPECT_EQ(prompt,
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
            "<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n"
            "<parameter=units>\nnull\n</parameter>\n"
            "<parameter=hourly>\nfalse\n</parameter>\n"
            "<parameter=coords>\n[48.85, 2.35]\n</parameter>\n"
            "<parameter=opts>\n{\"a\": 1.0, \"b\": \"x\\ny\"}\n</parameter>\n"
            "<parameter=note>\n  two\nlines \"q\" <b> \n</parameter>\n"
            "</function>\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n18°C\n</tool_response><|im_end|>\n" +
                std::string(kGen));
}

TEST(ChatTools, ParallelCallsGroupedResultsAndTheRewrite) {
  // Thinking off, the last user message last: every assistant turn is rewritten (the empty
  // block in front of its content, reasoning ""), so none gets a think block of its own; the
  // non-blank content sets the first call off by a blank line (T112).
  const std::string prompt = render(R"({"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
      {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": \"1\"}"}},
      {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "a", "content": " r1\n"},
    {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "r2"}]},
    {"role": "assistant", "content": "done"},
    {"role": "user", "content": "thanks"}]})");
  EXPECT_EQ(prompt,
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nLet me check.\n\n"
            "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=g>\n</function>\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n"
            "</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\ndone<|im_end|>\n"
            "<|im_start|>user\nthanks<|im_end|>\n" +
                std::string(kGen));
}

TEST(ChatTools, AgentLoopPromptsExtendEachOther) {
  // Thinking off: prompt(N) + the generated text + <|im_end|>\n is a prefix of prompt(N+1)
  // through a call, its result, the answer and the next question.
  const std::vector<OrderedJson> tools = {json(kWeatherTool)};
  ChatToolCall call{"call_1", "get_weather", json(R"({"city":"Paris"})")};
  const std::string generated_call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
      "</tool_call>";
  std::vector<ChatMessage> m = {{ChatRole::user, "q"}};
  const std::string p1 = render_chat(m, tools);
  m.push_back({ChatRole::assistant, "", std::nullopt, {call}});
  m.push_back({ChatRole::tool, "18", std::nullopt, {}, "call_1"});
  const std::string p2 = render_chat(m, tools);
  EXPECT_EQ(p2.rfind(p1 + generated_call + "<|im_end|>\n", 0), 0u) << p2;
  m.push_back({ChatRole::assistant, "It is 18."});
  m.push_back({ChatRole::user, "thanks"});
  const std::string p3 = render_chat(m, tools);
  EXPECT_EQ(p3.rfind(p2 + "It is 18.<|im_end|>\n", 0), 0u) << p3;
}

TEST(ChatTools, ThinkingOnReasoningAndTheCallSeparator) {
  // No rewrite: the turn after the query shows its reasoning_content; content that is empty
  // after the </think> split puts the call right after the block (T111 tests content|trim).
  EXPECT_EQ(render(R"({"chat_template_kwargs": {"enable_thinking": true}, "messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "", "reasoning_content": " I should call f. ",
     "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]},
    {"role": "tool", "content": "r"}]})"),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nI should call f.\n"
            "</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n" +
                std::string(kGenThinking));
  EXPECT_EQ(render(R"({"chat_template_kwargs": {"enable_thinking": true}, "messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "<think>r</think>\n\nLet me call.",
     "tool_calls": [{"function": {"name": "f"}}]},
    {"role": "assistant", "content": "<think>r</think>",
     "tool_calls": [{"function": {"name": "g"}}]}]})"),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr\n</think>\n\nLet me call.\n\n<tool_call>\n"
            "<function=f>\n</function>\n</tool_call><|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>\n<function=g>\n"
            "</function>\n</tool_call><|im_end|>\n" +
                std::string(kGenThinking));
}

TEST(ChatTools, EarlierReasoningAndPreserveThinking) {
  const char* history = R"([{"role": "user", "content": "q1"},
    {"role": "assistant", "content": "A1", "reasoning": "r1"},
    {"role": "user", "content": "q2"}])";
  const auto with = [&](const char* kwargs) {
    return render(
        (std::string(R"({"messages": )") + history + R"(, "chat_template_kwargs": )" + kwargs + "}")
            .c_str());
  };
  // Thinking on: the template drops reasoning before the last query...
  EXPECT_EQ(with(R"({"enable_thinking": true})"),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n" +
                std::string(kGenThinking));
  // ...unless preserve_thinking is true (T100).
  EXPECT_EQ(with(R"({"enable_thinking": true, "preserve_thinking": true})"),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\nA1"
            "<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n" +
                std::string(kGenThinking));
  // Thinking off: the rewrite replaces the reasoning by "" and puts the empty block into the
  // content; preserve_thinking is then moot and not passed on (one block, not two).
  EXPECT_EQ(with(R"({"enable_thinking": false})"),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA1"
            "<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n" +
                std::string(kGen));
  EXPECT_EQ(with(R"({"preserve_thinking": true})"),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA1"
            "<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n" +
                std::string(kGen));
}

TEST(ChatTools, ToolMessagesOpenAndCloseTheirUserTurn) {
  // A leading tool message has no previous item, so no turn is opened (T132).
  EXPECT_EQ(render_chat({{ChatRole::tool, "r"}, {ChatRole::user, "q"}}),
            "\n<tool_response>\nr\n</tool_response><|im_end|>\n<|im_start|>user\nq<|im_end|>\n" +
                std::string(kGen));
  // After a system message; empty content; the last message a tool result.
  EXPECT_EQ(render_chat({{ChatRole::system, "S"},
                         {ChatRole::user, "q"},
                         {ChatRole::tool, ""},
                         {ChatRole::tool, "  x  "}}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n\n</tool_response>\n<tool_response>\nx\n"
            "</tool_response><|im_end|>\n" +
                std::string(kGen));
  // Tool messages are not queries: with no user message the template raises (T78-80).
  try {
    render_chat({{ChatRole::tool, "r"}});
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "chat template: No user query found in messages. (no message has role user)");
  }
}

TEST(ChatTools, DeveloperIsASystemMessage) {
  EXPECT_EQ(
      render(
          R"({"messages": [{"role": "developer", "content": "D"}, {"role": "user", "content": "q"}]})"),
      "<|im_start|>system\nD<|im_end|>\n<|im_start|>user\nq<|im_end|>\n" + std::string(kGen));
}

TEST(ChatTools, GenerationPrompts) {
  EXPECT_EQ(chat_generation_prompt(false), kGen);
  EXPECT_EQ(chat_generation_prompt(true), kGenThinking);
}

TEST(ChatTools, RequestRulesAcceptATrailingToolResult) {
  EXPECT_NO_THROW(check_chat_request_messages({{ChatRole::user, "q"}, {ChatRole::tool, "r"}}));
  try {
    check_chat_request_messages({{ChatRole::user, "q"}, {ChatRole::assistant, "a"}});
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "the final message must have role=user, found role=assistant");
  }
}

}  // namespace
}  // namespace lily

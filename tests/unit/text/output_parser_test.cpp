// OutputParser: reasoning, content and Qwen3-Coder XML tool calls, whole and streamed in any split.
//
// Expected values are written by hand from the format rules (docs/output-parsing.md), never
// taken from the parser's own output.
#include "text/output_parser.h"

#include <gtest/gtest.h>

#include <cctype>
#include <memory>
#include <random>

#include "core/error.h"

namespace lily {
namespace {

using Kind = OutputDelta::Kind;

// A tool with one parameter of each kind the tests need.
std::vector<ToolSpec> weather_tools() {
  return {{"get_weather", OrderedJson::parse(R"({"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
      "metric": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array"},
      "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}})")},
          {"ping", nullptr}};
}

OutputParserConfig config(bool thinking, bool tools) {
  OutputParserConfig c;
  c.starts_in_reasoning = thinking;
  c.tool_calls = tools;
  if (tools) c.tools = weather_tools();
  return c;
}

// Ids call_1, call_2, ... so that tests can name them.
std::function<std::string()> counting_ids() {
  auto next = std::make_shared<int>(0);
  return [next] { return "call_" + std::to_string(++*next); };
}

struct Parsed {
  ParsedOutput out;
  std::vector<OutputDelta> deltas;
};

Parsed parse(std::string_view text, const OutputParserConfig& c, bool truncated = false) {
  OutputParser parser(c, counting_ids());
  Parsed p;
  p.deltas = parser.feed(text);
  for (OutputDelta& d : parser.finish(truncated)) p.deltas.push_back(std::move(d));
  p.out = parser.output();
  return p;
}

// (name, arguments) of each call.
std::vector<std::pair<std::string, std::string>> calls(const ParsedOutput& out) {
  std::vector<std::pair<std::string, std::string>> v;
  for (const ParsedToolCall& c : out.tool_calls) v.emplace_back(c.name, c.arguments);
  return v;
}

using Calls = std::vector<std::pair<std::string, std::string>>;

constexpr std::string_view kParisCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";

// ---- reasoning -------------------------------------------------------------------------

TEST(OutputParser, ThinkingOffIsAllContent) {
  const Parsed p = parse("\nHello</think>\n<think>x", config(false, false));
  EXPECT_EQ(p.out.content, "\nHello</think>\n<think>x");
  EXPECT_EQ(p.out.reasoning, "");
  EXPECT_TRUE(p.out.tool_calls.empty());
}

TEST(OutputParser, ReasoningEndsAtTheFirstCloseTag) {
  const Parsed p = parse("\nLet me think.\n\n</think>\n\nThe answer is 4.\n", config(true, false));
  EXPECT_EQ(p.out.reasoning, "Let me think.");
  EXPECT_EQ(p.out.content, "The answer is 4.\n");
  // A second </think> is content.
  const Parsed twice = parse("a</think>b</think>c", config(true, false));
  EXPECT_EQ(twice.out.reasoning, "a");
  EXPECT_EQ(twice.out.content, "b</think>c");
}

TEST(OutputParser, RepeatedLeadingThinkIsDropped) {
  const Parsed p = parse("<think>\nHmm.</think>Yes", config(true, false));
  EXPECT_EQ(p.out.reasoning, "Hmm.");
  EXPECT_EQ(p.out.content, "Yes");
  EXPECT_EQ(parse("\n<think>\n<think>x</think>", config(true, false)).out.reasoning, "x");
  // Only at the start: later it is reasoning text.
  EXPECT_EQ(parse("a <think> b</think>", config(true, false)).out.reasoning, "a <think> b");
}

TEST(OutputParser, NoCloseTagMeansAllReasoning) {
  for (const bool truncated : {false, true}) {
    const Parsed p = parse("Still thinking\n about it\n\n", config(true, true), truncated);
    EXPECT_EQ(p.out.reasoning, "Still thinking\n about it");
    EXPECT_EQ(p.out.content, "");
  }
  // Reasoning keeps inner blank lines and spaces; only '\n's are stripped at its ends.
  EXPECT_EQ(parse("\n\n a \n\nb \n</think>", config(true, false)).out.reasoning, " a \n\nb ");
}

TEST(OutputParser, EmptyOutputs) {
  EXPECT_EQ(parse("", config(true, true)).out.reasoning, "");
  const Parsed p = parse("</think>\n\n", config(true, true));
  EXPECT_EQ(p.out.reasoning, "");
  EXPECT_EQ(p.out.content, "");
  EXPECT_TRUE(p.deltas.empty());
}

// ---- tool calls ------------------------------------------------------------------------

TEST(OutputParser, TextBeforeACall) {  // llama.cpp #20260
  const Parsed p = parse("Let me check.\n\n" + std::string(kParisCall), config(false, true));
  EXPECT_EQ(p.out.content, "Let me check.");
  ASSERT_EQ(p.out.tool_calls.size(), 1u);
  EXPECT_EQ(p.out.tool_calls[0].id, "call_1");
  EXPECT_EQ(p.out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.out.tool_calls[0].arguments, R"({"city": "Paris"})");
}

TEST(OutputParser, SeveralCalls) {
  const std::string text = std::string(kParisCall) +
                           "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
                           "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
  const Parsed p = parse(text, config(false, true));
  EXPECT_EQ(p.out.content, "");
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": "Paris"})"},
                                 {"get_weather", R"({"city": "Rome", "days": 2})"}}));
  EXPECT_EQ(p.out.tool_calls[1].id, "call_2");
}

TEST(OutputParser, TextAfterCallsIsKeptWhitespaceIsNot) {
  const Parsed p = parse("A\n\n" + std::string(kParisCall) + "\n\nB\n", config(false, true));
  EXPECT_EQ(p.out.content, "A\n\nB\n");
  EXPECT_EQ(parse(std::string(kParisCall) + "\n \n", config(false, true)).out.content, "");
  EXPECT_EQ(parse(" \n" + std::string(kParisCall) + "\n" + std::string(kParisCall) + "\n", config(false, true))
                .out.content,
            "");
}

TEST(OutputParser, CallInsideTheReasoning) {  // vLLM #39056, #42021
  const std::string text = "I need the weather.\n" + std::string(kParisCall) +
                           "\nThen I answer.\n</think>\n\nIt is sunny.";
  const Parsed p = parse(text, config(true, true));
  EXPECT_EQ(p.out.reasoning, "I need the weather.\nThen I answer.");
  EXPECT_EQ(p.out.content, "It is sunny.");
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": "Paris"})"}}));
}

TEST(OutputParser, CloseTagThenACall) {
  const Parsed p = parse("Think.</think>\n\n" + std::string(kParisCall), config(true, true));
  EXPECT_EQ(p.out.reasoning, "Think.");
  EXPECT_EQ(p.out.content, "");
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": "Paris"})"}}));
}

TEST(OutputParser, CloseTagInsideAnOpenCallEndsBoth) {  // vLLM #51679: </think> not swallowed
  const Parsed p = parse("Hmm\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</think>\n\nAnswer",
                         config(true, true));
  EXPECT_EQ(p.out.reasoning, "Hmm");
  EXPECT_EQ(p.out.content, "Answer");
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": "Paris"})"}}));
  // Before the function name is complete the block is not a call: it stays reasoning.
  const Parsed q = parse("<tool_call>\n<function=get_wea</think>ok", config(true, true));
  EXPECT_EQ(q.out.reasoning, "<tool_call>\n<function=get_wea");
  EXPECT_EQ(q.out.content, "ok");
  EXPECT_TRUE(q.out.tool_calls.empty());
}

TEST(OutputParser, MissingParameterCloseTag) {  // llama.cpp PR #18077
  const Parsed p = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n3\n"
                         "</function>\n</tool_call>",
                         config(false, true));
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": "Paris", "days": 3})"}}));
  const Parsed q = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>", config(false, true));
  EXPECT_EQ(calls(q.out), (Calls{{"get_weather", R"({"city": "Paris"})"}}));
}

TEST(OutputParser, RepeatedParameterCloseTag) {  // llama.cpp #24807
  const Parsed p = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</parameter>\n"
                         "<parameter=days>\n3\n</parameter>\n</parameter>\n</function>\n</parameter>\n</tool_call>\nDone.",
                         config(false, true));
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": "Paris", "days": 3})"}}));
  EXPECT_EQ(p.out.content, "\nDone.");
}

TEST(OutputParser, MissingFunctionOrToolCallCloseTag) {
  const Parsed p = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
                         config(false, true));
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": "Paris"})"}}));
  EXPECT_EQ(p.out.content, "");
  const Parsed q = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\nOK",
                         config(false, true));
  EXPECT_EQ(calls(q.out), (Calls{{"get_weather", R"({"city": "Paris"})"}}));
  EXPECT_EQ(q.out.content, "\nOK");
}

TEST(OutputParser, TwoFunctionsInOneBlock) {
  const Parsed p = parse("<tool_call>\n<function=ping>\n</function>\n<function=get_weather>\n<parameter=days>\n1\n"
                         "</parameter>\n</function>\n</tool_call>",
                         config(false, true));
  EXPECT_EQ(calls(p.out), (Calls{{"ping", "{}"}, {"get_weather", R"({"days": 1})"}}));
}

TEST(OutputParser, MalformedFunctionNamesStayContent) {
  for (const std::string text : {
           "<tool_call>\n<function=get weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
           "<tool_call>\n<function=>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
           "<tool_call>\n<function=get_weather\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
           "<tool_call>\n<function=get_weather<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
           "Sure.\n\n<tool_call>\n<function=a b>\n</tool_call>",
           "<tool_call></tool_call>",
       }) {
    const Parsed p = parse(text, config(false, true));
    EXPECT_EQ(p.out.content, text);
    EXPECT_TRUE(p.out.tool_calls.empty()) << text;
  }
}

TEST(OutputParser, MalformedParameterNamesAreSkipped) {  // vLLM PR #55497
  const Parsed p = parse("<tool_call>\n<function=get_weather>\n<parameter=my city>\nParis\n</parameter>\n"
                         "<parameter=>\nx\n</parameter>\n<parameter=days\n4\n</parameter>\n"
                         "<parameter=days>\n3\n</parameter>\n<parameter=a<b>\nz\n</parameter>\n</function>\n</tool_call>",
                         config(false, true));
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"days": 3})"}}));
  EXPECT_EQ(p.out.content, "");
}

TEST(OutputParser, CallCutByMaxTokens) {
  const std::string text = "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  const Parsed cut = parse(text, config(false, true), /*truncated=*/true);
  EXPECT_EQ(cut.out.content, text);
  EXPECT_TRUE(cut.out.tool_calls.empty());
  // The model stopped (EOS) instead: closed with what was parsed.
  const Parsed stopped = parse(text, config(false, true), /*truncated=*/false);
  EXPECT_EQ(stopped.out.content, "Sure.");
  EXPECT_EQ(calls(stopped.out), (Calls{{"get_weather", R"({"city": "Par"})"}}));
  // No function name yet: never a call.
  EXPECT_EQ(parse("<tool_call>\n<function=get_wea", config(false, true)).out.content, "<tool_call>\n<function=get_wea");
  EXPECT_EQ(parse("x <tool_call>", config(false, true)).out.content, "x <tool_call>");
  // A complete call before the cut is a call.
  const Parsed done = parse(std::string(kParisCall) + "\n<tool_call>\n<function=ping>\n", config(false, true), true);
  EXPECT_EQ(calls(done.out), (Calls{{"get_weather", R"({"city": "Paris"})"}}));
  EXPECT_EQ(done.out.content, "\n<tool_call>\n<function=ping>\n");
  // A cut inside a call in the reasoning gives its text back to the reasoning.
  const Parsed thinking = parse("Hmm\n<tool_call>\n<function=ping>\n<parameter=a>\n1", config(true, true), true);
  EXPECT_EQ(thinking.out.reasoning, "Hmm\n<tool_call>\n<function=ping>\n<parameter=a>\n1");
  EXPECT_TRUE(thinking.out.tool_calls.empty());
}

TEST(OutputParser, EmptyValues) {  // sglang #36835
  const Parsed p = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\n\n</parameter>\n"
                         "<parameter=days>\n\n</parameter>\n<parameter=temp>\n</parameter>\n"
                         "<parameter=limit>\n  \n</parameter>\n</function>\n</tool_call>",
                         config(false, true));
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": ""})"}}));
}

TEST(OutputParser, UnknownParameterAndUnknownFunctionGiveStrings) {
  const Parsed p = parse("<tool_call>\n<function=get_weather>\n<parameter=extra>\n42\n</parameter>\n"
                         "<parameter=days>\n42\n</parameter>\n</function>\n</tool_call>"
                         "<tool_call>\n<function=lookup>\n<parameter=n>\n5\n</parameter>\n<parameter=ok>\ntrue\n"
                         "</parameter>\n</function>\n</tool_call>",
                         config(false, true));
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"extra": "42", "days": 42})"},
                                 {"lookup", R"({"n": "5", "ok": "true"})"}}));
  // A tool without a parameters schema: strings too.
  EXPECT_EQ(calls(parse("<tool_call>\n<function=ping>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>",
                        config(false, true))
                      .out),
            (Calls{{"ping", R"({"n": "5"})"}}));
}

TEST(OutputParser, DuplicateKeyLastWinsAtItsFirstPlace) {
  const Parsed p = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                         "<parameter=days>\n1\n</parameter>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
                         config(false, true));
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": "Rome", "days": 1})"}}));
}

TEST(OutputParser, ValuesAndArgumentsText) {
  // One newline on each side is the format's; the rest, markup and non-ASCII text stay.
  const Parsed p = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\n\nZ\xC3\xBCrich \"<b>\"\t\\\n\n"
                         "</parameter>\n<parameter=temp>\n-0.5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
                         "<parameter=opts>\n{\"a\": [1, 2.5, null], \"b\": {}}\n</parameter>\n"
                         "<parameter=tags>\n[\"x\",\"y\"]\n</parameter>\n<parameter=limit>\n5\n</parameter>\n"
                         "<parameter=days>\nnull\n</parameter>\n</function>\n</tool_call>",
                         config(false, true));
  EXPECT_EQ(calls(p.out),
            (Calls{{"get_weather",
                    "{\"city\": \"\\nZ\xC3\xBCrich \\\"<b>\\\"\\t\\\\\\n\", \"temp\": -0.5, \"metric\": true, "
                    "\"opts\": {\"a\": [1, 2.5, null], \"b\": {}}, \"tags\": [\"x\", \"y\"], \"limit\": 5, "
                    "\"days\": null}"}}));
}

TEST(OutputParser, ToolCallsOffLeavesTheMarkupAsText) {
  const Parsed p = parse("Hi\n\n" + std::string(kParisCall), config(false, false));
  EXPECT_EQ(p.out.content, "Hi\n\n" + std::string(kParisCall));
  const Parsed r = parse("Hi\n" + std::string(kParisCall) + "</think>", config(true, false));
  EXPECT_EQ(r.out.reasoning, "Hi\n" + std::string(kParisCall));
}

// ---- streaming ---------------------------------------------------------------------------

TEST(OutputParser, StreamingHoldsBackWhatCouldStillChange) {
  OutputParser parser(config(false, true), counting_ids());
  std::vector<OutputDelta> d = parser.feed("Hello");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, Kind::content);
  EXPECT_EQ(d[0].text, "Hello");
  EXPECT_TRUE(parser.feed(" \n<tool").empty());  // could be whitespace before a call
  EXPECT_FALSE(parser.in_tool_call());
  EXPECT_TRUE(parser.feed("_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n").empty());
  EXPECT_TRUE(parser.in_tool_call());
  d = parser.feed("<parameter=days>\n3\n</parameter>\n</func");
  EXPECT_TRUE(d.empty());
  d = parser.feed("tion>");  // complete: emitted now
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0].kind, Kind::tool_call);
  EXPECT_EQ(d[0].call_index, 0u);
  EXPECT_EQ(d[0].call_id, "call_1");
  EXPECT_EQ(d[0].call_name, "get_weather");
  EXPECT_EQ(d[0].text, "");
  EXPECT_EQ(d[1].text, R"({"city": "Paris")");
  EXPECT_EQ(d[2].text, R"(, "days": 3)");
  EXPECT_EQ(d[3].text, "}");
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(d[i].kind, Kind::tool_call);
    EXPECT_EQ(d[i].call_index, 0u);
    EXPECT_EQ(d[i].call_id, "");
    EXPECT_EQ(d[i].call_name, "");
  }
  EXPECT_TRUE(parser.in_tool_call());  // until </tool_call>
  EXPECT_TRUE(parser.feed("\n</tool_call>").empty());
  EXPECT_FALSE(parser.in_tool_call());
  d = parser.feed("\n<tool_call>\n<function=ping>\n</function></tool_call>");
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].call_index, 1u);
  EXPECT_EQ(d[0].call_id, "call_2");
  EXPECT_EQ(d[1].text, "{");
  EXPECT_EQ(d[2].text, "}");
  EXPECT_TRUE(parser.feed("\n").empty());
  EXPECT_TRUE(parser.finish(false).empty());
  EXPECT_EQ(parser.output().content, "Hello");
  EXPECT_TRUE(parser.feed("more").empty());  // after finish: nothing
  EXPECT_TRUE(parser.finish(false).empty());
  EXPECT_EQ(parser.output().content, "Hello");
}

TEST(OutputParser, StreamingReleasesWhatTurnsOutPlain) {
  OutputParser parser(config(true, true), counting_ids());
  EXPECT_TRUE(parser.in_reasoning());
  EXPECT_TRUE(parser.feed("\n<thi").empty());
  std::vector<OutputDelta> d = parser.feed("s is it\n");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, Kind::reasoning);
  EXPECT_EQ(d[0].text, "<this is it");
  EXPECT_TRUE(parser.feed("</thin").empty());
  d = parser.feed("king>");  // not </think>: the held newline is reasoning text after all
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, "\n</thinking>");
  EXPECT_TRUE(parser.feed("\n</think>\n").empty());
  EXPECT_FALSE(parser.in_reasoning());
  d = parser.feed("\nDone <tool_cal");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, Kind::content);
  EXPECT_EQ(d[0].text, "Done");
  d = parser.finish(true);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, " <tool_cal");
  EXPECT_EQ(parser.output().reasoning, "<this is it\n</thinking>");
  EXPECT_EQ(parser.output().content, "Done <tool_cal");
}

TEST(OutputParser, RandomCallIds) {
  const std::string a = random_call_id();
  const std::string b = random_call_id();
  EXPECT_NE(a, b);
  for (const std::string& id : {a, b}) {
    ASSERT_EQ(id.size(), 29u);
    EXPECT_EQ(id.substr(0, 5), "call_");
    for (size_t i = 5; i < id.size(); ++i) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(id[i]))) << id;
  }
  // The default generator when none is given.
  const Parsed p = [] {
    OutputParser parser(config(false, true), {});
    parser.feed(kParisCall);
    parser.finish(false);
    return Parsed{parser.output(), {}};
  }();
  ASSERT_EQ(p.out.tool_calls.size(), 1u);
  EXPECT_EQ(p.out.tool_calls[0].id.size(), 29u);
}

// The concatenated deltas of each kind (and of each call) for any split of `text`.
struct Streamed {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
};

Streamed concatenate(const std::vector<OutputDelta>& deltas) {
  Streamed s;
  for (const OutputDelta& d : deltas) {
    switch (d.kind) {
      case Kind::reasoning:
        s.reasoning += d.text;
        break;
      case Kind::content:
        s.content += d.text;
        break;
      case Kind::tool_call:
        if (!d.call_id.empty()) {
          EXPECT_EQ(d.text, "");
          EXPECT_EQ(d.call_index, s.calls.size());
          s.calls.push_back({d.call_id, d.call_name, ""});
        } else {
          EXPECT_FALSE(s.calls.empty());
          if (s.calls.empty()) break;
          EXPECT_EQ(d.call_index, s.calls.size() - 1);
          EXPECT_EQ(d.call_name, "");
          s.calls.back().arguments += d.text;
        }
        break;
    }
  }
  return s;
}

// Code point boundaries of `text`.
std::vector<size_t> boundaries(std::string_view text) {
  std::vector<size_t> b;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) b.push_back(i);
  }
  b.push_back(text.size());
  return b;
}

void expect_same(const Streamed& s, const ParsedOutput& streamed_out, const ParsedOutput& whole, const std::string& what) {
  EXPECT_EQ(s.reasoning, whole.reasoning) << what;
  EXPECT_EQ(s.content, whole.content) << what;
  EXPECT_EQ(streamed_out.reasoning, whole.reasoning) << what;
  EXPECT_EQ(streamed_out.content, whole.content) << what;
  ASSERT_EQ(s.calls.size(), whole.tool_calls.size()) << what;
  ASSERT_EQ(streamed_out.tool_calls.size(), whole.tool_calls.size()) << what;
  for (size_t i = 0; i < s.calls.size(); ++i) {
    EXPECT_EQ(s.calls[i].id, whole.tool_calls[i].id) << what;
    EXPECT_EQ(s.calls[i].name, whole.tool_calls[i].name) << what;
    EXPECT_EQ(s.calls[i].arguments, whole.tool_calls[i].arguments) << what;
    EXPECT_EQ(streamed_out.tool_calls[i].arguments, whole.tool_calls[i].arguments) << what;
  }
}

TEST(OutputParser, AnySplitGivesTheWholeTextParse) {
  const std::vector<std::string> texts = {
      "\n<think>\nPlan: call it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "</function>\n</tool_call>\nWait.\n\n</think>\n\nHere \xE2\x9C\x93 it is.\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nR\xC3\xB6me\n<parameter=days>\n2\n</parameter>\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=ping>\n</function>\n<function=lookup>\n<parameter=q>\na < b </para\n</tool_call>\n"
      "trailing \xF0\x9F\x98\x80 text \n",
      "<tool_call>\n<function=bad name>\n</tool_call>\n\n<tool_call><tool_call>\n<function=get_weather>\n"
      "<parameter=my key>\nx\n</parameter><parameter=temp>\n1e-5\n</parameter>\n</function>\nafter\n"
      "<tool_call>\n<function=get_weather>\n<parameter=tags>\n[1, 2\n</parameter>\n</function>\n</tool_call> \n ",
      "No think close <thin </thi </think x\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>\n\n<tool_call>\n"
      "<function=get_weather>\n<parameter=city>\nParis\n</think>\n\nAfter\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=days>\n3",
      "</think>\n\n\n<tool_call>\n<function=get_weather>\n<parameter=opts>\n{\"a\": \"</parameter>\"}\n"
      "</parameter>\n</function>\n</tool_call>\n\n",
  };
  std::mt19937 rng(20260916);
  for (size_t t = 0; t < texts.size(); ++t) {
    const std::string& text = texts[t];
    const std::vector<size_t> cuts = boundaries(text);
    for (const bool thinking : {false, true}) {
      for (const bool tools : {false, true}) {
        for (const bool truncated : {false, true}) {
          const OutputParserConfig c = config(thinking, tools);
          const Parsed whole = parse(text, c, truncated);
          // The single-feed deltas concatenate to output() as well.
          expect_same(concatenate(whole.deltas), whole.out, whole.out, "whole");
          for (int trial = 0; trial < 60; ++trial) {
            // Trial 0: one code point at a time; then random pieces of 1..12 code points.
            OutputParser parser(c, counting_ids());
            std::vector<OutputDelta> deltas;
            size_t at = 0;
            std::string pieces;
            while (at + 1 < cuts.size()) {
              const size_t n = trial == 0 ? 1 : 1 + rng() % 12;
              const size_t next = std::min(at + n, cuts.size() - 1);
              const std::string_view piece = std::string_view(text).substr(cuts[at], cuts[next] - cuts[at]);
              for (OutputDelta& d : parser.feed(piece)) deltas.push_back(std::move(d));
              pieces += std::to_string(cuts[next]) + " ";
              at = next;
            }
            for (OutputDelta& d : parser.finish(truncated)) deltas.push_back(std::move(d));
            const std::string what = "text " + std::to_string(t) + (thinking ? " thinking" : "") +
                                     (tools ? " tools" : "") + (truncated ? " truncated" : "") + ", cuts " + pieces;
            expect_same(concatenate(deltas), parser.output(), whole.out, what);
            if (testing::Test::HasFailure()) return;
          }
        }
      }
    }
  }
}

// The whole-text parse of the first mixed text above, derived by hand from the rules.
TEST(OutputParser, MixedTextByHand) {
  const std::string text =
      "\n<think>\nPlan: call it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "</function>\n</tool_call>\nWait.\n\n</think>\n\nHere \xE2\x9C\x93 it is.\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nR\xC3\xB6me\n<parameter=days>\n2\n</parameter>\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=ping>\n</function>\n<function=lookup>\n<parameter=q>\na < b </para\n</tool_call>\n"
      "trailing \xF0\x9F\x98\x80 text \n";
  const Parsed p = parse(text, config(true, true));
  EXPECT_EQ(p.out.reasoning, "Plan: call it.\nWait.");
  EXPECT_EQ(p.out.content, "Here \xE2\x9C\x93 it is.\ntrailing \xF0\x9F\x98\x80 text \n");
  EXPECT_EQ(calls(p.out), (Calls{{"get_weather", R"({"city": "Paris"})"},
                                 {"get_weather", "{\"city\": \"R\xC3\xB6me\", \"days\": 2}"},
                                 {"ping", "{}"},
                                 {"lookup", R"({"q": "a < b </para"})"}}));
  const Parsed second = parse(
      "<tool_call>\n<function=bad name>\n</tool_call>\n\n<tool_call><tool_call>\n<function=get_weather>\n"
      "<parameter=my key>\nx\n</parameter><parameter=temp>\n1e-5\n</parameter>\n</function>\nafter\n"
      "<tool_call>\n<function=get_weather>\n<parameter=tags>\n[1, 2\n</parameter>\n</function>\n</tool_call> \n ",
      config(false, true));
  // "<tool_call>" followed by "<tool_call>" is not a call: it stays text, the second opens one.
  EXPECT_EQ(second.out.content, "<tool_call>\n<function=bad name>\n</tool_call>\n\n<tool_call>\nafter");
  EXPECT_EQ(calls(second.out), (Calls{{"get_weather", R"({"temp": 1e-05})"}, {"get_weather", R"({"tags": "[1, 2"})"}}));
}

// ---- tool_specs_from_openai --------------------------------------------------------------

TEST(ToolSpecs, FromOpenAiTools) {
  const std::vector<ToolSpec> specs = tool_specs_from_openai(OrderedJson::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "d",
                                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "ping"}},
      {"type": "function", "function": {"name": "noop", "parameters": null}}])"));
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].name, "get_weather");
  EXPECT_EQ(specs[0].parameters.dump(), R"({"type":"object","properties":{"city":{"type":"string"}}})");
  EXPECT_EQ(specs[1].name, "ping");
  EXPECT_TRUE(specs[1].parameters.is_null());
  EXPECT_TRUE(specs[2].parameters.is_null());
  EXPECT_TRUE(tool_specs_from_openai(OrderedJson::array()).empty());
}

TEST(ToolSpecs, BadToolsNameTheElement) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "function"})", "tools: expected an array"},
      {R"([5])", "tools[0]: expected a {\"type\": \"function\", ...} object, found number 5"},
      {R"([{"function": {"name": "f"}}])", "tools[0].type: expected \"function\", found nothing"},
      {R"([{"type": "function", "function": {"name": "f"}}, {"type": "custom", "function": {"name": "g"}}])",
       "tools[1].type: expected \"function\", found string \"custom\""},
      {R"([{"type": "function"}])", "tools[0].function: expected an object with \"name\", found nothing"},
      {R"([{"type": "function", "function": {"name": ""}}])", "tools[0].function.name: expected a non-empty string"},
      {R"([{"type": "function", "function": {"name": 7}}])",
       "tools[0].function.name: expected a non-empty string, found number 7"},
      {R"([{"type": "function", "function": {"name": "get weather"}}])",
       "tools[0].function.name: string \"get weather\" holds whitespace, '<' or '>'"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": "x"}}])",
       "tools[0].function.parameters: expected a JSON schema object, found string \"x\""},
  };
  for (const auto& [json, message] : cases) {
    try {
      tool_specs_from_openai(OrderedJson::parse(json));
      ADD_FAILURE() << "no error for " << json;
    } catch (const InputError& error) {
      EXPECT_EQ(std::string(error.what()).rfind(message, 0), 0u) << error.what();
    }
  }
}

}  // namespace
}  // namespace lily

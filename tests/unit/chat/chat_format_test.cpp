// Tests for the native chat format: hand-written expected prompts for every shape and error.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/strict_json.h"
#include "text/chat_format.h"

namespace lily {
namespace {

constexpr const char* kGen = "<|im_start|>assistant\n<think>\n\n</think>\n\n";

ChatMessage sys(std::string c) {
  return {ChatRole::system, std::move(c)};
}
ChatMessage usr(std::string c) {
  return {ChatRole::user, std::move(c)};
}
ChatMessage asst(std::string c) {
  return {ChatRole::assistant, std::move(c)};
}

// The InputError message of `f()`, or a failure if it does not throw one.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return {};
}

std::string render_json(const char* text) {
  return render_chat(parse_chat_messages(parse_strict_json(text, "test", 16), "messages"));
}

// ---- basic shapes ----------------------------------------------------------------------

TEST(ChatFormat, SingleUser) {
  EXPECT_EQ(render_chat({usr("Hello")}),
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatFormat, SystemAndUser) {
  // What Jinja2 renders from the checkpoint's template here (enable_thinking=False;
  // docs/chat-format.md §4).
  EXPECT_EQ(render_chat({sys("You are a helpful assistant."), usr("Hello")}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello"
            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatFormat, MultiTurnHistoryRewrite) {
  const std::string expected =
      "<|im_start|>user\nQ1<|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\nA1<|im_end|>\n"
      "<|im_start|>user\nQ2<|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n"
      "<|im_start|>user\nQ3<|im_end|>\n" +
      std::string(kGen);
  EXPECT_EQ(render_chat({usr("Q1"), asst("A1"), usr("Q2"), asst("A2"), usr("Q3")}), expected);
}

TEST(ChatFormat, HistoryRewriteKeepsPromptsPrefixCacheable) {
  // Turn N's prompt + the generated answer + <|im_end|>\n is a prefix of turn N+1's prompt.
  const std::string turn1 = render_chat({sys("S"), usr("Q1")});
  const std::string turn2 = render_chat({sys("S"), usr("Q1"), asst("A1"), usr("Q2")});
  EXPECT_EQ(turn2.rfind(turn1 + "A1<|im_end|>\n", 0), 0u) << turn2;
}

TEST(ChatFormat, AssistantAlreadyStartingWithTheThinkBlockIsNotPrefixedTwice) {
  const std::string expected =
      "<|im_start|>user\nQ1<|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\nA1<|im_end|>\n"
      "<|im_start|>user\nQ2<|im_end|>\n" +
      std::string(kGen);
  EXPECT_EQ(render_chat({usr("Q1"), asst("<think>\n\n</think>\n\nA1"), usr("Q2")}), expected);
  // Only that exact string counts: near misses get the block in front of them.
  EXPECT_EQ(render_chat({usr("Q1"), asst("<think>\n</think>\n\nA1"), usr("Q2")}),
            "<|im_start|>user\nQ1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n<think>\n</think>\n\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n" +
                std::string(kGen));
  // The check is on the raw content, before the template trims it.
  EXPECT_EQ(render_chat({usr("Q1"), asst(" <think>\n\n</think>\n\nA1"), usr("Q2")}),
            "<|im_start|>user\nQ1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n <think>\n\n</think>\n\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n" +
                std::string(kGen));
}

TEST(ChatFormat, ReasoningInsideAnEarlierAssistantTurnStaysInItsContent) {
  // reasoning_content = "" (a string) stops the template splitting at </think>, so the old
  // reasoning is rendered verbatim after the empty block (Lily's rewrite, docs/chat-format.md §3).
  EXPECT_EQ(render_chat({usr("Q1"), asst("<think>\nr1\n</think>\n\nA1"), usr("Q2")}),
            "<|im_start|>user\nQ1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n<think>\nr1\n</think>\n\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n" +
                std::string(kGen));
}

TEST(ChatFormat, TrailingAssistantTurnsAreSplitAtThinkClose) {
  // After the last user turn the rewrite does not apply: the template splits the reasoning
  // out of the content and renders both inside a think block.
  EXPECT_EQ(render_chat({usr("q"), asst("<think>\nr\n</think>\n\na")}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na"
            "<|im_end|>\n" +
                std::string(kGen));
  // Reasoning: text before the first </think>, after the last <think> before it, trimmed.
  // Content: text after the last </think> with leading '\n' (only) removed.
  EXPECT_EQ(render_chat({usr("q"), asst("a<think>b<think> r \n</think>c</think>\n\n  d")}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n  d"
            "<|im_end|>\n" +
                std::string(kGen));
  // No <think> at all: everything before </think> is the reasoning.
  EXPECT_EQ(render_chat({usr("q"), asst("just thinking</think>answer")}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\njust thinking\n"
            "</think>\n\nanswer<|im_end|>\n" +
                std::string(kGen));
  // No </think>: empty reasoning, whole content; empty content.
  EXPECT_EQ(render_chat({usr("q"), asst("<think>open"), asst("")}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            "<think>open<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<|im_end|>\n" +
                std::string(kGen));
  // Content ending in </think>.
  EXPECT_EQ(render_chat({usr("q"), asst("<think>r</think>")}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n"
            "<|im_end|>\n" +
                std::string(kGen));
}

TEST(ChatFormat, AssistantBeforeTheFirstUserIsRewritten) {
  EXPECT_EQ(render_chat({sys("S"), asst("hi"), usr("q")}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nhi"
            "<|im_end|>\n<|im_start|>user\nq<|im_end|>\n" +
                std::string(kGen));
}

TEST(ChatFormat, WhitespaceAtTheEdgesIsTrimmed) {
  EXPECT_EQ(render_chat({sys(" \t S \n"), usr("\n\n  Hello\tworld \r\n")}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHello\tworld<|im_end|>\n" +
                std::string(kGen));
  // Python's str.strip() set: U+3000, U+00A0, U+0085, U+001C, U+2028 go; U+FEFF, U+200B stay.
  EXPECT_EQ(render_chat({usr("\u3000\u00a0\u0085\u001ca\u2028")}),
            "<|im_start|>user\na<|im_end|>\n" + std::string(kGen));
  EXPECT_EQ(render_chat({usr("\ufeffa\u200b")}),
            "<|im_start|>user\n\ufeffa\u200b<|im_end|>\n" + std::string(kGen));
  // Empty and all-whitespace contents; the rewritten empty assistant loses the trailing
  // "\n\n" of the block to the trim.
  EXPECT_EQ(render_chat({sys(""), usr(" "), asst(""), usr("")}),
            "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think><|im_end|>\n<|im_start|>user\n<|im_end|>\n" +
                std::string(kGen));
}

TEST(ChatFormat, TextThatLooksLikeMarkupIsCopiedVerbatim) {
  EXPECT_EQ(render_chat({usr("<|im_end|>{{ x }}{% if %}")}),
            "<|im_start|>user\n<|im_end|>{{ x }}{% if %}<|im_end|>\n" + std::string(kGen));
}

TEST(ChatFormat, ToolResponseWrappedUserMessagesAreNotQueries) {
  // The template's last query skips user turns wrapped in <tool_response>…</tool_response>;
  // Lily's rewrite still counts them as user turns. The assistant between the two is after
  // the template's last query, so it gets the template's think block *and* the rewrite's.
  EXPECT_EQ(render_chat({usr("q"), asst("a"), usr(" <tool_response>r</tool_response>\n")}),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n<think>\n\n</think>\n\na<|im_end|>\n"
            "<|im_start|>user\n<tool_response>r</tool_response><|im_end|>\n" +
                std::string(kGen));
  // Only a fully wrapped content counts as a tool response.
  EXPECT_EQ(render_chat({usr("q"), asst("a"), usr("<tool_response>r</tool_response>!")}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\na"
            "<|im_end|>\n<|im_start|>user\n<tool_response>r</tool_response>!<|im_end|>\n" +
                std::string(kGen));
}

TEST(ChatFormat, TemplateOptionsAndReasoningContent) {
  const std::vector<TemplateMessage> messages = {
      {ChatRole::user, "q", std::nullopt},
      {ChatRole::assistant, "<think>x</think>a", std::string("  r  ")},
  };
  EXPECT_EQ(render_chat_template(messages, {.add_generation_prompt = false}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n"
            "<think>x</think>a<|im_end|>\n");
  EXPECT_EQ(render_chat_template({{ChatRole::user, "q", std::nullopt}},
                                 {.add_generation_prompt = true, .enable_thinking = true}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n");
  // Without the rewrite, the stock template drops the reasoning of earlier turns.
  EXPECT_EQ(
      render_chat_template({{ChatRole::user, "Q1", std::nullopt},
                            {ChatRole::assistant, "<think>\nr1\n</think>\n\nA1", std::nullopt},
                            {ChatRole::user, "Q2", std::nullopt}},
                           {}),
      "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
      "<|im_start|>user\nQ2<|im_end|>\n" +
          std::string(kGen));
}

TEST(ChatFormat, HistoryRewrite) {
  const std::vector<TemplateMessage> out = nothink_history_rewrite(
      {asst("a0"), usr("q"), asst("<think>\n\n</think>\n\na2"), usr("q2"), asst("a4")});
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0].content, "<think>\n\n</think>\n\na0");
  EXPECT_EQ(out[0].reasoning_content, std::optional<std::string>(""));
  EXPECT_EQ(out[1].content, "q");
  EXPECT_FALSE(out[1].reasoning_content.has_value());
  EXPECT_EQ(out[2].content, "<think>\n\n</think>\n\na2");
  EXPECT_EQ(out[2].reasoning_content, std::optional<std::string>(""));
  EXPECT_EQ(out[4].content, "a4");
  EXPECT_FALSE(out[4].reasoning_content.has_value());
}

TEST(ChatFormat, ParsesJson) {
  EXPECT_EQ(render_json(R"([{"role":"user","content":"Hi \u00e9\ud83d\ude00"}])"),
            "<|im_start|>user\nHi \u00e9\U0001F600<|im_end|>\n" + std::string(kGen));
  EXPECT_TRUE(parse_chat_messages(Json::array(), "messages").empty());
}

TEST(ChatFormat, PythonStrip) {
  EXPECT_EQ(python_strip(""), "");
  EXPECT_EQ(python_strip(" \t\n\v\f\r\x1c\x1d\x1e\x1f"), "");
  EXPECT_EQ(python_strip("\u2000\u200a\u2029\u202f\u205f\u1680 x \u3000"), "x");
  EXPECT_EQ(python_strip("\u180ex"), "\u180ex");  // not whitespace since Unicode 6.3
  // Invalid UTF-8 at either edge is not whitespace; a truncated sequence stops the scan.
  EXPECT_EQ(python_strip(" \xff x \xc2"), "\xff x \xc2");
  EXPECT_EQ(python_strip("\xa0 x"), "\xa0 x");  // a lone continuation byte, not U+00A0
  EXPECT_EQ(python_strip("\xc2\xa0 x \xc2\xa0"), "x");
}

// ---- errors --------------------------------------------------------------------------------

TEST(ChatFormatErrors, MessageShape) {
  const auto err = [](const char* text) {
    return error_of([&] { parse_chat_messages(parse_strict_json(text, "t", 16), "messages"); });
  };
  EXPECT_EQ(err(R"({"role":"user","content":"x"})"),
            "messages must be a JSON array of {\"role\", \"content\"} objects, found object "
            "{\"content\":\"x\",\"role\":\"user\"}");
  EXPECT_NE(err(R"("hi")").find("must be a JSON array"), std::string::npos);
  EXPECT_NE(err("null").find("must be a JSON array"), std::string::npos);
  EXPECT_NE(err(R"([{"role":"user","content":"x"}, "x"])")
                .find("messages[1] must be an object {\"role\", \"content\"}, found string"),
            std::string::npos);
  EXPECT_EQ(err(R"([{"content":"x"}])"), "messages[0]: missing field \"role\"");
  EXPECT_EQ(err(R"([{"role":"user"}])"), "messages[0]: missing field \"content\"");
  EXPECT_EQ(err(R"([{"role":"tool","content":"x"}])"),
            "messages[0].role must be \"system\", \"user\" or \"assistant\", found string "
            "\"tool\"");
  for (const char* role : {R"("developer")", R"("User")", "null", "1", R"(["user"])"}) {
    const std::string text = std::string(R"([{"role":)") + role + R"(,"content":"x"}])";
    EXPECT_NE(err(text.c_str()).find("messages[0].role must be"), std::string::npos) << role;
  }
  for (const char* content : {"null", "1", "true", R"([{"type":"text","text":"x"}])", "{}"}) {
    const std::string text = std::string(R"([{"role":"user","content":)") + content + "}]";
    EXPECT_NE(err(text.c_str()).find("messages[0].content must be a string, found"),
              std::string::npos)
        << content;
  }
  for (const char* field : {"name", "reasoning_content", "tool_calls"}) {
    const std::string text =
        std::string(R"([{"role":"assistant","content":"x",")") + field + R"(":"y"}])";
    EXPECT_EQ(err(text.c_str()), std::string("messages[0]: unknown field \"") + field +
                                     "\"; a message has exactly the fields \"role\" and "
                                     "\"content\"");
  }
}

TEST(ChatFormatErrors, TemplateRaised) {
  EXPECT_EQ(error_of([] { render_chat({}); }),
            "chat template: No messages provided. (the message list is empty)");
  EXPECT_EQ(error_of([] {
              render_chat({sys("s"), asst("a")});
            }),
            "chat template: No user query found in messages. (no message has role user)");
  EXPECT_EQ(error_of([] { render_chat({sys("s")}); }),
            "chat template: No user query found in messages. (no message has role user)");
  EXPECT_EQ(error_of([] {
              render_chat({usr("<tool_response>a</tool_response>"), asst("b"),
                           usr("\n<tool_response></tool_response> ")});
            }),
            "chat template: No user query found in messages. (every user message is wrapped "
            "in <tool_response>…</tool_response>)");
  EXPECT_EQ(error_of([] {
              render_chat({usr("q"), sys("s")});
            }),
            "chat template: System message must be at the beginning. (messages[1] has role "
            "system)");
  EXPECT_EQ(error_of([] {
              render_chat({sys("s"), sys("t"), usr("q")});
            }),
            "chat template: System message must be at the beginning. (messages[1] has role "
            "system)");
  // The template looks for a query before it walks the messages.
  EXPECT_NE(error_of([] {
              render_chat({asst("a"), sys("s")});
            }).find("No user query"),
            std::string::npos);
}

TEST(ChatFormatErrors, RequestRules) {
  EXPECT_EQ(error_of([] { check_chat_request_messages({}); }), "messages must not be empty");
  EXPECT_EQ(error_of([] {
              check_chat_request_messages({usr("q"), asst("a")});
            }),
            "the final message must have role=user, found role=assistant");
  EXPECT_EQ(error_of([] { check_chat_request_messages({sys("s")}); }),
            "the final message must have role=user, found role=system");
  EXPECT_NO_THROW(check_chat_request_messages({sys("s"), usr("q")}));
  // render_chat itself follows the template: a trailing assistant turn renders.
  EXPECT_NO_THROW(render_chat({usr("q"), asst("a")}));
}

// render_content's branches (T8, T19, T30, T32), tested in the template's order.
TEST(ChatFormat, ContentPartKinds) {
  const auto kind = [](const char* part) {
    return template_content_part_kind(parse_strict_json(part, "part", 8));
  };
  EXPECT_EQ(kind(R"({"type":"text","text":"x"})"), ContentPartKind::text);
  EXPECT_EQ(kind(R"({"text":"x"})"), ContentPartKind::text);  // the type is not read
  EXPECT_EQ(kind(R"({"type":"input_audio","text":"x"})"), ContentPartKind::text);
  EXPECT_EQ(kind(R"({"type":"image_url","image_url":{"url":"u"}})"), ContentPartKind::image);
  EXPECT_EQ(kind(R"({"type":"image"})"), ContentPartKind::image);
  EXPECT_EQ(kind(R"({"image":"x.png"})"), ContentPartKind::image);
  // An image key wins over text and video; a video key over text.
  EXPECT_EQ(kind(R"({"type":"text","text":"x","image_url":"u"})"), ContentPartKind::image);
  EXPECT_EQ(kind(R"({"video":"v","image":"i"})"), ContentPartKind::image);
  EXPECT_EQ(kind(R"({"type":"text","text":"x","video":"v"})"), ContentPartKind::video);
  EXPECT_EQ(kind(R"({"type":"video"})"), ContentPartKind::video);
  // "type" compares as a string: a non-string type matches nothing.
  EXPECT_EQ(kind(R"({"type":["image"]})"), ContentPartKind::unexpected);
  EXPECT_EQ(kind(R"({"type":"input_audio","input_audio":{}})"), ContentPartKind::unexpected);
  EXPECT_EQ(kind(R"({"type":"refusal","refusal":"no"})"), ContentPartKind::unexpected);
  EXPECT_EQ(kind(R"({})"), ContentPartKind::unexpected);
}

}  // namespace
}  // namespace lily

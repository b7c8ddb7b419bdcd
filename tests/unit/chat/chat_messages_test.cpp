// Tests for the OpenAI-shaped chat input parser: accepted shapes, every error and its path.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/strict_json.h"
#include "text/chat_messages.h"

namespace lily {
namespace {

OrderedJson json(const char* text) {
  return parse_strict_ordered_json(text, "test", 32);
}

std::vector<ChatMessage> messages(const char* text) {
  return parse_openai_chat_messages(json(text));
}

struct Failure {
  std::string message;
  std::string param;
};

template <typename F>
Failure failure_of(F f) {
  try {
    f();
  } catch (const ChatInputError& e) {
    return {e.what(), e.param()};
  }
  ADD_FAILURE() << "expected a ChatInputError";
  return {};
}

Failure messages_error(const char* text) {
  return failure_of([&] { messages(text); });
}

Failure conversation_error(const char* text) {
  return failure_of([&] { parse_chat_conversation(json(text)); });
}

TEST(ChatMessages, RolesAndContents) {
  const std::vector<ChatMessage> m = messages(R"([
    {"role": "developer", "content": "D"},
    {"role": "system", "content": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]},
    {"role": "user", "content": "Q", "name": "alice"},
    {"role": "assistant", "content": null},
    {"role": "assistant"},
    {"role": "tool", "content": null, "tool_call_id": "call_1"},
    {"role": "tool", "content": [{"type": "text", "text": "r", "cache_control": {}}]}
  ])");
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m[0].role, ChatRole::system);
  EXPECT_EQ(m[0].content, "D");
  EXPECT_EQ(m[1].role, ChatRole::system);
  EXPECT_EQ(m[1].content, "S1S2");
  EXPECT_EQ(m[2].role, ChatRole::user);
  EXPECT_EQ(m[2].content, "Q");
  EXPECT_EQ(m[3].role, ChatRole::assistant);
  EXPECT_EQ(m[3].content, "");
  EXPECT_FALSE(m[3].reasoning_content.has_value());
  EXPECT_TRUE(m[3].tool_calls.empty());
  EXPECT_EQ(m[4].content, "");
  EXPECT_EQ(m[5].role, ChatRole::tool);
  EXPECT_EQ(m[5].content, "");
  EXPECT_EQ(m[5].tool_call_id, "call_1");
  EXPECT_EQ(m[6].content, "r");
  EXPECT_EQ(m[6].tool_call_id, "");
  EXPECT_TRUE(parse_openai_chat_messages(OrderedJson::array()).empty());
}

TEST(ChatMessages, ReasoningFields) {
  const std::vector<ChatMessage> m = messages(R"([
    {"role": "assistant", "content": "a", "reasoning_content": "rc"},
    {"role": "assistant", "content": "a", "reasoning": "r"},
    {"role": "assistant", "content": "a", "reasoning_content": "rc", "reasoning": "r"},
    {"role": "assistant", "content": "a", "reasoning_content": null, "reasoning": "r"},
    {"role": "assistant", "content": "a", "reasoning_content": null},
    {"role": "assistant", "content": "a", "reasoning_content": ""},
    {"role": "user", "content": "q", "reasoning_content": 5}
  ])");
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m[0].reasoning_content, std::optional<std::string>("rc"));
  EXPECT_EQ(m[1].reasoning_content, std::optional<std::string>("r"));
  EXPECT_EQ(m[2].reasoning_content, std::optional<std::string>("rc"));  // reasoning_content wins
  EXPECT_EQ(m[3].reasoning_content, std::optional<std::string>("r"));
  EXPECT_FALSE(m[4].reasoning_content.has_value());
  EXPECT_EQ(m[5].reasoning_content, std::optional<std::string>(""));
  EXPECT_FALSE(m[6].reasoning_content.has_value());  // not read for other roles
}

TEST(ChatMessages, ToolCalls) {
  const std::vector<ChatMessage> m =
      messages(R"([{"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_a", "type": "function",
     "function": {"name": "f", "arguments": "{\"b\": 1.0, \"a\": {\"y\": [true, null], \"x\": \"s\"}}"}},
    {"function": {"name": "g", "arguments": {"z": 1, "y": 2}}},
    {"id": null, "type": "function", "function": {"name": "h"}},
    {"type": "function", "function": {"name": "k", "arguments": " { } "}}
  ]}, {"role": "assistant", "content": "x", "tool_calls": null},
      {"role": "assistant", "content": "x", "tool_calls": []}])");
  ASSERT_EQ(m.size(), 3u);
  ASSERT_EQ(m[0].tool_calls.size(), 4u);
  const ChatToolCall& f = m[0].tool_calls[0];
  EXPECT_EQ(f.id, "call_a");
  EXPECT_EQ(f.name, "f");
  // Keys in the string's order, numbers as written (1.0 stays a float).
  EXPECT_EQ(f.arguments.dump(), R"({"b":1.0,"a":{"y":[true,null],"x":"s"}})");
  EXPECT_TRUE(f.arguments["b"].is_number_float());
  EXPECT_EQ(m[0].tool_calls[1].id, "");
  EXPECT_EQ(m[0].tool_calls[1].arguments.dump(), R"({"z":1,"y":2})");
  EXPECT_EQ(m[0].tool_calls[2].name, "h");
  EXPECT_EQ(m[0].tool_calls[2].arguments, OrderedJson::object());
  EXPECT_EQ(m[0].tool_calls[3].arguments, OrderedJson::object());
  EXPECT_TRUE(m[1].tool_calls.empty());
  EXPECT_TRUE(m[2].tool_calls.empty());
}

TEST(ChatMessagesErrors, MessageShape) {
  Failure f = messages_error(R"({"role": "user"})");
  EXPECT_EQ(f.message,
            "messages must be a JSON array of message objects, found object {\"role\":\"user\"}");
  EXPECT_EQ(f.param, "messages");
  f = messages_error(R"([{"role": "user", "content": "q"}, "hi"])");
  EXPECT_EQ(f.message,
            "messages[1] must be an object {\"role\", \"content\", ...}, found string \"hi\"");
  EXPECT_EQ(f.param, "messages[1]");
  f = messages_error(R"([{"content": "q"}])");
  EXPECT_EQ(f.message, "messages[0]: missing field \"role\"");
  EXPECT_EQ(f.param, "messages[0].role");
  f = messages_error(R"([{"role": "function", "content": "q"}])");
  EXPECT_EQ(f.message,
            "messages[0].role must be \"system\", \"developer\", \"user\", \"assistant\" or "
            "\"tool\", found string \"function\"");
  EXPECT_EQ(f.param, "messages[0].role");
  EXPECT_EQ(messages_error(R"([{"role": "User", "content": "q"}])").param, "messages[0].role");
  EXPECT_EQ(messages_error(R"([{"role": null, "content": "q"}])").param, "messages[0].role");
}

TEST(ChatMessagesErrors, Content) {
  Failure f = messages_error(R"([{"role": "user"}])");
  EXPECT_EQ(f.message, "messages[0]: missing field \"content\"");
  EXPECT_EQ(f.param, "messages[0].content");
  f = messages_error(R"([{"role": "system", "content": null}])");
  EXPECT_EQ(f.message,
            "messages[0].content must be a string or an array of text parts, found null");
  f = messages_error(R"([{"role": "user", "content": 3}])");
  EXPECT_EQ(f.message,
            "messages[0].content must be a string or an array of text parts, found number 3");
  f = messages_error(R"([{"role": "tool", "content": {}}])");
  EXPECT_EQ(f.message,
            "messages[0].content must be a string or an array of text parts (or null), found "
            "object {}");
  f = messages_error(
      R"([{"role": "user", "content": [{"type": "text", "text": "a"},
          {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}])");
  EXPECT_EQ(f.message, "messages[0].content[1]: image inputs are not supported");
  EXPECT_EQ(f.param, "messages[0].content[1]");
  EXPECT_EQ(messages_error(R"([{"role": "user", "content": [{"type": "input_audio"}]}])").message,
            "messages[0].content[0]: audio inputs are not supported");
  EXPECT_EQ(messages_error(R"([{"role": "user", "content": [{"type": "video_url"}]}])").message,
            "messages[0].content[0]: video inputs are not supported");
  EXPECT_EQ(messages_error(R"([{"role": "user", "content": [{"type": "file"}]}])").message,
            "messages[0].content[0]: file inputs are not supported");
  // The template renders a text part with an image key as an image (T8).
  EXPECT_EQ(
      messages_error(
          R"([{"role": "user", "content": [{"type": "text", "text": "a", "image_url": "u"}]}])")
          .message,
      "messages[0].content[0]: image inputs are not supported");
  f = messages_error(R"([{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}])");
  EXPECT_EQ(f.message,
            "messages[0].content[0].type must be \"text\" (image, audio, video and file parts are "
            "not supported), found string \"refusal\"");
  EXPECT_EQ(f.param, "messages[0].content[0].type");
  f = messages_error(R"([{"role": "user", "content": [{"text": "a"}]}])");
  EXPECT_EQ(f.message, "messages[0].content[0]: missing field \"type\"");
  f = messages_error(R"([{"role": "user", "content": [{"type": "text", "text": 1}]}])");
  EXPECT_EQ(f.message, "messages[0].content[0].text must be a string, found number 1");
  EXPECT_EQ(f.param, "messages[0].content[0].text");
  f = messages_error(R"([{"role": "user", "content": ["a"]}])");
  EXPECT_EQ(f.message,
            "messages[0].content[0] must be a content part object {\"type\": \"text\", \"text\": "
            "...}, found string \"a\"");
}

TEST(ChatMessagesErrors, ReasoningAndToolCallId) {
  Failure f = messages_error(R"([{"role": "assistant", "content": "", "reasoning_content": 1}])");
  EXPECT_EQ(f.message, "messages[0].reasoning_content must be a string or null, found number 1");
  EXPECT_EQ(f.param, "messages[0].reasoning_content");
  f = messages_error(R"([{"role": "assistant", "content": "", "reasoning": ["r"]}])");
  EXPECT_EQ(f.message, "messages[0].reasoning must be a string or null, found array [\"r\"]");
  f = messages_error(R"([{"role": "tool", "content": "r", "tool_call_id": 7}])");
  EXPECT_EQ(f.message, "messages[0].tool_call_id must be a string, found number 7");
  EXPECT_EQ(f.param, "messages[0].tool_call_id");
}

TEST(ChatMessagesErrors, ToolCalls) {
  const auto call_error = [](const char* calls) {
    const std::string text = std::string(R"([{"role": "user", "content": "q"},
        {"role": "assistant", "content": null, "tool_calls": )") +
                             calls + "}]";
    return messages_error(text.c_str());
  };
  Failure f = call_error(R"({"id": "x"})");
  EXPECT_EQ(f.message,
            "messages[1].tool_calls must be an array of tool calls, found object {\"id\":\"x\"}");
  EXPECT_EQ(f.param, "messages[1].tool_calls");
  f = call_error(R"(["f"])");
  EXPECT_EQ(f.message,
            "messages[1].tool_calls[0] must be an object {\"id\", \"type\": \"function\", "
            "\"function\"}, found string \"f\"");
  f = call_error(R"([{"type": "custom", "function": {"name": "f"}}])");
  EXPECT_EQ(f.message,
            "messages[1].tool_calls[0].type must be \"function\", found string \"custom\"");
  EXPECT_EQ(f.param, "messages[1].tool_calls[0].type");
  f = call_error(R"([{"id": "c", "type": "function"}])");
  EXPECT_EQ(f.message, "messages[1].tool_calls[0]: missing field \"function\"");
  EXPECT_EQ(f.param, "messages[1].tool_calls[0].function");
  f = call_error(R"([{"id": 1, "function": {"name": "f"}}])");
  EXPECT_EQ(f.message, "messages[1].tool_calls[0].id must be a string, found number 1");
  f = call_error(R"([{"function": "f"}])");
  EXPECT_EQ(f.message,
            "messages[1].tool_calls[0].function must be an object {\"name\", \"arguments\"}, "
            "found string \"f\"");
  f = call_error(R"([{"function": {"arguments": "{}"}}])");
  EXPECT_EQ(f.message, "messages[1].tool_calls[0].function: missing field \"name\"");
  EXPECT_EQ(f.param, "messages[1].tool_calls[0].function.name");
  f = call_error(R"([{"function": {"name": ""}}])");
  EXPECT_EQ(
      f.message,
      "messages[1].tool_calls[0].function.name must be a non-empty string, found string \"\"");
  f = call_error(
      R"([{"function": {"name": "f"}}, {"function": {"name": "g", "arguments": "{\"a\": }"}}])");
  EXPECT_EQ(f.param, "messages[1].tool_calls[1].function.arguments");
  EXPECT_EQ(f.message.rfind("messages[1].tool_calls[1].function.arguments: not valid JSON: ", 0),
            0u)
      << f.message;
  EXPECT_NE(f.message.find("(expected a JSON object encoded as a string)"), std::string::npos);
  f = call_error(R"([{"function": {"name": "g", "arguments": "[1, 2]"}}])");
  EXPECT_EQ(
      f.message,
      "messages[1].tool_calls[0].function.arguments must encode a JSON object, found array [1,2]");
  EXPECT_EQ(f.param, "messages[1].tool_calls[0].function.arguments");
  f = call_error(R"([{"function": {"name": "g", "arguments": "{\"a\": 1, \"a\": 2}"}}])");
  EXPECT_EQ(f.message,
            "messages[1].tool_calls[0].function.arguments: duplicate key \"a\" (expected a JSON "
            "object encoded as a string)");
  f = call_error(R"([{"function": {"name": "g", "arguments": ""}}])");
  EXPECT_EQ(f.message.rfind("messages[1].tool_calls[0].function.arguments: not valid JSON", 0), 0u);
  f = call_error(R"([{"function": {"name": "g", "arguments": 5}}])");
  EXPECT_EQ(f.message,
            "messages[1].tool_calls[0].function.arguments must be a JSON object encoded as a "
            "string, found number 5");
  f = call_error(R"([{"function": {"name": "g", "arguments": null}}])");
  EXPECT_EQ(f.message,
            "messages[1].tool_calls[0].function.arguments must be a JSON object encoded as a "
            "string, found null");
}

TEST(ChatConversation, Fields) {
  const ChatConversation c = parse_chat_conversation(json(R"({
    "model": "ignored", "max_tokens": 5,
    "messages": [{"role": "user", "content": "q"}],
    "tools": [{"function": {"name": "f", "parameters": {"type": "object"}}, "type": "function"},
              {"type": "function", "function": {"name": "g"}}],
    "chat_template_kwargs": {"enable_thinking": true, "preserve_thinking": false, "other": 1}
  })"));
  ASSERT_EQ(c.messages.size(), 1u);
  ASSERT_EQ(c.tools.size(), 2u);
  EXPECT_EQ(c.tools[0].dump(),
            R"({"function":{"name":"f","parameters":{"type":"object"}},"type":"function"})");
  EXPECT_TRUE(c.options.enable_thinking);
  EXPECT_FALSE(c.options.preserve_thinking);
  const ChatConversation d = parse_chat_conversation(json(
      R"({"messages": [], "tools": null, "chat_template_kwargs": {"enable_thinking": null, "preserve_thinking": true}})"));
  EXPECT_TRUE(d.tools.empty());
  EXPECT_FALSE(d.options.enable_thinking);
  EXPECT_TRUE(d.options.preserve_thinking);
  const ChatConversation e = parse_chat_conversation(json(R"({"messages": [], "tools": []})"));
  EXPECT_TRUE(e.tools.empty());
  EXPECT_FALSE(e.options.enable_thinking);
}

TEST(ChatConversationErrors, Fields) {
  Failure f = failure_of([] { parse_chat_conversation(OrderedJson::array()); });
  EXPECT_EQ(f.message,
            "a conversation must be a JSON object {\"messages\", \"tools\", "
            "\"chat_template_kwargs\"}, found array []");
  f = conversation_error(R"({"role": "user", "content": "x"})");
  EXPECT_EQ(f.message,
            "missing field \"messages\" (a conversation is an object {\"messages\": [...], "
            "\"tools\": [...], \"chat_template_kwargs\": {...}})");
  EXPECT_EQ(f.param, "messages");
  f = conversation_error(R"({"messages": [], "tools": {"type": "function"}})");
  EXPECT_EQ(f.message,
            "tools must be an array of {\"type\": \"function\", \"function\": {...}} objects, "
            "found object {\"type\":\"function\"}");
  EXPECT_EQ(f.param, "tools");
  f = conversation_error(R"({"messages": [], "tools": ["f"]})");
  EXPECT_EQ(f.message,
            "tools[0] must be an object {\"type\": \"function\", \"function\": {...}}, found "
            "string \"f\"");
  f = conversation_error(R"({"messages": [], "tools": [{"type": "code_interpreter"}]})");
  EXPECT_EQ(f.message, "tools[0].type must be \"function\", found string \"code_interpreter\"");
  EXPECT_EQ(f.param, "tools[0].type");
  f = conversation_error(R"({"messages": [], "tools": [{"type": "function"}]})");
  EXPECT_EQ(f.message, "tools[0]: missing field \"function\"");
  EXPECT_EQ(f.param, "tools[0].function");
  f = conversation_error(R"({"messages": [], "tools": [{"function": []}]})");
  EXPECT_EQ(f.message,
            "tools[0].function must be an object {\"name\", \"description\", \"parameters\"}, "
            "found array []");
  f = conversation_error(
      R"({"messages": [], "tools": [{"function": {"name": "a"}}, {"function": {}}]})");
  EXPECT_EQ(f.message, "tools[1].function: missing field \"name\"");
  EXPECT_EQ(f.param, "tools[1].function.name");
  f = conversation_error(R"({"messages": [], "tools": [{"function": {"name": 3}}]})");
  EXPECT_EQ(f.message, "tools[0].function.name must be a non-empty string, found number 3");
  f = conversation_error(R"({"messages": [], "chat_template_kwargs": []})");
  EXPECT_EQ(f.message, "chat_template_kwargs must be an object, found array []");
  EXPECT_EQ(f.param, "chat_template_kwargs");
  f = conversation_error(R"({"messages": [], "chat_template_kwargs": {"enable_thinking": "yes"}})");
  EXPECT_EQ(
      f.message,
      "chat_template_kwargs.enable_thinking must be true, false or null, found string \"yes\"");
  EXPECT_EQ(f.param, "chat_template_kwargs.enable_thinking");
  f = conversation_error(R"({"messages": [], "chat_template_kwargs": {"preserve_thinking": 1}})");
  EXPECT_EQ(f.param, "chat_template_kwargs.preserve_thinking");
  f = conversation_error(R"({"messages": {"role": "user"}})");
  EXPECT_EQ(f.param, "messages");
  // A ChatInputError is an InputError (the CLI and the server's generic paths catch that).
  EXPECT_THROW(parse_chat_conversation(json("{}")), InputError);
}

}  // namespace
}  // namespace lily

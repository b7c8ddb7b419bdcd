// Parsing OpenAI-shaped chat input (messages, tools, chat_template_kwargs) into chat types.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
#include "core/strict_json.h"
#include "text/chat_format.h"

namespace lily {

// A bad field of OpenAI-shaped chat input. The message names the field by its JSON path and
// says what was expected and found; param() is that path alone
// ("messages[2].tool_calls[0].function.arguments"), for the API error's `param`.
class ChatInputError : public InputError {
 public:
  ChatInputError(std::string message, std::string param);
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

// One render request: what `lily render-chat` reads from an object line.
struct ChatConversation {
  std::vector<ChatMessage> messages;
  std::vector<OrderedJson> tools;  // the `tools` elements as sent (rendered with tojson)
  ChatPromptOptions options;
};

// OpenAI chat messages. Roles system, developer (parsed as system), user, assistant, tool.
// `content`: a string, an array of text parts ({"type": "text", "text": "..."}, concatenated),
// or null/absent for assistant and tool messages (""). Image, audio, video and file parts are
// refused ("<path>: image inputs are not supported"). Assistant: `tool_calls`
// ([{id, type "function", function {name, arguments}}]; arguments a JSON string holding an
// object, or an object; absent = {}), `reasoning_content` or `reasoning` (string or null;
// reasoning_content wins when both are strings). Tool: `tool_call_id`. Every other key
// (name, refusal, annotations, ...) is ignored. Throws ChatInputError.
std::vector<ChatMessage> parse_openai_chat_messages(const OrderedJson& messages);

// An OpenAI `tools` array: every element an object {"type": "function" (if given),
// "function": {"name": non-empty string, ...}}, kept exactly as sent. Throws ChatInputError.
std::vector<OrderedJson> parse_chat_tools(const OrderedJson& tools);

// `chat_template_kwargs`: enable_thinking and preserve_thinking, each true, false or null
// (= false); other keys are ignored (the template reads no other variable that can change the
// prompt without images). Throws ChatInputError.
ChatPromptOptions parse_chat_template_kwargs(const OrderedJson& kwargs);

// {"messages": [...], "tools": [...], "chat_template_kwargs": {...}}; tools and
// chat_template_kwargs may be absent or null; other keys are ignored (a whole chat-completions
// request body is a valid conversation). Throws ChatInputError.
ChatConversation parse_chat_conversation(const OrderedJson& object);

}  // namespace lily

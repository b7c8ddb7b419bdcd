// Native chat format: the checkpoint chat template (tools, reasoning) plus Lily's nothink rewrite.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/strict_json.h"

namespace lily {

// The closed, empty reasoning block. The generation prompt ends with it (thinking disabled),
// and the history rewrite writes it into earlier assistant turns.
inline constexpr std::string_view kEmptyThinkBlock = "<think>\n\n</think>\n\n";

// The roles the template renders. OpenAI's "developer" is parsed as system.
enum class ChatRole { system, user, assistant, tool };

// "system", "user", "assistant" or "tool".
std::string_view chat_role_name(ChatRole role);

// One call of an assistant turn. Every member has a default initializer so that aggregate
// initialization may leave trailing members out (-Wmissing-field-initializers).
struct ChatToolCall {
  std::string id = {};    // as sent (the template does not render it)
  std::string name = {};  // function.name
  // The JSON object that function.arguments (a JSON string on the wire) encodes, keys in the
  // client's order: the template renders them in that order (T120).
  OrderedJson arguments = OrderedJson::object();
};

// One message as the template sees it.
struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content = {};  // text parts concatenated; null or absent content is "" (T36-37)
  // assistant: `reasoning_content` (or OpenAI-compatible `reasoning`); nullopt is Jinja's
  // undefined, so the template splits a `</think>` out of the content instead (T91-97).
  std::optional<std::string> reasoning_content = std::nullopt;
  std::vector<ChatToolCall> tool_calls = {};  // assistant
  std::string tool_call_id = {};              // tool (the template does not render it)
};

// The name the no-tools renderer used for a message after the history rewrite; it is now the
// same type.
using TemplateMessage = ChatMessage;

// What a request chooses about the prompt (chat_template_kwargs).
struct ChatPromptOptions {
  bool enable_thinking = false;
  bool preserve_thinking = false;
};

// The template variables render_chat_template sets.
struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = false;    // false: `enable_thinking=false` (the generation prompt closes
                                   // an empty think block); true: left undefined (T149)
  bool preserve_thinking = false;  // true: `preserve_thinking=true` (T100); false: undefined
};

// Parses a JSON `messages` array in Lily's strict shape: every element an object with exactly
// the fields "role" (one of "system", "user", "assistant") and "content" (a string). An empty
// array is accepted here (the template, and check_chat_request_messages, reject it).
// `where` prefixes error messages ("messages" gives "messages[2].role: ..."). Throws InputError.
// (OpenAI-shaped input: text/chat_messages.h.)
std::vector<ChatMessage> parse_chat_messages(const Json& messages, std::string_view where);

// How the template's render_content macro (T3-41) treats one element of an array `content`,
// tested in the template's order: an image (T8: key "image" or "image_url", or "type" equal to
// "image"; rendered as an image pad), a video (T19: key "video" or "type" "video"), text
// (T30-31: key "text"; renders `item.text`), or none of these (T32-33 raises "Unexpected item
// type in content."). `part` must be a JSON object. The HTTP API's openai mode renders an
// array content as the concatenation of its text parts' `text` and refuses the rest.
enum class ContentPartKind { image, video, text, unexpected };
ContentPartKind template_content_part_kind(const Json& part);

// The media an OpenAI content part's `type` names: "image" (image_url, image, input_image),
// "audio" (input_audio, audio), "video" (video_url, video, input_video), "file" (file,
// input_file); "" for any other type. Such parts are refused by name ("image inputs are not
// supported"): the server serves text only.
std::string_view media_part_kind(std::string_view type);
ContentPartKind template_content_part_kind(const OrderedJson& part);

// The HTTP API's extra rules (Lily's validation steps 4–5 in docs/api.md, widened for agent
// loops): at least one message, and the last one has role user or tool (a tool result continues
// the assistant's turn). render-chat does not apply them. Throws InputError.
void check_chat_request_messages(const std::vector<ChatMessage>& messages);

// Lily's nothink history rewrite (docs/chat-format.md §3): every assistant message whose index is
// at most the index of the last user message gets `content` prefixed with kEmptyThinkBlock
// (unless it already starts with exactly that) and `reasoning_content` = "". Others pass
// unchanged. Tool calls and every other field are kept.
std::vector<ChatMessage> nothink_history_rewrite(const std::vector<ChatMessage>& messages);

// Exactly what the checkpoint template (qwen3.6-chat_template.jinja, copied to tests/fixtures/)
// renders under Python Jinja2 as transformers' apply_chat_template runs it, for these messages
// and tools (`tools` empty: no tools block; each element is rendered with `tojson`, i.e.
// python_json_dumps), add_vision_id undefined. Template-raised errors ("No messages provided.",
// "No user query found in messages.", "System message must be at the beginning.") throw
// InputError("chat template: <that text> (<context>)"). docs/chat-format.md has the rules.
std::string render_chat_template(const std::vector<ChatMessage>& messages,
                                 const std::vector<OrderedJson>& tools,
                                 const ChatTemplateOptions& options);
std::string render_chat_template(const std::vector<ChatMessage>& messages,
                                 const ChatTemplateOptions& options);

// The prompt Lily sends to the model, generation prompt included. Thinking disabled: the
// history rewrite, then the template with enable_thinking=false. Thinking enabled: the
// template exactly as the checkpoint's Jinja renders the messages (no rewrite),
// enable_thinking undefined. preserve_thinking is passed to the template when set. `tools`:
// the request's OpenAI tools array elements, rendered with `tojson`. Throws InputError.
std::string render_chat(const std::vector<ChatMessage>& messages,
                        const std::vector<OrderedJson>& tools = {},
                        const ChatPromptOptions& options = {});

// The generation prompt that render_chat ends with: "<|im_start|>assistant\n<think>\n"
// (thinking enabled) or "<|im_start|>assistant\n<think>\n\n</think>\n\n" (disabled).
std::string_view chat_generation_prompt(bool enable_thinking);

// Python's str.strip() / Jinja2's `trim` filter over UTF-8: removes leading and trailing
// code points that Python's str.isspace() accepts (see docs/chat-format.md). Bytes that are
// not valid UTF-8 count as non-whitespace.
std::string python_strip(std::string_view text);

}  // namespace lily

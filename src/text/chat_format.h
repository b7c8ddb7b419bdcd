// Native chat format: the checkpoint chat template (no tools) plus Lily's nothink history rewrite.
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

enum class ChatRole { system, user, assistant };

// "system", "user" or "assistant".
std::string_view chat_role_name(ChatRole role);

// One message as a client sends it: exactly {role, content}, content a plain string.
struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content;
};

// One message as the template sees it: a client message after the history rewrite, which
// may carry a `reasoning_content` string (absent = Jinja `undefined`).
struct TemplateMessage {
  ChatRole role = ChatRole::user;
  std::string content;
  std::optional<std::string> reasoning_content;
};

// The template variables that can vary without tools.
struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = false;  // false: the generation prompt closes an empty think block
};

// Parses a JSON `messages` array in Lily's strict shape: every element an object with exactly
// the fields "role" (one of "system", "user", "assistant") and "content" (a string). An empty
// array is accepted here (the template, and check_chat_request_messages, reject it).
// `where` prefixes error messages ("messages" gives "messages[2].role: ..."). Throws InputError.
std::vector<ChatMessage> parse_chat_messages(const Json& messages, std::string_view where);

// How the template's render_content macro (T3-41) treats one element of an array `content`,
// tested in the template's order: an image (T8: key "image" or "image_url", or "type" equal to
// "image"; rendered as an image pad), a video (T19: key "video" or "type" "video"), text
// (T30-31: key "text"; renders `item.text`), or none of these (T32-33 raises "Unexpected item
// type in content."). `part` must be a JSON object. The HTTP API's openai mode renders an
// array content as the concatenation of its text parts' `text` and refuses the rest.
enum class ContentPartKind { image, video, text, unexpected };
ContentPartKind template_content_part_kind(const Json& part);

// The HTTP API's extra rules (lily-reference §6.3 steps 4–5): at least one message, and the
// last one has role user. render-chat does not apply them. Throws InputError.
void check_chat_request_messages(const std::vector<ChatMessage>& messages);

// Lily's nothink history rewrite (lily-reference §5): every assistant message whose index is
// at most the index of the last user message gets `content` prefixed with kEmptyThinkBlock
// (unless it already starts with exactly that) and `reasoning_content` = "". Others pass
// unchanged, without reasoning_content.
std::vector<TemplateMessage> nothink_history_rewrite(const std::vector<ChatMessage>& messages);

// Exactly what the checkpoint template (../shared/fixtures/qwen3.6-chat_template.jinja, copied to tests/fixtures/ for the tests) renders
// under Python Jinja2 for these messages, with tools empty and preserve_thinking and
// add_vision_id undefined. Template-raised errors ("No messages provided.", "No user query
// found in messages.", "System message must be at the beginning.") throw
// InputError("chat template: <that text> (<context>)"). docs/chat-format.md has the rules.
std::string render_chat_template(const std::vector<TemplateMessage>& messages,
                                 const ChatTemplateOptions& options);

// The prompt Lily sends to the model: the history rewrite, then the template with the
// generation prompt added and thinking disabled. Throws InputError.
std::string render_chat(const std::vector<ChatMessage>& messages);

// Python's str.strip() / Jinja2's `trim` filter over UTF-8: removes leading and trailing
// code points that Python's str.isspace() accepts (see docs/chat-format.md). Bytes that are
// not valid UTF-8 count as non-whitespace.
std::string python_strip(std::string_view text);

}  // namespace lily

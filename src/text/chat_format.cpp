// Native chat format: the checkpoint chat template (tools, reasoning) plus Lily's nothink rewrite.
//
// Every rule below names the lines of qwen3.6-chat_template.jinja it mirrors ("T<n>" =
// line n of that file); docs/chat-format.md explains them one by one.
#include "text/chat_format.h"

#include <cstdint>

#include "core/error.h"
#include "text/python_json.h"

namespace lily {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolResponseOpen = "<tool_response>";
constexpr std::string_view kToolResponseClose = "</tool_response>";

// T47 and T53: the text around the tool list in the tools system block.
constexpr std::string_view kToolsHeader =
    "# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kToolsInstructions =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>";

// Python's str.isspace() (bidirectional class WS, B or S, or category Zs), which is what
// Jinja2's `trim` filter (str.strip) removes. Stable since Unicode 6.3.
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Decodes the well-formed UTF-8 sequence at text[pos]; returns its length, or 0 if the bytes
// there are not one (then the caller treats them as non-whitespace).
size_t decode_utf8(std::string_view text, size_t pos, uint32_t& cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  size_t length = 0;
  uint32_t min = 0;
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    length = 2, cp = b0 & 0x1Fu, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3, cp = b0 & 0x0Fu, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4, cp = b0 & 0x07u, min = 0x10000;
  } else {
    return 0;
  }
  if (pos + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i) {
    const uint8_t b = byte(pos + i);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return length;
}

// Python str.lstrip(chars) / str.rstrip(chars) with a single ASCII character.
std::string_view lstrip_char(std::string_view text, char c) {
  const size_t first = text.find_first_not_of(c);
  return first == std::string_view::npos ? std::string_view() : text.substr(first);
}

std::string_view rstrip_char(std::string_view text, char c) {
  const size_t last = text.find_last_not_of(c);
  return last == std::string_view::npos ? std::string_view() : text.substr(0, last + 1);
}

// Python text.split(sep)[0] and text.split(sep)[-1].
std::string_view split_first(std::string_view text, std::string_view sep) {
  return text.substr(0, text.find(sep));
}

std::string_view split_last(std::string_view text, std::string_view sep) {
  const size_t at = text.rfind(sep);
  return at == std::string_view::npos ? text : text.substr(at + sep.size());
}

[[noreturn]] void template_error(std::string_view raised, const std::string& context) {
  std::string message = "chat template: ";
  message += raised;
  if (!context.empty()) message += " (" + context + ")";
  throw InputError(message);
}

}  // namespace

std::string_view chat_role_name(ChatRole role) {
  switch (role) {
    case ChatRole::system:
      return "system";
    case ChatRole::user:
      return "user";
    case ChatRole::assistant:
      return "assistant";
    case ChatRole::tool:
      return "tool";
  }
  return "unknown";
}

std::string python_strip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    uint32_t cp = 0;
    const size_t length = decode_utf8(text, begin, cp);
    if (length == 0 || !is_python_space(cp)) break;
    begin += length;
  }
  size_t end = text.size();
  while (end > begin) {
    // Step back to the lead byte of the last sequence (at most 3 continuation bytes).
    size_t start = end - 1;
    while (start > begin && end - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) {
      --start;
    }
    uint32_t cp = 0;
    const size_t length = decode_utf8(text, start, cp);
    if (length == 0 || start + length != end || !is_python_space(cp)) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

std::vector<ChatMessage> parse_chat_messages(const Json& messages, std::string_view where) {
  const std::string base(where);
  if (!messages.is_array()) {
    throw InputError(base + " must be a JSON array of {\"role\", \"content\"} objects, found " +
                     describe_json(messages));
  }
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& item = messages[i];
    const std::string at = base + "[" + std::to_string(i) + "]";
    if (!item.is_object()) {
      throw InputError(at + " must be an object {\"role\", \"content\"}, found " +
                       describe_json(item));
    }
    for (const auto& [key, value] : item.items()) {
      if (key != "role" && key != "content") {
        throw InputError(at + ": unknown field \"" + key +
                         "\"; a message has exactly the fields \"role\" and \"content\"");
      }
    }
    const auto role_it = item.find("role");
    if (role_it == item.end()) throw InputError(at + ": missing field \"role\"");
    ChatMessage message;
    const Json& role = *role_it;
    if (role == "system") {
      message.role = ChatRole::system;
    } else if (role == "user") {
      message.role = ChatRole::user;
    } else if (role == "assistant") {
      message.role = ChatRole::assistant;
    } else {
      throw InputError(at + ".role must be \"system\", \"user\" or \"assistant\", found " +
                       describe_json(role));
    }
    const auto content_it = item.find("content");
    if (content_it == item.end()) throw InputError(at + ": missing field \"content\"");
    if (!content_it->is_string()) {
      throw InputError(at + ".content must be a string, found " + describe_json(*content_it));
    }
    message.content = content_it->get<std::string>();
    out.push_back(std::move(message));
  }
  return out;
}

namespace {

template <typename J>
ContentPartKind content_part_kind(const J& part) {
  // `'k' in item` on a mapping tests for the key; `item.type == 'x'` is false unless "type"
  // holds exactly that string.
  const auto type_is = [&](std::string_view type) {
    const auto it = part.find("type");
    return it != part.end() && it->is_string() &&
           it->template get_ref<const std::string&>() == type;
  };
  if (part.contains("image") || part.contains("image_url") || type_is("image")) {  // T8
    return ContentPartKind::image;
  }
  if (part.contains("video") || type_is("video")) return ContentPartKind::video;  // T19
  if (part.contains("text")) return ContentPartKind::text;                        // T30
  return ContentPartKind::unexpected;                                             // T32-33
}

}  // namespace

ContentPartKind template_content_part_kind(const Json& part) {
  return content_part_kind(part);
}

ContentPartKind template_content_part_kind(const OrderedJson& part) {
  return content_part_kind(part);
}

void check_chat_request_messages(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) throw InputError("messages must not be empty");
  if (messages.back().role != ChatRole::user && messages.back().role != ChatRole::tool) {
    throw InputError("the final message must have role=user, found role=" +
                     std::string(chat_role_name(messages.back().role)));
  }
}

std::vector<ChatMessage> nothink_history_rewrite(const std::vector<ChatMessage>& messages) {
  // The index of the last message with role user, whatever its content (Lily's
  // last_query_index() is rposition(role == User), not the template's notion).
  std::optional<size_t> last_user;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == ChatRole::user) last_user = i;
  }
  std::vector<ChatMessage> out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    ChatMessage& m = out[i];
    if (m.role == ChatRole::assistant && last_user && i <= *last_user) {
      if (!std::string_view(m.content).starts_with(kEmptyThinkBlock)) {
        m.content.insert(0, kEmptyThinkBlock);
      }
      m.reasoning_content = std::string();
    }
  }
  return out;
}

namespace {

// T105-128: the calls of one assistant turn. `content` is the turn's content after the
// reasoning split (T96): the first call is set off by a blank line only when it is non-blank.
void render_tool_calls(std::string& out, const ChatMessage& m, const std::string& content,
                       size_t index) {
  // T105: an empty list renders nothing.
  for (size_t j = 0; j < m.tool_calls.size(); ++j) {
    const ChatToolCall& call = m.tool_calls[j];
    // T107-108: the template reads `function.name` / `function.arguments`.
    if (j == 0) {
      out += python_strip(content).empty() ? "<tool_call>\n<function="
                                           : "\n\n<tool_call>\n<function=";  // T110-115
    } else {
      out += "\n<tool_call>\n<function=";  // T117
    }
    out += call.name;
    out += ">\n";
    // T119-126: `arguments|items` raises on anything but a mapping (Jinja2's do_items).
    if (!call.arguments.is_object()) {
      template_error("Can only get item pairs from a mapping.",
                     "messages[" + std::to_string(index) + "].tool_calls[" + std::to_string(j) +
                         "].function.arguments is " + describe_json(call.arguments) +
                         ", expected an object");
    }
    for (const auto& [name, value] : call.arguments.items()) {
      out += "<parameter=";
      out += name;
      out += ">\n";
      // T122: strings raw (`| string`), everything else `| tojson`.
      if (value.is_string()) {
        out += value.get_ref<const std::string&>();
      } else {
        append_python_json(out, value);
      }
      out += "\n</parameter>\n";
    }
    out += "</function>\n</tool_call>";  // T127
  }
}

}  // namespace

std::string render_chat_template(const std::vector<ChatMessage>& messages,
                                 const std::vector<OrderedJson>& tools,
                                 const ChatTemplateOptions& options) {
  // T42-44: `if not messages` raises.
  if (messages.empty()) template_error("No messages provided.", "the message list is empty");
  std::string out;
  // T3-41: a string content renders as itself (array contents arrive here concatenated).
  if (!tools.empty()) {
    // T45-60: a non-empty tools list opens the system turn with the tools, one `tojson` per
    // line, the calling instructions, then a leading system message's trimmed content after a
    // blank line (nothing when it trims to empty).
    out += "<|im_start|>system\n";
    out += kToolsHeader;
    for (const OrderedJson& tool : tools) {
      out += "\n";
      append_python_json(out, tool);
    }
    out += "\n</tools>";
    out += kToolsInstructions;
    if (messages[0].role == ChatRole::system) {
      const std::string content = python_strip(messages[0].content);
      if (!content.empty()) {
        out += "\n\n";
        out += content;
      }
    }
    out += "<|im_end|>\n";
  } else if (messages[0].role == ChatRole::system) {
    // T61-66: without tools, a leading system message is rendered (trimmed) on its own.
    out += "<|im_start|>system\n";
    out += python_strip(messages[0].content);
    out += "<|im_end|>\n";
  }
  // T67-77: walking backwards, the last user message whose trimmed content is not wrapped in
  // <tool_response>…</tool_response> is the last query (tool messages never are); with none,
  // the template raises (T78-80).
  bool multi_step_tool = true;
  size_t last_query_index = messages.size() - 1;
  size_t user_messages = 0;
  for (size_t k = messages.size(); k-- > 0;) {
    if (messages[k].role != ChatRole::user) continue;
    ++user_messages;
    if (!multi_step_tool) continue;
    const std::string content = python_strip(messages[k].content);
    const std::string_view c(content);
    if (!(c.starts_with(kToolResponseOpen) && c.ends_with(kToolResponseClose))) {
      multi_step_tool = false;
      last_query_index = k;
    }
  }
  if (multi_step_tool) {
    template_error("No user query found in messages.",
                   user_messages == 0
                       ? "no message has role user"
                       : "every user message is wrapped in <tool_response>…</tool_response>");
  }
  // T81-146: the messages in order.
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string content = python_strip(m.content);  // T82
    switch (m.role) {
      case ChatRole::system:
        // T83-86: a system message anywhere but first raises; the first was rendered above.
        if (i != 0) {
          template_error("System message must be at the beginning.",
                         "messages[" + std::to_string(i) + "] has role system");
        }
        break;
      case ChatRole::user:
        // T87-88.
        out += "<|im_start|>user\n";
        out += content;
        out += "<|im_end|>\n";
        break;
      case ChatRole::assistant: {
        // T89-99: reasoning from reasoning_content if it is a string, else split out of the
        // (trimmed) content at </think>; then trimmed.
        std::string reasoning;
        if (m.reasoning_content) {
          reasoning = *m.reasoning_content;
        } else if (content.find(kThinkClose) != std::string::npos) {
          const std::string_view c(content);
          reasoning = std::string(lstrip_char(
              split_last(rstrip_char(split_first(c, kThinkClose), '\n'), kThinkOpen), '\n'));
          content = std::string(lstrip_char(split_last(c, kThinkClose), '\n'));
        }
        reasoning = python_strip(reasoning);
        // T100-104: turns after the last query, or every turn with preserve_thinking, keep a
        // think block; the others are bare.
        if (options.preserve_thinking || i > last_query_index) {
          out += "<|im_start|>assistant\n<think>\n";
          out += reasoning;
          out += "\n</think>\n\n";
          out += content;
        } else {
          out += "<|im_start|>assistant\n";
          out += content;
        }
        render_tool_calls(out, m, content, i);  // T105-129
        out += "<|im_end|>\n";                  // T130
        break;
      }
      case ChatRole::tool:
        // T131-142: consecutive tool messages share one user turn. `loop.previtem` is
        // undefined for the first message, so a leading tool message opens no turn.
        if (i > 0 && messages[i - 1].role != ChatRole::tool) out += "<|im_start|>user";
        out += "\n<tool_response>\n";
        out += content;
        out += "\n</tool_response>";
        if (i + 1 == messages.size() || messages[i + 1].role != ChatRole::tool) {
          out += "<|im_end|>\n";
        }
        break;
    }
    // T143-145 (other roles) cannot run: ChatRole has no other roles.
  }
  // T147-154.
  if (options.add_generation_prompt) out += chat_generation_prompt(options.enable_thinking);
  return out;
}

std::string render_chat_template(const std::vector<ChatMessage>& messages,
                                 const ChatTemplateOptions& options) {
  return render_chat_template(messages, {}, options);
}

std::string_view media_part_kind(std::string_view type) {
  if (type == "image_url" || type == "image" || type == "input_image") return "image";
  if (type == "input_audio" || type == "audio") return "audio";
  if (type == "video_url" || type == "video" || type == "input_video") return "video";
  if (type == "file" || type == "input_file") return "file";
  return "";
}

std::string_view chat_generation_prompt(bool enable_thinking) {
  // T148-153: `enable_thinking is defined and enable_thinking is false` closes an empty block.
  return enable_thinking ? "<|im_start|>assistant\n<think>\n"
                         : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
}

std::string render_chat(const std::vector<ChatMessage>& messages,
                        const std::vector<OrderedJson>& tools, const ChatPromptOptions& options) {
  // Thinking enabled: the checkpoint's own rendering. Disabled: Lily's rewrite first, so that
  // every earlier turn carries the empty block its generation prompt ended with; there
  // preserve_thinking is moot (the rewrite emptied every reasoning it would keep) and is not
  // passed on, which would give the rewritten turns a second, template-made empty block.
  const ChatTemplateOptions template_options{
      .add_generation_prompt = true,
      .enable_thinking = options.enable_thinking,
      .preserve_thinking = options.enable_thinking && options.preserve_thinking};
  if (options.enable_thinking) return render_chat_template(messages, tools, template_options);
  return render_chat_template(nothink_history_rewrite(messages), tools, template_options);
}

}  // namespace lily

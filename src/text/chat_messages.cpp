// Parsing OpenAI-shaped chat input (messages, tools, chat_template_kwargs) into chat types.
//
// The shapes are OpenAI's Chat Completions request types; docs/chat-format.md §2 lists what is
// accepted. Every error names the field by its JSON path.
#include "text/chat_messages.h"

#include <utility>

namespace lily {

namespace {

// function.arguments strings are parsed on their own; this bounds their nesting (and the
// recursion of the tojson writer) like the depth cap on the request itself.
constexpr int kMaxArgumentsDepth = 32;

[[noreturn]] void fail(const std::string& message, const std::string& param) {
  throw ChatInputError(message, param);
}

// The member `key` of `object`, or nullptr when it is absent or null (OpenAI clients send
// null for "not given").
const OrderedJson* given(const OrderedJson& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// An optional string field: "" when absent or null.
std::string optional_string(const OrderedJson& object, const char* key, const std::string& at) {
  const OrderedJson* value = given(object, key);
  if (!value) return {};
  if (!value->is_string()) {
    const std::string path = at + "." + key;
    fail(path + " must be a string, found " + describe_json(*value), path);
  }
  return value->get<std::string>();
}

// A content array: the concatenation of its text parts (the template's render_content
// renders item.text for each, T30-31); media parts are refused.
std::string parse_content_parts(const OrderedJson& parts, const std::string& at) {
  std::string text;
  for (size_t j = 0; j < parts.size(); ++j) {
    const OrderedJson& part = parts[j];
    const std::string pat = at + "[" + std::to_string(j) + "]";
    if (!part.is_object()) {
      fail(pat + " must be a content part object {\"type\": \"text\", \"text\": ...}, found " +
               describe_json(part),
           pat);
    }
    const auto type_it = part.find("type");
    if (type_it == part.end()) fail(pat + ": missing field \"type\"", pat + ".type");
    const std::string type = type_it->is_string() ? type_it->get<std::string>() : std::string();
    const auto refuse = [&](const std::string& kind) {
      fail(pat + ": " + kind + " inputs are not supported", pat);
    };
    if (type == "text") {
      const auto text_it = part.find("text");
      if (text_it == part.end()) fail(pat + ": missing field \"text\"", pat + ".text");
      const std::string* part_text = text_it->get_ptr<const std::string*>();
      if (!part_text) {
        fail(pat + ".text must be a string, found " + describe_json(*text_it), pat + ".text");
      }
      // The template renders a text part that also carries an image or video key as that
      // media (T8, T19), so such a part is refused like the media itself.
      const ContentPartKind kind = template_content_part_kind(part);
      if (kind == ContentPartKind::image) refuse("image");
      if (kind == ContentPartKind::video) refuse("video");
      text += *part_text;
    } else if (const std::string_view media = media_part_kind(type); !media.empty()) {
      refuse(std::string(media));
    } else {
      fail(pat +
               ".type must be \"text\" (image, audio, video and file parts are not supported), "
               "found " +
               describe_json(*type_it),
           pat + ".type");
    }
  }
  return text;
}

// function.arguments: a JSON string that encodes an object (OpenAI's wire shape), or the
// object itself; absent means no arguments (the template then renders none, T119).
OrderedJson parse_arguments(const OrderedJson& function, const std::string& at) {
  const std::string path = at + ".arguments";
  const OrderedJson* value = given(function, "arguments");
  if (!value) {
    if (function.contains("arguments")) {
      fail(path + " must be a JSON object encoded as a string, found null", path);
    }
    return OrderedJson::object();
  }
  OrderedJson arguments;
  if (const std::string* text = value->get_ptr<const std::string*>()) {
    try {
      arguments = parse_strict_ordered_json(*text, path, kMaxArgumentsDepth);
    } catch (const InputError& error) {
      fail(std::string(error.what()) + " (expected a JSON object encoded as a string)", path);
    }
    if (!arguments.is_object()) {
      fail(path + " must encode a JSON object, found " + describe_json(arguments), path);
    }
  } else if (value->is_object()) {
    arguments = *value;
  } else {
    fail(path + " must be a JSON object encoded as a string, found " + describe_json(*value), path);
  }
  return arguments;
}

std::vector<ChatToolCall> parse_tool_calls(const OrderedJson& calls, const std::string& at) {
  if (!calls.is_array()) {
    fail(at + " must be an array of tool calls, found " + describe_json(calls), at);
  }
  std::vector<ChatToolCall> out;
  out.reserve(calls.size());
  for (size_t j = 0; j < calls.size(); ++j) {
    const OrderedJson& call = calls[j];
    const std::string cat = at + "[" + std::to_string(j) + "]";
    if (!call.is_object()) {
      fail(cat + " must be an object {\"id\", \"type\": \"function\", \"function\"}, found " +
               describe_json(call),
           cat);
    }
    if (const OrderedJson* type = given(call, "type"); type && *type != "function") {
      fail(cat + ".type must be \"function\", found " + describe_json(*type), cat + ".type");
    }
    ChatToolCall parsed;
    parsed.id = optional_string(call, "id", cat);
    const std::string fat = cat + ".function";
    const OrderedJson* function = given(call, "function");
    if (!function) fail(cat + ": missing field \"function\"", fat);
    if (!function->is_object()) {
      fail(fat + " must be an object {\"name\", \"arguments\"}, found " + describe_json(*function),
           fat);
    }
    const OrderedJson* name = given(*function, "name");
    if (!name) fail(fat + ": missing field \"name\"", fat + ".name");
    const std::string* name_text = name->get_ptr<const std::string*>();
    if (!name_text || name_text->empty()) {
      fail(fat + ".name must be a non-empty string, found " + describe_json(*name), fat + ".name");
    }
    parsed.name = *name_text;
    parsed.arguments = parse_arguments(*function, fat);
    out.push_back(std::move(parsed));
  }
  return out;
}

// reasoning_content / reasoning: a string, or null (= not given).
std::optional<std::string> reasoning_field(const OrderedJson& item, const char* key,
                                           const std::string& at) {
  const OrderedJson* value = given(item, key);
  if (!value) return std::nullopt;
  if (!value->is_string()) {
    const std::string path = at + "." + key;
    fail(path + " must be a string or null, found " + describe_json(*value), path);
  }
  return value->get<std::string>();
}

ChatMessage parse_message(const OrderedJson& item, size_t i) {
  const std::string at = "messages[" + std::to_string(i) + "]";
  if (!item.is_object()) {
    fail(at + " must be an object {\"role\", \"content\", ...}, found " + describe_json(item), at);
  }
  ChatMessage message;
  const auto role_it = item.find("role");
  if (role_it == item.end()) fail(at + ": missing field \"role\"", at + ".role");
  const OrderedJson& role = *role_it;
  if (role == "system" || role == "developer") {
    message.role = ChatRole::system;
  } else if (role == "user") {
    message.role = ChatRole::user;
  } else if (role == "assistant") {
    message.role = ChatRole::assistant;
  } else if (role == "tool") {
    message.role = ChatRole::tool;
  } else {
    fail(at +
             ".role must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\", "
             "found " +
             describe_json(role),
         at + ".role");
  }
  const bool null_allowed = message.role == ChatRole::assistant || message.role == ChatRole::tool;
  const std::string cat = at + ".content";
  const auto content_it = item.find("content");
  if (content_it == item.end() || content_it->is_null()) {
    // The template renders a null or undefined content as "" (T36-37); OpenAI allows it for
    // an assistant turn with tool calls, and clients send it for empty tool results.
    if (!null_allowed) {
      if (content_it == item.end()) fail(at + ": missing field \"content\"", cat);
      fail(cat + " must be a string or an array of text parts, found null", cat);
    }
  } else if (content_it->is_string()) {
    message.content = content_it->get<std::string>();
  } else if (content_it->is_array()) {
    message.content = parse_content_parts(*content_it, cat);
  } else {
    fail(cat + " must be a string or an array of text parts" +
             std::string(null_allowed ? " (or null)" : "") + ", found " +
             describe_json(*content_it),
         cat);
  }
  if (message.role == ChatRole::assistant) {
    // Both names are in use (vLLM reads only `reasoning`, Cline only `reasoning_content`);
    // the template reads reasoning_content.
    message.reasoning_content = reasoning_field(item, "reasoning_content", at);
    if (std::optional<std::string> reasoning = reasoning_field(item, "reasoning", at);
        !message.reasoning_content && reasoning) {
      message.reasoning_content = std::move(reasoning);
    }
    if (const OrderedJson* calls = given(item, "tool_calls")) {
      message.tool_calls = parse_tool_calls(*calls, at + ".tool_calls");
    }
  } else if (message.role == ChatRole::tool) {
    message.tool_call_id = optional_string(item, "tool_call_id", at);
  }
  return message;
}

// A boolean template variable: true, false, or null (= false).
bool kwarg_bool(const OrderedJson& kwargs, const char* key) {
  const OrderedJson* value = given(kwargs, key);
  if (!value) return false;
  if (!value->is_boolean()) {
    const std::string path = std::string("chat_template_kwargs.") + key;
    fail(path + " must be true, false or null, found " + describe_json(*value), path);
  }
  return value->get<bool>();
}

}  // namespace

ChatInputError::ChatInputError(std::string message, std::string param)
    : InputError(message), param_(std::move(param)) {}

std::vector<ChatMessage> parse_openai_chat_messages(const OrderedJson& messages) {
  if (!messages.is_array()) {
    fail("messages must be a JSON array of message objects, found " + describe_json(messages),
         "messages");
  }
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) out.push_back(parse_message(messages[i], i));
  return out;
}

std::vector<OrderedJson> parse_chat_tools(const OrderedJson& tools) {
  if (!tools.is_array()) {
    fail("tools must be an array of {\"type\": \"function\", \"function\": {...}} objects, found " +
             describe_json(tools),
         "tools");
  }
  std::vector<OrderedJson> out;
  out.reserve(tools.size());
  for (size_t i = 0; i < tools.size(); ++i) {
    const OrderedJson& tool = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) {
      fail(at + " must be an object {\"type\": \"function\", \"function\": {...}}, found " +
               describe_json(tool),
           at);
    }
    if (const OrderedJson* type = given(tool, "type"); type && *type != "function") {
      fail(at + ".type must be \"function\", found " + describe_json(*type), at + ".type");
    }
    const OrderedJson* function = given(tool, "function");
    if (!function) fail(at + ": missing field \"function\"", at + ".function");
    if (!function->is_object()) {
      fail(at + ".function must be an object {\"name\", \"description\", \"parameters\"}, found " +
               describe_json(*function),
           at + ".function");
    }
    const OrderedJson* name = given(*function, "name");
    if (!name) fail(at + ".function: missing field \"name\"", at + ".function.name");
    const std::string* name_text = name->get_ptr<const std::string*>();
    if (!name_text || name_text->empty()) {
      fail(at + ".function.name must be a non-empty string, found " + describe_json(*name),
           at + ".function.name");
    }
    out.push_back(tool);
  }
  return out;
}

ChatPromptOptions parse_chat_template_kwargs(const OrderedJson& kwargs) {
  if (!kwargs.is_object()) {
    fail("chat_template_kwargs must be an object, found " + describe_json(kwargs),
         "chat_template_kwargs");
  }
  ChatPromptOptions options;
  options.enable_thinking = kwarg_bool(kwargs, "enable_thinking");
  options.preserve_thinking = kwarg_bool(kwargs, "preserve_thinking");
  return options;
}

ChatConversation parse_chat_conversation(const OrderedJson& object) {
  if (!object.is_object()) {
    fail(
        "a conversation must be a JSON object {\"messages\", \"tools\", \"chat_template_kwargs\"}"
        ", found " +
            describe_json(object),
        "");
  }
  ChatConversation conversation;
  const auto messages = object.find("messages");
  if (messages == object.end()) {
    fail(
        "missing field \"messages\" (a conversation is an object {\"messages\": [...], "
        "\"tools\": [...], \"chat_template_kwargs\": {...}})",
        "messages");
  }
  conversation.messages = parse_openai_chat_messages(*messages);
  if (const OrderedJson* tools = given(object, "tools")) {
    conversation.tools = parse_chat_tools(*tools);
  }
  if (const OrderedJson* kwargs = given(object, "chat_template_kwargs")) {
    conversation.options = parse_chat_template_kwargs(*kwargs);
  }
  return conversation;
}

}  // namespace lily

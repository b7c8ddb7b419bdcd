// `lily render-chat`: one conversation per stdin line -> one rendered prompt per line.
//
// A line is either a JSON array of messages in Lily's strict shape ({role, content}, no
// tools, thinking disabled), or an object {"messages", "tools", "chat_template_kwargs"} in
// OpenAI's shapes (text/chat_messages.h; thinking disabled unless enable_thinking is true).
// Every input line gives exactly one output line: the prompt as a JSON string, or
// {"error": "..."} when the line is not valid JSON, not a valid conversation, or the chat
// template refuses it. Processing always continues with the next line; the exit code is 0
// once stdin has been read to its end. Only usage errors (exit 2), a failing read of stdin
// (exit 2) and a failing write to stdout (exit 1) end the command early.
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/line_protocol.h"
#include "core/error.h"
#include "core/strict_json.h"
#include "text/chat_format.h"
#include "text/chat_messages.h"

namespace lily {

namespace {

// The server's openai-mode cap: tool schemas and call arguments nest deeply.
constexpr int kMaxJsonDepth = 64;
std::string render_line(const std::string& line, size_t line_number, bool too_long) {
  const std::string where = "line " + std::to_string(line_number);
  try {
    if (too_long) {
      throw InputError(where + ": longer than " + std::to_string(kMaxLineBytes) + " bytes");
    }
    // Keys in document order: tool schemas and call arguments are rendered in that order.
    const OrderedJson parsed = parse_strict_ordered_json(line, where, kMaxJsonDepth);
    std::string prompt;
    if (parsed.is_object()) {
      const ChatConversation conversation = parse_chat_conversation(parsed);
      prompt = render_chat(conversation.messages, conversation.tools, conversation.options);
    } else {
      prompt = render_chat(parse_chat_messages(Json(parsed), "messages"));
    }
    return Json(prompt).dump(-1, ' ', false, Json::error_handler_t::replace);
  } catch (const InputError& error) {
    const Json reply = {{"error", error.what()}};
    // Error texts may quote the offending (possibly invalid UTF-8) input bytes.
    return reply.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

}  // namespace

int cmd_render_chat(const std::vector<std::string>& argv) {
  const Args args(argv, {});  // no options: anything on the command line is a usage error
  return run_line_protocol("render-chat", render_line);
}

}  // namespace lily

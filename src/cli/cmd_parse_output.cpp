// `lily parse-output`: one generated text per stdin line -> the assistant message (or its deltas).
//
// stdin: one JSON string per line, the model's generated text. stdout: exactly one line per
// input line: the message as OpenAI's chat completion returns it,
//   {"role":"assistant","content":...,"reasoning_content":...,"tool_calls":[...]}
// (content null when there are tool calls and no content; reasoning_content only with
// --thinking; tool_calls only when there are some), or with --deltas a JSON array of the
// streamed deltas in OpenAI's delta shape, the text fed one code point at a time. The text
// is taken as ended by the model (EOS), not cut by max_tokens (--truncated: cut). A bad line gives
// {"error": "line N: ..."} and processing goes on; the exit code is 0 once stdin is read.
// Usage errors and a bad --tools file exit 2 before any line is read.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/line_protocol.h"
#include "core/error.h"
#include "core/strict_json.h"
#include "text/output_parser.h"
#include "text/utf8.h"

namespace lily {

namespace {

constexpr int kLineDepth = 4;  // a line is one string
constexpr int kToolsDepth = 64;
constexpr uint64_t kMaxToolsBytes = uint64_t{16} << 20;

std::vector<ToolSpec> read_tools(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::is_regular_file(status)) throw InputError("--tools " + path + ": not a readable regular file");
  if (std::filesystem::file_size(path, ec) > kMaxToolsBytes || ec) {
    throw InputError("--tools " + path + ": larger than " + std::to_string(kMaxToolsBytes) + " bytes or unreadable");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw InputError("--tools " + path + ": reading failed");
  try {
    return tool_specs_from_openai(parse_strict_ordered_json(text.str(), path, kToolsDepth));
  } catch (const InputError& error) {
    throw InputError("--tools " + std::string(error.what()));
  }
}

std::string dump(const OrderedJson& value) { return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace); }

OrderedJson message_json(const ParsedOutput& output, bool thinking) {
  OrderedJson message = OrderedJson::object();
  message["role"] = "assistant";
  if (output.content.empty() && !output.tool_calls.empty()) {
    message["content"] = nullptr;
  } else {
    message["content"] = output.content;
  }
  if (thinking) message["reasoning_content"] = output.reasoning;
  if (!output.tool_calls.empty()) {
    OrderedJson calls = OrderedJson::array();
    for (const ParsedToolCall& call : output.tool_calls) {
      OrderedJson function = OrderedJson::object();
      function["name"] = call.name;
      function["arguments"] = call.arguments;
      OrderedJson item = OrderedJson::object();
      item["id"] = call.id;
      item["type"] = "function";
      item["function"] = std::move(function);
      calls.push_back(std::move(item));
    }
    message["tool_calls"] = std::move(calls);
  }
  return message;
}

OrderedJson delta_json(const OutputDelta& delta) {
  OrderedJson out = OrderedJson::object();
  switch (delta.kind) {
    case OutputDelta::Kind::reasoning:
      out["reasoning_content"] = delta.text;
      break;
    case OutputDelta::Kind::content:
      out["content"] = delta.text;
      break;
    case OutputDelta::Kind::tool_call: {
      OrderedJson call = OrderedJson::object();
      call["index"] = delta.call_index;
      OrderedJson function = OrderedJson::object();
      if (!delta.call_id.empty()) {
        call["id"] = delta.call_id;
        call["type"] = "function";
        function["name"] = delta.call_name;
      }
      function["arguments"] = delta.text;
      call["function"] = std::move(function);
      out["tool_calls"] = OrderedJson::array({std::move(call)});
      break;
    }
  }
  return out;
}

struct Options {
  OutputParserConfig config;
  bool deltas = false;
  bool truncated = false;  // the texts were cut by max_tokens
};

std::string parse_line(const Options& options, const std::string& line, size_t line_number, bool too_long) {
  const std::string where = "line " + std::to_string(line_number);
  try {
    if (too_long) throw InputError(where + ": longer than " + std::to_string(kMaxLineBytes) + " bytes");
    const Json value = parse_strict_json(line, where, kLineDepth);
    if (!value.is_string()) throw InputError(where + " is " + describe_json(value) + ", expected a JSON string");
    const std::string& text = value.get_ref<const std::string&>();
    OutputParser parser(options.config, {});
    if (!options.deltas) {
      parser.feed(text);
      parser.finish(options.truncated);
      return dump(message_json(parser.output(), options.config.starts_in_reasoning));
    }
    OrderedJson deltas = OrderedJson::array();
    auto add = [&](const std::vector<OutputDelta>& pieces) {
      for (const OutputDelta& delta : pieces) deltas.push_back(delta_json(delta));
    };
    // One code point at a time: the finest split a detokenizer can produce.
    for (size_t i = 0; i < text.size();) {
      const size_t length = std::max<size_t>(1, utf8::inspect(text, i).length);
      add(parser.feed(std::string_view(text).substr(i, length)));
      i += length;
    }
    add(parser.finish(options.truncated));
    return dump(deltas);
  } catch (const InputError& error) {
    OrderedJson reply = OrderedJson::object();
    reply["error"] = error.what();
    return dump(reply);
  }
}

}  // namespace

int cmd_parse_output(const std::vector<std::string>& argv) {
  const std::vector<OptionSpec> spec = {
      {"tools", true, "an OpenAI `tools` JSON array (file); enables tool-call parsing"},
      {"thinking", false, "the text starts inside the reasoning (the prompt ended with <think>)"},
      {"deltas", false, "print the streamed deltas instead of the message"},
      {"truncated", false,
       "the texts were cut by max_tokens: an unfinished call stays text (default: ended by the "
       "model, an unfinished call is closed)"},
  };
  const Args args(argv, spec);
  Options options;
  options.config.starts_in_reasoning = args.has("thinking");
  options.deltas = args.has("deltas");
  options.truncated = args.has("truncated");
  if (const auto tools = args.get("tools")) {
    options.config.tools = read_tools(*tools);
    options.config.tool_calls = true;
  }
  return run_line_protocol("parse-output", [&options](const std::string& line, size_t number,
                                                       bool too_long) {
    return parse_line(options, line, number, too_long);
  });
}

}  // namespace lily

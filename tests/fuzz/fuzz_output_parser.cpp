// libFuzzer target: OutputParser over arbitrary generated text, fed in arbitrary pieces, against the whole-text parse.
//
// The first byte picks the configuration (thinking, tool calls, truncated) and seeds the
// split; the rest, made valid UTF-8 (the detokenizer's output always is), is the text. The
// parser must never throw, and the deltas of any split must add up, per kind and per call,
// to the whole-text parse (docs/output-parsing.md); a violation aborts (a libFuzzer crash).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/strict_json.h"
#include "text/output_parser.h"
#include "text/utf8.h"

namespace {

// Every conversion path of tool_schema: strings, integers, numbers, booleans, objects,
// arrays, a type array, anyOf and a local $ref.
const lily::OrderedJson& tools_json() {
  static const lily::OrderedJson tools = lily::OrderedJson::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "$defs": {"n": {"type": "number"}},
      "properties": {"s": {"type": "string"}, "i": {"type": "integer"},
        "n": {"$ref": "#/$defs/n"}, "b": {"type": "boolean"}, "o": {"type": "object"},
        "a": {"type": "array"}, "t": {"type": ["integer", "null"]},
        "u": {"anyOf": [{"type": "boolean"}, {"type": "string"}]}}}}},
    {"type": "function", "function": {"name": "g"}}])");
  return tools;
}

struct Accumulated {
  std::string reasoning;
  std::string content;
  std::vector<lily::ParsedToolCall> calls;
};

void add(Accumulated& acc, const std::vector<lily::OutputDelta>& deltas) {
  for (const lily::OutputDelta& d : deltas) {
    switch (d.kind) {
      case lily::OutputDelta::Kind::reasoning: acc.reasoning += d.text; break;
      case lily::OutputDelta::Kind::content: acc.content += d.text; break;
      case lily::OutputDelta::Kind::tool_call:
        if (!d.call_id.empty()) {
          if (d.call_index != acc.calls.size()) std::abort();  // indexes count up from 0
          acc.calls.push_back({d.call_id, d.call_name, ""});
        } else if (d.call_index + 1 != acc.calls.size()) {
          std::abort();  // a fragment belongs to the call opened last
        }
        acc.calls.back().arguments += d.text;
        break;
    }
  }
}

// Deterministic ids, so that two parsers of the same text agree.
std::function<std::string()> counter_ids() {
  return [n = 0]() mutable { return "call_" + std::to_string(n++); };
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::vector<lily::ToolSpec> tools = lily::tool_specs_from_openai(tools_json());
  const uint8_t flags = data[0];
  const std::string text =
      lily::utf8::lossy(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  lily::OutputParserConfig config;
  config.starts_in_reasoning = (flags & 1) != 0;
  config.tool_calls = (flags & 2) != 0;
  if (config.tool_calls) config.tools = tools;
  const bool truncated = (flags & 4) != 0;

  lily::OutputParser whole(config, counter_ids());
  Accumulated whole_deltas;
  add(whole_deltas, whole.feed(text));
  add(whole_deltas, whole.finish(truncated));

  lily::OutputParser split(config, counter_ids());
  Accumulated split_deltas;
  uint32_t state = 0x9E3779B9u ^ flags;  // xorshift: piece lengths of 1..8 code points
  for (size_t i = 0; i < text.size();) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    size_t end = i;
    for (uint32_t k = 1 + state % 8; k > 0 && end < text.size(); --k) {
      end += std::max<size_t>(1, lily::utf8::inspect(text, end).length);
    }
    add(split_deltas, split.feed(std::string_view(text).substr(i, end - i)));
    i = end;
  }
  add(split_deltas, split.finish(truncated));

  for (const auto* parsed : {&whole.output(), &split.output()}) {
    const Accumulated& acc = parsed == &whole.output() ? whole_deltas : split_deltas;
    if (acc.reasoning != parsed->reasoning || acc.content != parsed->content) std::abort();
    if (acc.calls.size() != parsed->tool_calls.size()) std::abort();
    for (size_t c = 0; c < acc.calls.size(); ++c) {
      const lily::ParsedToolCall& call = parsed->tool_calls[c];
      if (acc.calls[c].id != call.id || acc.calls[c].name != call.name ||
          acc.calls[c].arguments != call.arguments) {
        std::abort();
      }
      // The arguments are one JSON object.
      if (!lily::OrderedJson::accept(call.arguments)) std::abort();
      if (!lily::OrderedJson::parse(call.arguments).is_object()) std::abort();
    }
  }
  const lily::ParsedOutput& a = whole.output();
  const lily::ParsedOutput& b = split.output();
  if (a.reasoning != b.reasoning || a.content != b.content ||
      a.tool_calls.size() != b.tool_calls.size()) {
    std::abort();
  }
  for (size_t c = 0; c < a.tool_calls.size(); ++c) {
    if (a.tool_calls[c].name != b.tool_calls[c].name ||
        a.tool_calls[c].arguments != b.tool_calls[c].arguments) {
      std::abort();
    }
  }
  if (!config.starts_in_reasoning && !a.reasoning.empty()) std::abort();
  if (!config.tool_calls && !a.tool_calls.empty()) std::abort();
  return 0;
}

// The model's generated text -> reasoning, content and tool calls (Qwen3.6), incrementally.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/strict_json.h"

namespace lily {

// One tool the request offers: its function name and parameters JSON schema (null when the
// request gave none).
struct ToolSpec {
  std::string name;
  OrderedJson parameters;
};

struct OutputParserConfig {
  bool starts_in_reasoning = false;  // thinking on: the prompt ends inside <think>
  bool tool_calls = false;           // parse <tool_call> blocks (tools given, tool_choice != none)
  std::vector<ToolSpec> tools;       // for the value conversion by schema (tool_schema.h)
};

// One streamed piece, in order.
struct OutputDelta {
  enum class Kind { reasoning, content, tool_call } kind;
  std::string text;        // reasoning/content text, or a fragment of the call's arguments
  size_t call_index = 0;   // tool_call: 0, 1, ... per call in this answer
  std::string call_id;     // tool_call: set on the call's FIRST delta only (its text is "")
  std::string call_name;   // likewise
};

struct ParsedToolCall {
  std::string id, name, arguments;  // arguments: a JSON object as text (Python json.dumps style)
};

struct ParsedOutput {
  std::string reasoning;  // all reasoning (after the strip rules)
  std::string content;    // all content
  std::vector<ParsedToolCall> tool_calls;
};

// Splits generated text into reasoning, content and tool calls as it streams. The rules
// (docs/output-parsing.md):
//   thinking on: everything before the first `</think>` is reasoning (a leading `<think>` is
//   dropped), the rest content; no `</think>` at all: all reasoning. Reasoning loses its
//   leading and trailing '\n's, the content after `</think>` its leading '\n's;
//   tool calls on: Qwen3-Coder XML blocks `<tool_call>\n<function=NAME>\n<parameter=KEY>\n
//   VALUE\n</parameter>\n</function>\n</tool_call>` become calls, in the content and in the
//   reasoning alike; whitespace right before a call and whitespace-only text between or
//   after calls is dropped; a block that is not a call (a malformed name, no <function=...>)
//   stays text.
// Text that could still turn into a marker or be dropped by a strip rule is held back until
// decided; a call is emitted only once complete. For any split of a text into feed() pieces
// the deltas concatenated per kind (and per call) equal output() and the whole-text parse.
class OutputParser {
 public:
  // `new_call_id`: makes each call's id; empty: random_call_id.
  OutputParser(OutputParserConfig config, std::function<std::string()> new_call_id);

  // `text`: whole UTF-8 characters (the detokenizer's output), any split.
  std::vector<OutputDelta> feed(std::string_view text);
  // End of generation. `truncated`: cut by max_tokens, so an unfinished call is not a call
  // (its raw text becomes text again); otherwise (the model stopped) an unfinished call with a
  // function name is closed with what was parsed. Later feed() and finish() calls do nothing.
  std::vector<OutputDelta> finish(bool truncated);

  const ParsedOutput& output() const { return output_; }  // everything so far; final after finish()
  bool in_reasoning() const { return reasoning_; }        // still before </think> (thinking on)
  bool in_tool_call() const;                              // inside an open <tool_call> block

 private:
  enum class Mode : uint8_t {
    reasoning_start,  // before any reasoning text: newlines and repeated <think> are dropped
    text,             // reasoning or content text, scanning for markers
    block_open,       // after <tool_call>: whitespace, then <function=
    function_name,    // after <function=: the name up to '>'
    parameters,       // inside a function, between parameters
    parameter_key,    // after <parameter=: the key up to '>'
    parameter_value,  // a value, up to </parameter> (or the robustness terminators)
    after_function,   // after </function>: whitespace, then </tool_call>
  };
  using Kind = OutputDelta::Kind;

  // What a text channel (reasoning or content) still holds back.
  struct Channel {
    std::string held;           // trailing whitespace, not yet released
    bool strip_leading = false;  // drop leading '\n's while nothing was released
    bool after_call = false;     // the current stretch of text follows a tool call
  };

  void run(bool at_end);
  bool step_reasoning_start(bool at_end);
  bool step_text(bool at_end);
  bool step_block_open(bool at_end);
  bool step_function_name();
  bool step_parameters(bool at_end);
  bool step_parameter_key();
  bool step_parameter_value(bool at_end);
  bool step_after_function(bool at_end);

  std::string_view rest() const { return std::string_view(buf_).substr(pos_); }
  void take(size_t n);  // consumes n bytes that belong to the open block's raw text

  Kind channel_kind() const { return reasoning_ ? Kind::reasoning : Kind::content; }
  Channel& channel(Kind kind) { return kind == Kind::reasoning ? reasoning_channel_ : content_channel_; }
  void channel_text(Kind kind, std::string_view text);
  void release(Kind kind, std::string text);
  void end_channel(Kind kind);

  void abandon_block();   // the block is not a call: its raw text is literal text
  void finish_parameter();
  void complete_call();
  void end_block();

  OutputParserConfig config_;
  std::function<std::string()> new_call_id_;
  ParsedOutput output_;
  std::vector<OutputDelta>* out_ = nullptr;  // the deltas of the current feed() or finish()

  std::string buf_;  // text not yet consumed starts at pos_
  size_t pos_ = 0;
  Mode mode_ = Mode::text;
  bool reasoning_ = false;
  bool finished_ = false;
  Channel reasoning_channel_, content_channel_;

  // The open block.
  std::string block_raw_;       // its text so far, as generated (for when it is not a call)
  std::string function_name_;
  std::vector<std::pair<std::string, std::string>> parameters_;  // (key, raw value) in order
  std::string key_, value_;
  bool discard_value_ = false;  // the parameter's key was malformed: its value is skipped
  std::string after_whitespace_;  // whitespace after </function>
  size_t call_count_ = 0;
};

// "call_" and 24 random letters and digits.
std::string random_call_id();

// The tools of an OpenAI `tools` array (each {"type": "function", "function": {"name",
// "description", "parameters"}}). Throws InputError naming the bad element ("tools[1].function
// .name: ..."): not an array, an element that is not such an object, a name that is empty or
// holds whitespace, '<' or '>' (the model could not write it), parameters not an object.
std::vector<ToolSpec> tool_specs_from_openai(const OrderedJson& tools);

}  // namespace lily

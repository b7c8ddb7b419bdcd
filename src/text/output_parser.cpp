// The model's generated text -> reasoning, content and tool calls (Qwen3.6), incrementally.
//
// A state machine over the unconsumed text: each step consumes what is decided whatever
// text comes next and waits on the rest, so the result never depends on how the text was
// split. Every marker starts with '<' and has no other '<', which keeps the search simple.
#include "text/output_parser.h"

#include <array>
#include <random>

#include "core/error.h"
#include "text/python_json.h"
#include "text/tool_schema.h"

namespace lily {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

enum class Match { none, partial, full };

// Whether `s` begins with `marker` (full), could still begin with it once more text comes
// (partial: `s` is a proper prefix of it, and the text may go on), or cannot.
Match match_at(std::string_view s, std::string_view marker, bool at_end) {
  if (s.size() >= marker.size()) return s.substr(0, marker.size()) == marker ? Match::full : Match::none;
  if (!at_end && marker.substr(0, s.size()) == s) return Match::partial;
  return Match::none;
}

struct Found {
  size_t at;      // where the marker starts; with which < 0, where undecided text starts
  int which;      // index of the marker found, or -1
};

// The earliest full marker in `s`. Without one, `at` is the start of the suffix that could
// still become a marker (s.size() when none can): the text before it is plain text.
template <size_t N>
Found find_marker(std::string_view s, const std::array<std::string_view, N>& markers, size_t count, bool at_end) {
  for (size_t i = s.find('<'); i != std::string_view::npos; i = s.find('<', i + 1)) {
    bool partial = false;
    for (size_t m = 0; m < count; ++m) {
      const Match match = match_at(s.substr(i), markers[m], at_end);
      if (match == Match::full) return {i, static_cast<int>(m)};
      if (match == Match::partial) partial = true;
    }
    // A partial match runs to the end of `s`, and markers hold no second '<': nothing later
    // can match.
    if (partial) return {i, -1};
  }
  return {s.size(), -1};
}

// Whether `name` can be a function name or parameter key: what the model writes between
// `=` and `>` (vLLM PR #55497: malformed names must not leak into the arguments).
bool name_char(char c) { return !is_space(c) && c != '<' && c != '>'; }

}  // namespace

std::string random_call_id() {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 engine{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[pick(engine)]);
  return id;
}

OutputParser::OutputParser(OutputParserConfig config, std::function<std::string()> new_call_id)
    : config_(std::move(config)), new_call_id_(std::move(new_call_id)) {
  if (!new_call_id_) new_call_id_ = random_call_id;
  if (config_.starts_in_reasoning) {
    reasoning_ = true;
    mode_ = Mode::reasoning_start;
    reasoning_channel_.strip_leading = true;
  }
}

bool OutputParser::in_tool_call() const { return mode_ != Mode::reasoning_start && mode_ != Mode::text; }

std::vector<OutputDelta> OutputParser::feed(std::string_view text) {
  std::vector<OutputDelta> out;
  if (finished_ || text.empty()) return out;
  out_ = &out;
  buf_.append(text);
  run(false);
  out_ = nullptr;
  return out;
}

std::vector<OutputDelta> OutputParser::finish(bool truncated) {
  std::vector<OutputDelta> out;
  if (finished_) return out;
  finished_ = true;
  out_ = &out;
  run(true);  // consumes everything: no step waits at the end
  switch (mode_) {
    case Mode::reasoning_start:
    case Mode::text:
      break;
    case Mode::block_open:
    case Mode::function_name:
      abandon_block();  // never got a function name: not a call
      break;
    case Mode::parameters:
    case Mode::parameter_key:
    case Mode::parameter_value:
      if (truncated) {
        abandon_block();  // cut off by max_tokens: never shown as a call (finish_reason length)
      } else {
        if (mode_ == Mode::parameter_value) finish_parameter();
        complete_call();
        end_block();
      }
      break;
    case Mode::after_function:
      channel_text(channel_kind(), after_whitespace_);
      end_block();
      break;
  }
  end_channel(channel_kind());
  out_ = nullptr;
  return out;
}

void OutputParser::run(bool at_end) {
  for (bool progress = true; progress;) {
    switch (mode_) {
      case Mode::reasoning_start:
        progress = step_reasoning_start(at_end);
        break;
      case Mode::text:
        progress = step_text(at_end);
        break;
      case Mode::block_open:
        progress = step_block_open(at_end);
        break;
      case Mode::function_name:
        progress = step_function_name();
        break;
      case Mode::parameters:
        progress = step_parameters(at_end);
        break;
      case Mode::parameter_key:
        progress = step_parameter_key();
        break;
      case Mode::parameter_value:
        progress = step_parameter_value(at_end);
        break;
      case Mode::after_function:
        progress = step_after_function(at_end);
        break;
    }
  }
  buf_.erase(0, pos_);
  pos_ = 0;
}

void OutputParser::take(size_t n) {
  block_raw_.append(buf_, pos_, n);
  pos_ += n;
}

// Reasoning begins after the prompt's `<think>\n`; a model that repeats `<think>` (and the
// newlines around it, which the strip rule drops anyway) loses it.
bool OutputParser::step_reasoning_start(bool at_end) {
  while (pos_ < buf_.size() && buf_[pos_] == '\n') ++pos_;
  if (pos_ == buf_.size()) return false;
  switch (match_at(rest(), kThinkOpen, at_end)) {
    case Match::full:
      pos_ += kThinkOpen.size();
      return true;
    case Match::partial:
      return false;
    case Match::none:
      mode_ = Mode::text;
      return true;
  }
  return false;
}

bool OutputParser::step_text(bool at_end) {
  const std::string_view text = rest();
  if (text.empty()) return false;
  std::array<std::string_view, 2> markers{};
  size_t count = 0;
  if (reasoning_) markers[count++] = kThinkClose;
  if (config_.tool_calls) markers[count++] = kCallOpen;
  const Found found = find_marker(text, markers, count, at_end);
  channel_text(channel_kind(), text.substr(0, found.at));
  pos_ += found.at;
  if (found.which < 0) return false;
  const std::string_view marker = markers[static_cast<size_t>(found.which)];
  pos_ += marker.size();
  if (marker == kThinkClose) {
    end_channel(Kind::reasoning);
    reasoning_ = false;
    content_channel_.strip_leading = true;
  } else {
    block_raw_.assign(kCallOpen);
    mode_ = Mode::block_open;
  }
  return true;
}

bool OutputParser::step_block_open(bool at_end) {
  while (pos_ < buf_.size() && is_space(buf_[pos_])) take(1);
  if (pos_ == buf_.size()) return false;
  switch (match_at(rest(), kFunctionOpen, at_end)) {
    case Match::full:
      take(kFunctionOpen.size());
      function_name_.clear();
      mode_ = Mode::function_name;
      return true;
    case Match::partial:
      return false;
    case Match::none:
      abandon_block();  // e.g. a JSON (Hermes-style) call: stays text
      return true;
  }
  return false;
}

bool OutputParser::step_function_name() {
  while (pos_ < buf_.size()) {
    const char c = buf_[pos_];
    if (c == '>') {
      if (function_name_.empty()) {
        abandon_block();
        return true;
      }
      take(1);
      parameters_.clear();
      mode_ = Mode::parameters;
      return true;
    }
    if (!name_char(c)) {  // whitespace or '<': the name's line never closed properly
      abandon_block();
      return true;
    }
    function_name_.push_back(c);
    take(1);
  }
  return false;
}

bool OutputParser::step_parameters(bool at_end) {
  while (pos_ < buf_.size()) {
    if (buf_[pos_] != '<') {
      take(1);  // whitespace, or stray text inside a function: not part of any value
      continue;
    }
    const std::string_view text = rest();
    bool partial = false;
    for (const std::string_view marker : {kParameterOpen, kParameterClose, kFunctionClose, kCallClose, kThinkClose}) {
      if (marker == kThinkClose && !reasoning_) continue;
      const Match match = match_at(text, marker, at_end);
      if (match == Match::partial) partial = true;
      if (match != Match::full) continue;
      if (marker == kParameterOpen) {
        take(marker.size());
        key_.clear();
        mode_ = Mode::parameter_key;
      } else if (marker == kParameterClose) {
        take(marker.size());  // a repeated </parameter> (llama.cpp #24807): ignored
      } else if (marker == kFunctionClose) {
        take(marker.size());
        complete_call();
        after_whitespace_.clear();
        mode_ = Mode::after_function;
      } else if (marker == kCallClose) {
        take(marker.size());  // </function> missing
        complete_call();
        end_block();
      } else {
        // </think> inside a call in the reasoning: the reasoning ends here, and the call
        // with it, as at the end of the text (the tool parser must not swallow </think>,
        // vLLM #51679). Not consumed: the text step ends the reasoning.
        complete_call();
        end_block();
      }
      return true;
    }
    if (partial) return false;
    take(1);  // a '<' that begins no marker
  }
  return false;
}

bool OutputParser::step_parameter_key() {
  while (pos_ < buf_.size()) {
    const char c = buf_[pos_];
    if (c == '>' || !name_char(c)) {
      // An empty key, or one with whitespace or '<' in it: the parameter is skipped (its
      // value is read and discarded), the call keeps its other parameters.
      discard_value_ = c != '>' || key_.empty();
      if (c == '>') take(1);
      value_.clear();
      mode_ = Mode::parameter_value;
      return true;
    }
    key_.push_back(c);
    take(1);
  }
  return false;
}

bool OutputParser::step_parameter_value(bool at_end) {
  // A value runs to </parameter>; like vLLM, also to the next <parameter=, </function> or
  // </tool_call> when its </parameter> is missing (llama.cpp PR #18077), and in the reasoning
  // to </think>.
  static constexpr std::array<std::string_view, 5> kEnds{kParameterClose, kParameterOpen, kFunctionClose,
                                                         kCallClose, kThinkClose};
  const std::string_view text = rest();
  if (text.empty()) return false;
  const Found found = find_marker(text, kEnds, reasoning_ ? 5 : 4, at_end);
  if (!discard_value_) value_.append(text.substr(0, found.at));
  take(found.at);
  if (found.which < 0) return false;
  finish_parameter();
  if (found.which == 0) take(kParameterClose.size());
  mode_ = Mode::parameters;
  return true;
}

bool OutputParser::step_after_function(bool at_end) {
  while (pos_ < buf_.size() && is_space(buf_[pos_])) after_whitespace_.push_back(buf_[pos_++]);
  if (pos_ == buf_.size()) return false;
  const std::string_view text = rest();
  const Match close = match_at(text, kCallClose, at_end);
  const Match function = match_at(text, kFunctionOpen, at_end);
  const Match stray = match_at(text, kParameterClose, at_end);
  if (close == Match::full) {
    pos_ += kCallClose.size();
    end_block();
  } else if (function == Match::full) {
    // Another function in the same block: a call of its own.
    pos_ += kFunctionOpen.size();
    channel_text(channel_kind(), after_whitespace_);
    after_whitespace_.clear();
    block_raw_.assign(kFunctionOpen);
    function_name_.clear();
    mode_ = Mode::function_name;
  } else if (stray == Match::full) {
    pos_ += kParameterClose.size();
  } else if (close == Match::partial || function == Match::partial || stray == Match::partial) {
    return false;
  } else {
    // </tool_call> missing: what follows is text again, after a call.
    channel_text(channel_kind(), after_whitespace_);
    end_block();
  }
  return true;
}

void OutputParser::channel_text(Kind kind, std::string_view text) {
  if (text.empty()) return;
  Channel& c = channel(kind);
  const size_t last = text.find_last_not_of(" \t\n\r");
  if (last == std::string_view::npos) {
    c.held.append(text);  // only whitespace: it may precede a call or end the channel
    return;
  }
  std::string released = std::move(c.held);
  released.append(text.substr(0, last + 1));
  c.held.assign(text.substr(last + 1));
  c.after_call = false;
  release(kind, std::move(released));
}

void OutputParser::release(Kind kind, std::string text) {
  std::string& total = kind == Kind::reasoning ? output_.reasoning : output_.content;
  if (channel(kind).strip_leading && total.empty()) {
    const size_t first = text.find_first_not_of('\n');
    text.erase(0, first == std::string::npos ? text.size() : first);
  }
  if (text.empty()) return;
  total.append(text);
  out_->push_back(OutputDelta{kind, std::move(text), 0, {}, {}});
}

void OutputParser::end_channel(Kind kind) {
  Channel& c = channel(kind);
  std::string held = std::move(c.held);
  c.held.clear();
  if (c.after_call) return;  // whitespace-only text after a call is dropped
  if (kind == Kind::reasoning) {
    const size_t last = held.find_last_not_of('\n');
    held.erase(last == std::string::npos ? 0 : last + 1);
  }
  release(kind, std::move(held));
}

void OutputParser::abandon_block() {
  std::string raw = std::move(block_raw_);
  end_block();
  channel_text(channel_kind(), raw);
}

void OutputParser::finish_parameter() {
  if (!discard_value_) {
    // Exactly one '\n' on each side is the format's; the rest belongs to the value.
    std::string_view value = value_;
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    parameters_.emplace_back(key_, std::string(value));
  }
  key_.clear();
  value_.clear();
  discard_value_ = false;
}

void OutputParser::complete_call() {
  Channel& c = channel(channel_kind());
  c.held.clear();  // the whitespace before the call is the format's
  c.after_call = true;

  const ToolSpec* spec = nullptr;
  for (const ToolSpec& tool : config_.tools) {
    if (tool.name == function_name_) {
      spec = &tool;
      break;
    }
  }
  OrderedJson arguments = OrderedJson::object();
  for (const auto& [key, raw] : parameters_) {
    // An unknown function has no schema: every value is a string.
    std::optional<OrderedJson> value =
        spec ? convert_parameter_value(spec->parameters, key, raw) : std::optional<OrderedJson>(raw);
    // A repeated key: the last one wins (at the first one's place, as a Python dict does).
    if (value) {
      arguments[key] = std::move(*value);
    } else {
      arguments.erase(key);
    }
  }

  const size_t index = call_count_++;
  ParsedToolCall call{new_call_id_(), function_name_, {}};
  out_->push_back(OutputDelta{Kind::tool_call, {}, index, call.id, call.name});
  // Fragments `{"a": 1`, `, "b": 2`, `}`: the arguments are valid JSON only once complete.
  bool first = true;
  for (const auto& [key, value] : arguments.items()) {
    std::string fragment = first ? "{" : ", ";
    first = false;
    append_python_json(fragment, OrderedJson(key));
    fragment += ": ";
    append_python_json(fragment, value);
    call.arguments += fragment;
    out_->push_back(OutputDelta{Kind::tool_call, std::move(fragment), index, {}, {}});
  }
  if (first) {  // no arguments
    call.arguments += "{";
    out_->push_back(OutputDelta{Kind::tool_call, "{", index, {}, {}});
  }
  call.arguments += "}";
  out_->push_back(OutputDelta{Kind::tool_call, "}", index, {}, {}});
  output_.tool_calls.push_back(std::move(call));

  parameters_.clear();
  function_name_.clear();
  block_raw_.clear();
}

void OutputParser::end_block() {
  mode_ = Mode::text;
  block_raw_.clear();
  function_name_.clear();
  parameters_.clear();
  key_.clear();
  value_.clear();
  discard_value_ = false;
  after_whitespace_.clear();
}

namespace {

std::string element(size_t index) { return "tools[" + std::to_string(index) + "]"; }

// See tool_schema.cpp: contains/at rather than iterators, for GCC's -Wnull-dereference.
const OrderedJson* member(const OrderedJson& object, const std::string& key) {
  if (!object.is_object() || !object.contains(key)) return nullptr;
  return &object.at(key);
}

}  // namespace

std::vector<ToolSpec> tool_specs_from_openai(const OrderedJson& tools) {
  if (!tools.is_array()) {
    throw InputError("tools: expected an array of {\"type\": \"function\", \"function\": {...}} objects, found " +
                     describe_json(tools));
  }
  std::vector<ToolSpec> specs;
  specs.reserve(tools.size());
  for (size_t i = 0; i < tools.size(); ++i) {
    const OrderedJson& tool = tools[i];
    const std::string at = element(i);
    if (!tool.is_object()) throw InputError(at + ": expected a {\"type\": \"function\", ...} object, found " + describe_json(tool));
    const OrderedJson* type = member(tool, "type");
    if (!type || *type != "function") {
      throw InputError(at + ".type: expected \"function\", found " + (type ? describe_json(*type) : "nothing"));
    }
    const OrderedJson* function = member(tool, "function");
    if (!function || !function->is_object()) {
      throw InputError(at + ".function: expected an object with \"name\", found " +
                       (function ? describe_json(*function) : "nothing"));
    }
    const OrderedJson* name = member(*function, "name");
    if (!name || !name->is_string() || name->get_ref<const std::string&>().empty()) {
      throw InputError(at + ".function.name: expected a non-empty string, found " +
                       (name ? describe_json(*name) : "nothing"));
    }
    const std::string& text = name->get_ref<const std::string&>();
    for (const char c : text) {
      if (!name_char(c)) {
        throw InputError(at + ".function.name: " + describe_json(*name) +
                         " holds whitespace, '<' or '>', which a tool call cannot name");
      }
    }
    ToolSpec spec{text, nullptr};
    if (const OrderedJson* parameters = member(*function, "parameters"); parameters && !parameters->is_null()) {
      if (!parameters->is_object()) {
        throw InputError(at + ".function.parameters: expected a JSON schema object, found " +
                         describe_json(*parameters));
      }
      spec.parameters = *parameters;
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace lily

// Tool-call parameter values by the tool's JSON schema: the raw text of one XML parameter -> JSON.
//
// The rules follow vLLM's qwen3coder_tool_parser (the type names it knows, integral numbers
// as integers) with the fixes of vLLM PRs #36032 and #37831 (anyOf/oneOf/type arrays/$ref
// resolved, so Optional parameters are not double-encoded) and sglang #36835 (an empty tag of
// a non-string parameter is dropped). See docs/output-parsing.md.
#include "text/tool_schema.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace lily {

namespace {

// $ref chains and nested anyOf/oneOf deeper than this say nothing more (also ends cycles).
constexpr int kMaxSchemaDepth = 16;
// Object and array values nest at most this deep; deeper text stays a string.
constexpr int kMaxValueDepth = 32;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// The member `key` of `object`, or nullptr (also when `object` is not an object). Lookups go
// through contains/at: GCC's -Wnull-dereference misfires on nlohmann's const iterators.
const OrderedJson* member(const OrderedJson& object, const std::string& key) {
  if (!object.is_object() || !object.contains(key)) return nullptr;
  return &object.at(key);
}

// vLLM's type names (qwen3coder_tool_parser._convert_param_value); anything else is a string.
unsigned type_bit(std::string_view name) {
  const std::string t = lower(trim(name));
  if (t == "null" || t == "none") return kSchemaNull;
  if (t == "boolean" || t == "bool" || t == "binary") return kSchemaBoolean;
  if (starts_with(t, "int") || starts_with(t, "uint") || starts_with(t, "long") || starts_with(t, "short") ||
      starts_with(t, "unsigned")) {
    return kSchemaInteger;
  }
  if (starts_with(t, "num") || starts_with(t, "float") || starts_with(t, "double")) return kSchemaNumber;
  if (t == "object" || starts_with(t, "dict") || t == "map") return kSchemaObject;
  if (t == "array" || t == "arr" || starts_with(t, "list") || t == "tuple") return kSchemaArray;
  return kSchemaString;
}

unsigned value_type_bit(const OrderedJson& value) {
  switch (value.type()) {
    case OrderedJson::value_t::null:
      return kSchemaNull;
    case OrderedJson::value_t::boolean:
      return kSchemaBoolean;
    case OrderedJson::value_t::number_integer:
    case OrderedJson::value_t::number_unsigned:
      return kSchemaInteger;
    case OrderedJson::value_t::number_float:
      return kSchemaNumber;
    case OrderedJson::value_t::string:
      return kSchemaString;
    case OrderedJson::value_t::object:
      return kSchemaObject;
    case OrderedJson::value_t::array:
      return kSchemaArray;
    case OrderedJson::value_t::binary:
    case OrderedJson::value_t::discarded:
      break;
  }
  return 0;
}

// The schema a local "$ref" points to, or nullptr (not local, malformed or missing).
const OrderedJson* resolve_ref(const std::string& ref, const OrderedJson& root) {
  if (ref == "#") return &root;
  if (!starts_with(ref, "#/")) return nullptr;  // remote references are not fetched
  try {
    const OrderedJson::json_pointer pointer(ref.substr(1));
    if (!root.contains(pointer)) return nullptr;
    return &root.at(pointer);
  } catch (const OrderedJson::exception&) {
    return nullptr;  // a malformed pointer ("~2", a non-numeric array index)
  }
}

unsigned collect_types(const OrderedJson& schema, const OrderedJson& root, int depth) {
  if (depth > kMaxSchemaDepth || !schema.is_object()) return 0;
  unsigned local = 0;
  if (const OrderedJson* type = member(schema, "type")) {
    if (type->is_string()) {
      local |= type_bit(type->get_ref<const std::string&>());
    } else if (type->is_array()) {
      for (const OrderedJson& name : *type) {
        if (name.is_string()) local |= type_bit(name.get_ref<const std::string&>());
      }
    }
  }
  unsigned combined = 0;
  bool has_combinator = false;
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    const OrderedJson* branches = member(schema, key);
    if (!branches || !branches->is_array()) continue;
    has_combinator = true;
    for (const OrderedJson& branch : *branches) combined |= collect_types(branch, root, depth + 1);
  }
  if (const OrderedJson* ref = member(schema, "$ref"); ref && ref->is_string()) {
    has_combinator = true;
    if (const OrderedJson* target = resolve_ref(ref->get_ref<const std::string&>(), root)) {
      combined |= collect_types(*target, root, depth + 1);
    }
  }
  if (local == 0 && !has_combinator) {
    // No type named: what the values allowed say about it.
    if (const OrderedJson* values = member(schema, "enum"); values && values->is_array()) {
      for (const OrderedJson& v : *values) local |= value_type_bit(v);
    } else if (const OrderedJson* value = member(schema, "const")) {
      local |= value_type_bit(*value);
    } else if (member(schema, "properties")) {
      local |= kSchemaObject;
    } else if (member(schema, "items")) {
      local |= kSchemaArray;
    }
  }
  return local | combined;
}

// An optional '-' and decimal digits, within int64 (or uint64 for large positives).
std::optional<OrderedJson> parse_integer(std::string_view text) {
  const size_t digits_at = (!text.empty() && text[0] == '-') ? 1 : 0;
  if (text.size() == digits_at) return std::nullopt;
  for (size_t i = digits_at; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
  }
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  int64_t value = 0;
  if (const auto r = std::from_chars(begin, end, value); r.ec == std::errc() && r.ptr == end) return OrderedJson(value);
  uint64_t big = 0;
  if (digits_at == 0) {
    if (const auto r = std::from_chars(begin, end, big); r.ec == std::errc() && r.ptr == end) return OrderedJson(big);
  }
  return std::nullopt;
}

// JSON number syntax: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

std::optional<OrderedJson> parse_number(std::string_view text) {
  if (!is_json_number(text)) return std::nullopt;
  if (auto integer = parse_integer(text)) return integer;  // exact, not through a double
  double value = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
  // An integral value is an integer (vLLM: float_val if float_val != int(float_val) else
  // int(float_val)); beyond int64 it stays a float rather than losing the exact value.
  if (value == std::floor(value) && std::fabs(value) < 9.2e18) return OrderedJson(static_cast<int64_t>(value));
  return OrderedJson(value);
}

std::optional<OrderedJson> parse_boolean(std::string_view text) {
  const std::string t = lower(text);
  if (t == "true") return OrderedJson(true);
  if (t == "false") return OrderedJson(false);
  return std::nullopt;
}

std::optional<OrderedJson> parse_container(std::string_view text, bool object) {
  if (text.empty() || text.front() != (object ? '{' : '[')) return std::nullopt;
  try {
    OrderedJson value = parse_strict_ordered_json(text, "tool argument", kMaxValueDepth);
    if (object ? value.is_object() : value.is_array()) return value;
  } catch (const InputError&) {
    // Not valid JSON (or too deep, duplicate keys): the caller keeps the text as a string.
  }
  return std::nullopt;
}

}  // namespace

unsigned schema_types(const OrderedJson& schema, const OrderedJson& root) { return collect_types(schema, root, 0); }

std::optional<OrderedJson> convert_parameter_value(const OrderedJson& parameters, std::string_view key,
                                                   std::string_view raw) {
  const OrderedJson* properties = member(parameters, "properties");
  const OrderedJson* property = properties ? member(*properties, std::string(key)) : nullptr;
  const unsigned types = property ? schema_types(*property, parameters) : 0u;
  if (types == 0 || types == kSchemaString) return OrderedJson(std::string(raw));
  const std::string_view text = trim(raw);
  if (text == "null") return OrderedJson(nullptr);
  const bool string_ok = (types & kSchemaString) != 0;
  if (text.empty()) {
    if (string_ok) return OrderedJson(std::string(raw));
    return std::nullopt;
  }
  std::optional<OrderedJson> value;
  if (!value && (types & kSchemaInteger)) value = parse_integer(text);
  if (!value && (types & kSchemaNumber)) value = parse_number(text);
  if (!value && (types & kSchemaBoolean)) value = parse_boolean(text);
  if (!value && (types & kSchemaObject)) value = parse_container(text, true);
  if (!value && (types & kSchemaArray)) value = parse_container(text, false);
  if (value) return value;
  return OrderedJson(std::string(raw));
}

}  // namespace lily

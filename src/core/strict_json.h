// Strict JSON parsing: nesting-depth cap, duplicate keys rejected, typed field access.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lily {

using Json = nlohmann::json;
// Keeps object keys in document order (Json sorts them): for values re-serialized to the model,
// such as tool schemas and tool-call arguments, where the order is part of the prompt.
using OrderedJson = nlohmann::ordered_json;

// Parses `text` (which must be valid UTF-8 JSON). Rejects nesting deeper than
// `max_depth`, duplicate keys in any object, and trailing garbage. `what` names the
// source in error messages (e.g. "config.json"). Throws InputError.
Json parse_strict_json(std::string_view text, std::string_view what, int max_depth);
// The same rules, keys kept in document order.
OrderedJson parse_strict_ordered_json(std::string_view text, std::string_view what, int max_depth);

// Reads the whole file at `path` (at most `max_bytes`) and parses it strictly.
Json read_strict_json_file(const std::string& path, uint64_t max_bytes, int max_depth);

// Short human description of a JSON value's type and content for error messages,
// e.g. `number 256` or `string "foo"` (long values are cut).
std::string describe_json(const Json& value);
std::string describe_json(const OrderedJson& value);

// Typed access. `where` is the dotted path used in messages ("config.json: text_config").
// Each throws InputError naming the field, the expected type and what was found.
const Json& require_field(const Json& object, std::string_view key, std::string_view where);
uint64_t require_uint(const Json& object, std::string_view key, std::string_view where);
double require_number(const Json& object, std::string_view key, std::string_view where);
bool require_bool(const Json& object, std::string_view key, std::string_view where);
std::string require_string(const Json& object, std::string_view key, std::string_view where);
uint64_t as_uint(const Json& value, std::string_view where);

}  // namespace lily

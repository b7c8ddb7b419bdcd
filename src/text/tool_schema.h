// Tool-call parameter values by the tool's JSON schema: the raw text of one XML parameter -> JSON.
#pragma once

#include <optional>
#include <string_view>

#include "core/strict_json.h"

namespace lily {

// The JSON types a parameter's schema admits, as a set of bits.
enum SchemaType : unsigned {
  kSchemaString = 1u << 0,
  kSchemaInteger = 1u << 1,
  kSchemaNumber = 1u << 2,
  kSchemaBoolean = 1u << 3,
  kSchemaObject = 1u << 4,
  kSchemaArray = 1u << 5,
  kSchemaNull = 1u << 6,
};

// The types `schema` admits: its "type" (a name or an array of names, with vLLM's aliases
// such as "str", "int32", "float", "bool", "dict", "list"; an unknown name counts as
// string), the union over "anyOf", "oneOf" and "allOf" branches, local "$ref"s ("#",
// "#/$defs/X", "#/definitions/X", any JSON pointer into `root`) and, for a schema that names
// no type, the types of its "enum"/"const" values ("properties" means object, "items"
// array). 0: the schema says nothing (absent, not an object, or no type information).
// `root`: the tool's whole parameters schema, what "$ref"s point into. Never throws; cycles
// and deep nesting stop at a fixed depth.
unsigned schema_types(const OrderedJson& schema, const OrderedJson& root);

// Converts the raw text of parameter `key` (one leading and one trailing '\n' already
// stripped) by `parameters`, the tool's JSON schema (null: none given or an unknown tool):
//   no schema for the key, or no type information: the raw text as a string;
//   only string-like types: the raw text;
//   otherwise, on the text with surrounding whitespace trimmed:
//     `null` -> null;  empty -> nullopt (drop the parameter) unless a string is admitted;
//     then the admitted non-string types in this fixed order: integer (an optional '-' and
//     digits, in 64 bits), number (JSON number syntax, finite; an integral value within
//     int64 becomes an integer, as vLLM), boolean ("true"/"false", any case), object, array
//     (the text parsed as JSON of that kind);
//     and when none fits, the raw text as a string.
// Never double-encodes (an Optional[int] "5" is 5, not "5") and never throws.
std::optional<OrderedJson> convert_parameter_value(const OrderedJson& parameters, std::string_view key,
                                                   std::string_view raw);

}  // namespace lily

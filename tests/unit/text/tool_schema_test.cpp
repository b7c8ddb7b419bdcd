// Tool-call parameter values by JSON schema: each type, unions, $ref, null, empty and bad values.
//
// Expected values are written by hand from the conversion rules (tool_schema.h), which follow
// vLLM's qwen3coder parser with the fixes named in docs/output-parsing.md.
#include "text/tool_schema.h"

#include <gtest/gtest.h>

namespace lily {
namespace {

const OrderedJson& schema() {
  static const OrderedJson s = OrderedJson::parse(R"({
    "type": "object",
    "properties": {
      "s": {"type": "string"},
      "i": {"type": "integer"},
      "n": {"type": "number"},
      "b": {"type": "boolean"},
      "o": {"type": "object"},
      "a": {"type": "array"},
      "opt_int": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
      "str_or_int": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
      "opt_str": {"anyOf": [{"type": "string"}, {"type": "null"}]},
      "int_or_null": {"type": ["integer", "null"]},
      "num_or_bool": {"type": ["boolean", "number"]},
      "count": {"$ref": "#/$defs/Count"},
      "flag": {"$ref": "#/definitions/Flag"},
      "opt_ref": {"anyOf": [{"$ref": "#/$defs/Count"}, {"type": "null"}]},
      "missing_ref": {"$ref": "#/$defs/Nope"},
      "remote_ref": {"$ref": "https://example.com/schema.json"},
      "bad_pointer": {"$ref": "#/$defs/~2"},
      "cycle": {"$ref": "#/$defs/Loop"},
      "int_enum": {"enum": [1, 2, 3]},
      "str_enum": {"enum": ["c", "f"]},
      "const_true": {"const": true},
      "nested": {"properties": {"x": {"type": "integer"}}},
      "list_items": {"items": {"type": "string"}},
      "alias_int": {"type": "int32"},
      "alias_float": {"type": "float"},
      "alias_bool": {"type": "bool"},
      "alias_dict": {"type": "dict"},
      "alias_list": {"type": "list"},
      "alias_str": {"type": "str"},
      "odd_type": {"type": "any"},
      "untyped": {"description": "anything"},
      "not_a_schema": 5,
      "null_only": {"type": "null"}
    },
    "$defs": {"Count": {"type": "integer", "minimum": 0}, "Loop": {"$ref": "#/$defs/Loop"}},
    "definitions": {"Flag": {"type": "boolean"}}
  })");
  return s;
}

// The converted value as compact JSON, or "<dropped>".
std::string convert(std::string_view key, std::string_view raw, const OrderedJson& parameters = schema()) {
  const std::optional<OrderedJson> value = convert_parameter_value(parameters, key, raw);
  return value ? value->dump() : "<dropped>";
}

TEST(ToolSchema, Strings) {
  EXPECT_EQ(convert("s", "5"), R"("5")");
  EXPECT_EQ(convert("s", " two words \n"), R"(" two words \n")");  // raw: nothing trimmed
  EXPECT_EQ(convert("s", "null"), R"("null")");
  EXPECT_EQ(convert("s", ""), R"("")");
  EXPECT_EQ(convert("s", "{\"a\": 1}"), R"("{\"a\": 1}")");
}

TEST(ToolSchema, Integers) {
  EXPECT_EQ(convert("i", "5"), "5");
  EXPECT_EQ(convert("i", " -12\n"), "-12");
  EXPECT_EQ(convert("i", "007"), "7");
  EXPECT_EQ(convert("i", "12345678901234567890"), "12345678901234567890");  // uint64
  EXPECT_EQ(convert("i", "99999999999999999999"), R"("99999999999999999999")");
  EXPECT_EQ(convert("i", "5.0"), R"("5.0")");
  EXPECT_EQ(convert("i", "1e3"), R"("1e3")");
  EXPECT_EQ(convert("i", "+5"), R"("+5")");
  EXPECT_EQ(convert("i", "-"), R"("-")");
  EXPECT_EQ(convert("i", "five"), R"("five")");
  EXPECT_EQ(convert("i", "null"), "null");
  EXPECT_EQ(convert("i", ""), "<dropped>");
  EXPECT_EQ(convert("i", " \n "), "<dropped>");
}

TEST(ToolSchema, Numbers) {
  EXPECT_EQ(convert("n", "1.5"), "1.5");
  EXPECT_EQ(convert("n", "-0.25"), "-0.25");
  EXPECT_EQ(convert("n", "3"), "3");
  EXPECT_EQ(convert("n", "3.0"), "3");  // integral: an integer, as vLLM
  EXPECT_EQ(convert("n", "1e3"), "1000");
  EXPECT_EQ(convert("n", "2.5E-1"), "0.25");
  EXPECT_EQ(convert("n", "1e300"), "1e+300");
  EXPECT_EQ(convert("n", "1e400"), R"("1e400")");  // not finite
  EXPECT_EQ(convert("n", ".5"), R"(".5")");
  EXPECT_EQ(convert("n", "1."), R"("1.")");
  EXPECT_EQ(convert("n", "NaN"), R"("NaN")");
  EXPECT_EQ(convert("n", "0x10"), R"("0x10")");
  EXPECT_EQ(convert("n", "12 apples"), R"("12 apples")");
  EXPECT_EQ(convert("n", "null"), "null");
  EXPECT_EQ(convert("n", ""), "<dropped>");
}

TEST(ToolSchema, Booleans) {
  EXPECT_EQ(convert("b", "true"), "true");
  EXPECT_EQ(convert("b", "False"), "false");
  EXPECT_EQ(convert("b", " TRUE\n"), "true");
  EXPECT_EQ(convert("b", "yes"), R"("yes")");  // not false (vLLM made it false)
  EXPECT_EQ(convert("b", "1"), R"("1")");
  EXPECT_EQ(convert("b", "null"), "null");
  EXPECT_EQ(convert("b", ""), "<dropped>");
}

TEST(ToolSchema, ObjectsAndArrays) {
  EXPECT_EQ(convert("o", "{\"b\": 1, \"a\": [true, null]}"), R"({"b":1,"a":[true,null]})");  // key order kept
  EXPECT_EQ(convert("o", " {} "), "{}");
  EXPECT_EQ(convert("o", "[1]"), R"("[1]")");
  EXPECT_EQ(convert("o", "{bad"), R"("{bad")");
  EXPECT_EQ(convert("o", "{\"a\": 1, \"a\": 2}"), R"("{\"a\": 1, \"a\": 2}")");  // duplicate keys
  EXPECT_EQ(convert("o", "{'a': 1}"), R"("{'a': 1}")");  // Python literals are not JSON
  EXPECT_EQ(convert("a", "[1, \"x\"]"), R"([1,"x"])");
  EXPECT_EQ(convert("a", "{}"), R"("{}")");
  EXPECT_EQ(convert("a", "[1,"), R"("[1,")");
  EXPECT_EQ(convert("a", "null"), "null");
  EXPECT_EQ(convert("a", ""), "<dropped>");
  // Deeper than the nesting cap (32): kept as text rather than parsed.
  const std::string deep = std::string(40, '[') + std::string(40, ']');
  EXPECT_EQ(convert("a", deep), "\"" + deep + "\"");
  const std::string ok = std::string(20, '[') + std::string(20, ']');
  EXPECT_EQ(convert("a", ok), ok);
}

TEST(ToolSchema, UnionsAreNotDoubleEncoded) {  // vLLM PRs #36032, #37831
  EXPECT_EQ(convert("opt_int", "5"), "5");
  EXPECT_EQ(convert("opt_int", "null"), "null");
  EXPECT_EQ(convert("opt_int", "x"), R"("x")");
  EXPECT_EQ(convert("opt_int", ""), "<dropped>");
  EXPECT_EQ(convert("int_or_null", "-3"), "-3");
  EXPECT_EQ(convert("int_or_null", "null"), "null");
  // Non-string candidates first, then the string.
  EXPECT_EQ(convert("str_or_int", "5"), "5");
  EXPECT_EQ(convert("str_or_int", "abc"), R"("abc")");
  EXPECT_EQ(convert("str_or_int", ""), R"("")");  // a string is admitted: not dropped
  EXPECT_EQ(convert("opt_str", "null"), "null");
  EXPECT_EQ(convert("opt_str", "hello"), R"("hello")");
  EXPECT_EQ(convert("opt_str", " "), R"(" ")");
  // Fixed order: integer, number, boolean, object, array.
  EXPECT_EQ(convert("num_or_bool", "true"), "true");
  EXPECT_EQ(convert("num_or_bool", "2.5"), "2.5");
  EXPECT_EQ(convert("num_or_bool", "maybe"), R"("maybe")");
}

TEST(ToolSchema, References) {
  EXPECT_EQ(convert("count", "7"), "7");
  EXPECT_EQ(convert("flag", "TRUE"), "true");
  EXPECT_EQ(convert("opt_ref", "8"), "8");
  EXPECT_EQ(convert("opt_ref", "null"), "null");
  // Unresolvable references say nothing: the text stays a string, and nothing throws.
  EXPECT_EQ(convert("missing_ref", "7"), R"("7")");
  EXPECT_EQ(convert("remote_ref", "7"), R"("7")");
  EXPECT_EQ(convert("bad_pointer", "7"), R"("7")");
  EXPECT_EQ(convert("cycle", "7"), R"("7")");
}

TEST(ToolSchema, InferredAndAliasedTypes) {
  EXPECT_EQ(convert("int_enum", "2"), "2");
  EXPECT_EQ(convert("str_enum", "c"), R"("c")");
  EXPECT_EQ(convert("const_true", "true"), "true");
  EXPECT_EQ(convert("nested", "{\"x\": 1}"), R"({"x":1})");
  EXPECT_EQ(convert("list_items", "[\"a\"]"), R"(["a"])");
  EXPECT_EQ(convert("alias_int", "42"), "42");
  EXPECT_EQ(convert("alias_float", "0.5"), "0.5");
  EXPECT_EQ(convert("alias_bool", "false"), "false");
  EXPECT_EQ(convert("alias_dict", "{}"), "{}");
  EXPECT_EQ(convert("alias_list", "[]"), "[]");
  EXPECT_EQ(convert("alias_str", "42"), R"("42")");
  EXPECT_EQ(convert("odd_type", "42"), R"("42")");
  EXPECT_EQ(convert("null_only", "null"), "null");
  EXPECT_EQ(convert("null_only", "x"), R"("x")");
}

TEST(ToolSchema, NoSchemaMeansString) {
  EXPECT_EQ(convert("untyped", "42"), R"("42")");
  EXPECT_EQ(convert("not_a_schema", "42"), R"("42")");
  EXPECT_EQ(convert("unknown_key", "42"), R"("42")");
  EXPECT_EQ(convert("i", "42", OrderedJson()), R"("42")");             // no parameters schema
  EXPECT_EQ(convert("i", "42", OrderedJson::array()), R"("42")");      // not an object
  EXPECT_EQ(convert("i", "42", OrderedJson::parse(R"({"properties": 1})")), R"("42")");
  EXPECT_EQ(convert("unknown_key", ""), R"("")");
}

TEST(ToolSchema, SchemaTypes) {
  const OrderedJson& root = schema();
  const OrderedJson& p = root["properties"];
  EXPECT_EQ(schema_types(p["s"], root), unsigned{kSchemaString});
  EXPECT_EQ(schema_types(p["opt_int"], root), unsigned{kSchemaInteger | kSchemaNull});
  EXPECT_EQ(schema_types(p["num_or_bool"], root), unsigned{kSchemaNumber | kSchemaBoolean});
  EXPECT_EQ(schema_types(p["opt_ref"], root), unsigned{kSchemaInteger | kSchemaNull});
  EXPECT_EQ(schema_types(p["int_enum"], root), unsigned{kSchemaInteger});
  EXPECT_EQ(schema_types(p["cycle"], root), 0u);
  EXPECT_EQ(schema_types(p["untyped"], root), 0u);
  EXPECT_EQ(schema_types(OrderedJson(true), root), 0u);
  EXPECT_EQ(schema_types(OrderedJson::parse(R"({"$ref": "#"})"), root), unsigned{kSchemaObject});
}

}  // namespace
}  // namespace lily

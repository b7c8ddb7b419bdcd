// Tests for python_json: expected texts are what CPython 3's repr() and json.dumps print.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/strict_json.h"
#include "text/python_json.h"

namespace lily {
namespace {

std::string dumps_text(const char* json_text) {
  return python_json_dumps(parse_strict_ordered_json(json_text, "test", 32));
}

TEST(PythonFloatRepr, ShortestRoundTripDigitsInPythonsLayout) {
  // Integral floats keep ".0"; fixed notation for decimal exponents -4 <= e < 16.
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(100.0), "100.0");
  EXPECT_EQ(python_float_repr(0.0), "0.0");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(1.5), "1.5");
  EXPECT_EQ(python_float_repr(-2.25), "-2.25");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(python_float_repr(123.456), "123.456");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.00012), "0.00012");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(9007199254740993.0), "9007199254740992.0");
  EXPECT_EQ(python_float_repr(1234567890123456.7), "1234567890123456.8");
  // Scientific otherwise: a sign and at least two exponent digits, no ".0" on one digit.
  EXPECT_EQ(python_float_repr(0.00001), "1e-05");
  EXPECT_EQ(python_float_repr(2.5e-05), "2.5e-05");
  EXPECT_EQ(python_float_repr(1e-07), "1e-07");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e22), "1e+22");
  EXPECT_EQ(python_float_repr(-1.5e300), "-1.5e+300");
  EXPECT_EQ(python_float_repr(123456789012345680.0), "1.2345678901234568e+17");
  EXPECT_EQ(python_float_repr(5e-324), "5e-324");
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::max()), "1.7976931348623157e+308");
  EXPECT_EQ(python_float_repr(2.2250738585072014e-308), "2.2250738585072014e-308");
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(python_float_repr(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(python_float_repr(std::nan("")), "nan");
}

TEST(PythonJsonDumps, SeparatorsAndKeyOrder) {
  EXPECT_EQ(dumps_text(R"({"b":1,"a":[1,2.0,"x"],"c":{},"d":[],"e":[[]]})"),
            R"({"b": 1, "a": [1, 2.0, "x"], "c": {}, "d": [], "e": [[]]})");
  EXPECT_EQ(dumps_text(R"({"z": {"y": {"x": null}}, "t": true, "f": false})"),
            R"({"z": {"y": {"x": null}}, "t": true, "f": false})");
  EXPECT_EQ(dumps_text("[]"), "[]");
  EXPECT_EQ(dumps_text("{}"), "{}");
  EXPECT_EQ(dumps_text("null"), "null");
}

TEST(PythonJsonDumps, NumbersAsPythonReadsThemFromJsonText) {
  // json.loads keeps integers as int and numbers with '.' or an exponent as float.
  EXPECT_EQ(dumps_text("[10, -7, 1.0, 1E+2, 1e-5, 2.50, 0.5e1, -0, -0.0, 1e16, 1e15]"),
            "[10, -7, 1.0, 100.0, 1e-05, 2.5, 5.0, 0, -0.0, 1e+16, 1000000000000000.0]");
  EXPECT_EQ(dumps_text("[9223372036854775807, -9223372036854775808, 18446744073709551615]"),
            "[9223372036854775807, -9223372036854775808, 18446744073709551615]");
  EXPECT_EQ(python_json_dumps(OrderedJson(std::numeric_limits<double>::infinity())), "Infinity");
  EXPECT_EQ(python_json_dumps(OrderedJson(-std::numeric_limits<double>::infinity())), "-Infinity");
  EXPECT_EQ(python_json_dumps(OrderedJson(std::nan(""))), "NaN");
}

// Where reading numbers with nlohmann departs from Python's json.loads (docs/chat-format.md §5):
// pinned so that a change is noticed and the documentation updated.
TEST(PythonJsonDumps, DocumentedLimitsOfReadingNumbers) {
  // Python keeps the integer exactly (100000000000000000000); nlohmann reads it as a double.
  EXPECT_EQ(dumps_text("100000000000000000000"), "1e+20");
  // Python reads 1e400 as inf (json.dumps: Infinity); nlohmann refuses it.
  EXPECT_THROW(dumps_text("1e400"), InputError);
}

TEST(PythonJsonDumps, StringEscapes) {
  // ensure_ascii=False: only '"', '\\' and U+0000-U+001F are escaped; '/', DEL, U+2028 and
  // every non-ASCII character are written as they are.
  EXPECT_EQ(python_json_dumps(OrderedJson("a\"b\\c/d")), R"("a\"b\\c/d")");
  EXPECT_EQ(python_json_dumps(OrderedJson("\n\r\t\b\f")), R"("\n\r\t\b\f")");
  EXPECT_EQ(python_json_dumps(OrderedJson(std::string("\x00\x01\x1b\x1f\x7f", 5))),
            "\"\\u0000\\u0001\\u001b\\u001f\x7f\"");
  EXPECT_EQ(python_json_dumps(OrderedJson("é日本😀\u2028\u00a0")), "\"é日本😀\u2028\u00a0\"");
  EXPECT_EQ(dumps_text(R"({"k\"ey\n": "v\u0000"})"), R"({"k\"ey\n": "v\u0000"})");
  EXPECT_EQ(dumps_text(R"(["\u00e9\ud83d\ude00"])"), "[\"é😀\"]");
}

TEST(PythonJsonDumps, BinaryIsRefused) {
  EXPECT_THROW(python_json_dumps(OrderedJson::binary({1, 2})), InputError);
}

}  // namespace
}  // namespace lily

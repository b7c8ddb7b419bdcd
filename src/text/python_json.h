// Python's json.dumps(x, ensure_ascii=False) for nlohmann JSON: the template's `tojson` text.
#pragma once

#include <string>

#include "core/strict_json.h"

namespace lily {

// Python's repr(float): the shortest digits that round-trip, fixed notation for decimal
// exponents -4 <= e < 16 ("1.0", "0.0001", "1000000000000000.0", "-0.0") and scientific
// otherwise, with a sign and at least two exponent digits ("1e-05", "1e+16", "1.5e+300").
// Non-finite values give "inf", "-inf" and "nan".
std::string python_float_repr(double value);

// What transformers' `tojson` filter renders: json.dumps(value, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False). Separators ", " and ": ", keys in the
// object's order, integers exact, floats as python_float_repr (non-finite: Infinity,
// -Infinity, NaN, as json.dumps's default allow_nan writes them), strings with only `"`, `\`
// and U+0000-U+001F escaped (\n \r \t \b \f by name, the rest as \u00xx, lowercase hex) and
// every other byte copied (UTF-8 stays UTF-8). Binary values (never produced by parsing JSON
// text) throw InputError.
std::string python_json_dumps(const OrderedJson& value);
void append_python_json(std::string& out, const OrderedJson& value);

}  // namespace lily

// Python's json.dumps(x, ensure_ascii=False) for nlohmann JSON: the template's `tojson` text.
//
// Python's json module (Lib/json/encoder.py, Modules/_json.c) is the reference: float.__repr__
// for floats (Python/pystrtod.c, format code 'r'), ESCAPE_DCT for strings.
#include "text/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"

namespace lily {

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // std::to_chars without a precision gives the shortest digits that round-trip (the same
  // digits as Python's repr, which also takes the nearest of the shortest candidates).
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const std::string_view sci(buffer, static_cast<size_t>(result.ptr - buffer));
  // sci is "[-]d[.ddd]e(+|-)dd".
  std::string out;
  size_t pos = 0;
  if (!sci.empty() && sci[0] == '-') {
    out.push_back('-');
    pos = 1;
  }
  const size_t e_at = sci.find('e', pos);
  std::string digits;
  for (size_t i = pos; i < e_at; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exponent = std::atoi(std::string(sci.substr(e_at + 1)).c_str());
  // Python's decpt: value = 0.<digits> * 10^decpt.
  const int decpt = exponent + 1;
  const int ndigits = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (ndigits > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    out.push_back('e');
    out.push_back(exponent < 0 ? '-' : '+');
    const int magnitude = exponent < 0 ? -exponent : exponent;
    if (magnitude < 10) out.push_back('0');
    out += std::to_string(magnitude);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= ndigits) {
    out += digits;
    out.append(static_cast<size_t>(decpt - ndigits), '0');
    out += ".0";
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(decpt), std::string::npos);
  }
  return out;
}

namespace {

void append_string(std::string& out, const std::string& text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (byte < 0x20) {
          out += "\\u00";
          out.push_back(kHex[byte >> 4]);
          out.push_back(kHex[byte & 0xF]);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

}  // namespace

void append_python_json(std::string& out, const OrderedJson& value) {
  switch (value.type()) {
    case OrderedJson::value_t::null:
      out += "null";
      return;
    case OrderedJson::value_t::boolean:
      out += value.get<bool>() ? "true" : "false";
      return;
    case OrderedJson::value_t::number_integer:
      out += std::to_string(value.get<int64_t>());
      return;
    case OrderedJson::value_t::number_unsigned:
      out += std::to_string(value.get<uint64_t>());
      return;
    case OrderedJson::value_t::number_float: {
      const double d = value.get<double>();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        out += python_float_repr(d);
      }
      return;
    }
    case OrderedJson::value_t::string:
      append_string(out, value.get_ref<const std::string&>());
      return;
    case OrderedJson::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const OrderedJson& item : value) {
        if (!first) out += ", ";
        first = false;
        append_python_json(out, item);
      }
      out.push_back(']');
      return;
    }
    case OrderedJson::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        append_string(out, key);
        out += ": ";
        append_python_json(out, item);
      }
      out.push_back('}');
      return;
    }
    case OrderedJson::value_t::binary:
    case OrderedJson::value_t::discarded:
      break;
  }
  throw InputError(std::string("tojson: cannot serialize a JSON value of type ") +
                   value.type_name() +
                   " (expected null, a boolean, number, string, array or object)");
}

std::string python_json_dumps(const OrderedJson& value) {
  std::string out;
  append_python_json(out, value);
  return out;
}

}  // namespace lily

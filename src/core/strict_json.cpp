// Strict JSON parsing: nesting-depth cap, duplicate keys rejected, typed field access.
#include "core/strict_json.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace lily {

namespace {

// Raised inside the parser callback; converted to InputError with context below.
struct StrictnessViolation {
  std::string message;
};

std::string join(std::string_view a, std::string_view b) {
  std::string out(a);
  out += ": ";
  out += b;
  return out;
}

template <typename J>
J parse_strict(std::string_view text, std::string_view what, int max_depth) {
  // nlohmann's lexer takes a NUL byte for the end of input and ignores what follows; a raw
  // NUL is never valid JSON (control characters must be escaped), so refuse it here.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    throw InputError(join(what, "not valid JSON: NUL byte at offset " + std::to_string(nul)));
  }
  // One set of seen keys per open object; the parser is iterative, so the depth cap
  // bounds this stack and the DOM, not the C++ call stack.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int depth, typename J::parse_event_t event, J& parsed) {
    switch (event) {
      case J::parse_event_t::object_start:
      case J::parse_event_t::array_start:
        if (depth >= max_depth) {
          throw StrictnessViolation{"JSON nesting deeper than " + std::to_string(max_depth) +
                                    " levels"};
        }
        if (event == J::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case J::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case J::parse_event_t::key: {
        const std::string& key = parsed.template get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second) {
          throw StrictnessViolation{"duplicate key \"" + key + "\""};
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return J::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                    /*ignore_comments=*/false);
  } catch (const StrictnessViolation& violation) {
    throw InputError(join(what, violation.message));
  } catch (const typename J::exception& error) {
    throw InputError(join(what, std::string("not valid JSON: ") + error.what()));
  }
}

template <typename J>
std::string describe(const J& value) {
  std::string dumped = value.dump(-1, ' ', false, J::error_handler_t::replace);
  if (dumped.size() > 60) dumped = dumped.substr(0, 57) + "...";
  return std::string(value.type_name()) + " " + dumped;
}

}  // namespace

Json parse_strict_json(std::string_view text, std::string_view what, int max_depth) {
  return parse_strict<Json>(text, what, max_depth);
}

OrderedJson parse_strict_ordered_json(std::string_view text, std::string_view what, int max_depth) {
  return parse_strict<OrderedJson>(text, what, max_depth);
}

Json read_strict_json_file(const std::string& path, uint64_t max_bytes, int max_depth) {
  // Opening a FIFO would block and a directory reports a bogus size: refuse both first.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw InputError(path + ": not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open " + path);
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw InputError("cannot read " + path);
  if (static_cast<uint64_t>(size) > max_bytes) {
    throw InputError(path + ": file is " + std::to_string(size) + " bytes, expected at most " +
                     std::to_string(max_bytes));
  }
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.read(text.data(), size)) throw InputError("cannot read " + path);
  return parse_strict_json(text, path, max_depth);
}

std::string describe_json(const Json& value) { return describe(value); }

std::string describe_json(const OrderedJson& value) { return describe(value); }

const Json& require_field(const Json& object, std::string_view key, std::string_view where) {
  if (!object.is_object()) {
    throw InputError(std::string(where) + " is " + describe_json(object) + ", expected an object");
  }
  auto it = object.find(key);
  if (it == object.end()) {
    throw InputError(std::string(where) + "." + std::string(key) + " is missing");
  }
  return *it;
}

uint64_t as_uint(const Json& value, std::string_view where) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  throw InputError(std::string(where) + " is " + describe_json(value) +
                   ", expected a non-negative integer");
}

uint64_t require_uint(const Json& object, std::string_view key, std::string_view where) {
  return as_uint(require_field(object, key, where), std::string(where) + "." + std::string(key));
}

double require_number(const Json& object, std::string_view key, std::string_view where) {
  const Json& value = require_field(object, key, where);
  if (!value.is_number()) {
    throw InputError(std::string(where) + "." + std::string(key) + " is " + describe_json(value) +
                     ", expected a number");
  }
  return value.get<double>();
}

bool require_bool(const Json& object, std::string_view key, std::string_view where) {
  const Json& value = require_field(object, key, where);
  if (!value.is_boolean()) {
    throw InputError(std::string(where) + "." + std::string(key) + " is " + describe_json(value) +
                     ", expected true or false");
  }
  return value.get<bool>();
}

std::string require_string(const Json& object, std::string_view key, std::string_view where) {
  const Json& value = require_field(object, key, where);
  if (!value.is_string()) {
    throw InputError(std::string(where) + "." + std::string(key) + " is " + describe_json(value) +
                     ", expected a string");
  }
  return value.get<std::string>();
}

}  // namespace lily

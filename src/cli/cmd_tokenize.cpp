// `lily tokenize --tokenizer FILE [--decode]`: JSON lines of text to token ids, or back.
#include <charconv>
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/strict_json.h"
#include "text/tokenizer.h"

namespace lily {

namespace {

// Nesting cap for one input line: a string, or a flat array of ids.
constexpr int kLineDepth = 4;

std::string dump_string(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// One input line -> one output line (without the newline). Throws InputError.
std::string encode_line(const Tokenizer& tokenizer, const std::string& line, const std::string& where) {
  const Json value = parse_strict_json(line, where, kLineDepth);
  if (!value.is_string()) {
    throw InputError(where + " is " + describe_json(value) + ", expected a JSON string");
  }
  std::vector<uint32_t> ids;
  try {
    tokenizer.encode(value.get_ref<const std::string&>(), ids);
  } catch (const InputError& error) {
    throw InputError(where + ": " + error.what());
  }
  std::string out = "[";
  char buffer[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i != 0) out += ',';
    const auto result = std::to_chars(buffer, buffer + sizeof(buffer), ids[i]);
    out.append(buffer, result.ptr);
  }
  out += ']';
  return out;
}

std::string decode_line(const Tokenizer& tokenizer, const std::string& line, const std::string& where) {
  const Json value = parse_strict_json(line, where, kLineDepth);
  if (!value.is_array()) {
    throw InputError(where + " is " + describe_json(value) + ", expected a JSON array of token ids");
  }
  std::vector<uint32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const Json& id = value[i];
    if (!id.is_number_unsigned() || id.get<uint64_t>() > UINT32_MAX) {
      throw InputError(where + ": entry " + std::to_string(i) + " is " + describe_json(id) +
                       ", expected a token id (an integer 0..4294967295)");
    }
    ids.push_back(static_cast<uint32_t>(id.get<uint64_t>()));
  }
  return dump_string(tokenizer.decode(ids, /*skip_special_tokens=*/true));
}

}  // namespace

// stdin: one JSON value per line; stdout: exactly one line per input line, in order.
//   encode (default): a JSON string -> a JSON array of ids (no special tokens added;
//     special-token text such as "<|im_end|>" inside the string is matched).
//   --decode: a JSON array of ids -> a JSON string, special tokens skipped; ids the
//     tokenizer does not know are dropped, as HF tokenizers' decode does.
// A line that cannot be handled (not JSON, wrong type, a bad id, text that is not valid
// UTF-8) gives the line {"error": "line N: ..."} and processing goes on, so no other
// line is lost. The exit code is then 2 with a summary on stderr; otherwise 0.
int cmd_tokenize(const std::vector<std::string>& argv) {
  const std::vector<OptionSpec> spec = {
      {"tokenizer", true, "path of tokenizer.json (required)"},
      {"decode", false, "read arrays of ids and write text (special tokens skipped)"},
  };
  const Args args(argv, spec);
  const Tokenizer tokenizer = Tokenizer::from_file(args.required("tokenizer"));
  const bool decode = args.has("decode");

  std::ios::sync_with_stdio(false);  // std::cin only; output goes through stdio's stdout
  std::string line;
  uint64_t line_number = 0;
  uint64_t bad_lines = 0;
  std::string first_error;
  while (std::getline(std::cin, line)) {
    ++line_number;
    const std::string where = "line " + std::to_string(line_number);
    std::string out;
    try {
      out = decode ? decode_line(tokenizer, line, where) : encode_line(tokenizer, line, where);
    } catch (const InputError& error) {
      ++bad_lines;
      if (first_error.empty()) first_error = error.what();
      out = Json{{"error", error.what()}}.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    out += '\n';
    if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
      std::fputs("error: cannot write to standard output\n", stderr);
      return 1;
    }
  }
  if (bad_lines != 0) {
    std::fprintf(stderr, "error: %llu of %llu input lines could not be %s; first: %s\n",
                 static_cast<unsigned long long>(bad_lines),
                 static_cast<unsigned long long>(line_number), decode ? "decoded" : "tokenized",
                 first_error.c_str());
    return 2;
  }
  return 0;
}

}  // namespace lily

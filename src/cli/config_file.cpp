// Reads a config file of `name = value` lines (the TOML/INI subset CLI11's parser reads) for `lily serve --config`.
#include "cli/config_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace lily {

namespace {

// CLI11's reader ends a line at '#' even inside quotes, and takes an unclosed quote as
// running to the end of the line: `api-key = "a b#cd"` would silently serve the key "a b".
// Such lines are refused before it sees them.
void check_quotes(const std::string& path, const std::string& text) {
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    char quote = 0;
    for (const char c : line) {
      if (quote == 0 && c == '#') break;  // a comment: the rest of the line does not count
      if (quote == 0 && (c == '"' || c == '\'')) {
        quote = c;
      } else if (c == quote) {
        quote = 0;
      } else if (quote != 0 && c == '#') {
        throw InputError(path + ":" + std::to_string(number) +
                         ": '#' inside quotes; the config reader starts a comment there even "
                         "in a string, so set this value by its LILY_* variable or on the "
                         "command line");
      }
    }
    if (quote != 0) {
      throw InputError(path + ":" + std::to_string(number) + ": a quote (" + quote +
                       ") is not closed on its line");
    }
  }
}

}  // namespace

std::vector<ConfigEntry> read_config_file(const std::string& path) {
  std::error_code ec;
  // An ifstream opens a directory without complaint and then reads nothing: an empty config.
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError("config file " + path + ": not a readable regular file");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) throw InputError("config file " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw InputError("config file " + path + ": read error");
  check_quotes(path, text.str());
  std::istringstream in(text.str());
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_config(in);
  } catch (const CLI::Error& error) {
    throw InputError("config file " + path + ": " + error.what());
  }

  std::vector<ConfigEntry> entries;
  std::set<std::string> seen;
  for (const CLI::ConfigItem& item : items) {
    const std::string where = path + ": " + item.fullname();
    if (!item.parents.empty()) {
      throw InputError(path + ": section [" + item.parents.front() +
                       "] is not read; put every key at the top level (max-seq = 8192)");
    }
    // CLI11 merges a key repeated on consecutive lines into one list, and splits an unquoted
    // value at spaces.
    if (!seen.insert(item.name).second || item.inputs.size() > 1) {
      throw InputError(where +
                       " has more than one value, expected one (a key given twice, a "
                       "list, or an unquoted value with spaces)");
    }
    const std::string value = item.inputs.empty() ? std::string() : item.inputs.front();
    if (value.empty()) throw InputError(where + " is empty, expected a value");
    for (const char quote : {'"', '\''}) {
      if (value.front() == quote || value.back() == quote) {
        throw InputError(where + " is " + value + ", expected a value whose quotes pair up");
      }
    }
    entries.push_back({item.name, value});
  }
  return entries;
}

}  // namespace lily

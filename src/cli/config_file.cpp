// Reads a config file of `name = value` lines (the TOML/INI subset CLI11's parser reads) for `lily serve --config`.
#include "cli/config_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace lily {

std::vector<ConfigEntry> read_config_file(const std::string& path) {
  std::error_code ec;
  // An ifstream opens a directory without complaint and then reads nothing: an empty config.
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError("config file " + path + ": not a readable regular file");
  }
  std::ifstream in(path);
  if (!in) throw InputError("config file " + path + ": " + std::strerror(errno));
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_config(in);
  } catch (const CLI::Error& error) {
    throw InputError("config file " + path + ": " + error.what());
  }
  if (in.bad()) throw InputError("config file " + path + ": read error");

  std::vector<ConfigEntry> entries;
  std::set<std::string> seen;
  for (const CLI::ConfigItem& item : items) {
    const std::string where = path + ": " + item.fullname();
    if (!item.parents.empty()) {
      throw InputError(path + ": section [" + item.parents.front() +
                       "] is not read; put every key at the top level (max-seq = 8192)");
    }
    // CLI11 merges a key repeated on consecutive lines into one list.
    if (!seen.insert(item.name).second || item.inputs.size() > 1) {
      throw InputError(where + " has more than one value, expected one (a key given twice or "
                       "a list)");
    }
    const std::string value = item.inputs.empty() ? std::string() : item.inputs.front();
    if (value.empty()) throw InputError(where + " is empty, expected a value");
    // CLI11 ends a line at '#' even inside quotes, which leaves an unpaired quote behind:
    // refusing it beats serving with a silently cut API key.
    for (const char quote : {'"', '\''}) {
      if (value.front() == quote || value.back() == quote) {
        throw InputError(where + " is " + value +
                         ", expected a value whose quotes pair up ('#' starts a comment, even "
                         "inside quotes)");
      }
    }
    entries.push_back({item.name, value});
  }
  return entries;
}

}  // namespace lily

// Reads a config file of `name = value` lines (the TOML/INI subset CLI11's parser reads) for `lily serve --config`.
#pragma once

#include <string>
#include <vector>

namespace lily {

struct ConfigEntry {
  std::string key;    // as written, e.g. "max-seq"
  std::string value;  // quotes removed: `device = "cuda"` -> cuda
};

// Every `key = value` line of the file in order. Throws InputError naming `path` (and the
// key or line) when the file cannot be read, a key appears twice, a value is a list or empty,
// a quote is not closed on its line or holds a '#' (CLI11 would cut the value there), or a
// [section] appears (lily reads top-level keys only). Whether a key is known is the caller's
// question.
std::vector<ConfigEntry> read_config_file(const std::string& path);

}  // namespace lily

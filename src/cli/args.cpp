// Minimal command-line option parsing for the lily subcommands.
#include "cli/args.h"

#include <charconv>

#include "core/error.h"

namespace lily {

Args::Args(const std::vector<std::string>& argv, const std::vector<OptionSpec>& spec) {
  for (const std::string& arg : argv) {
    if (arg == "--help" || arg == "-h") {
      std::string text = "options:\n" + describe_options(spec);
      text += "  --help                    this list\n";
      throw HelpRequested(std::move(text));
    }
  }
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw InputError("unexpected argument \"" + arg + "\"; options are:\n" +
                       describe_options(spec));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> inline_value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const OptionSpec* option = nullptr;
    for (const OptionSpec& s : spec) {
      if (s.name == name) option = &s;
    }
    if (option == nullptr) {
      throw InputError("unknown option --" + name + "; options are:\n" + describe_options(spec));
    }
    if (values_.count(name) != 0) throw InputError("option --" + name + " is given twice");
    if (!option->takes_value) {
      if (inline_value) throw InputError("option --" + name + " takes no value");
      values_[name] = "";
      continue;
    }
    if (inline_value) {
      values_[name] = *inline_value;
    } else {
      if (i + 1 >= argv.size()) throw InputError("option --" + name + " needs a value");
      values_[name] = argv[++i];
    }
  }
}

std::string Args::required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw InputError("missing required option --" + name);
  return it->second;
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

uint64_t Args::uint_or(const std::string& name, uint64_t fallback, uint64_t min,
                       uint64_t max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw InputError("--" + name + " is \"" + text + "\", expected a non-negative integer");
  }
  if (value < min || value > max) {
    throw InputError("--" + name + " is " + text + ", expected a value in [" +
                     std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return value;
}

std::string describe_options(const std::vector<OptionSpec>& spec) {
  std::string out;
  for (const OptionSpec& s : spec) {
    std::string left = "  --" + s.name + (s.takes_value ? " VALUE" : "");
    if (left.size() < 26) left.resize(26, ' ');
    out += left + " " + s.help + "\n";
  }
  return out;
}

void check_device_option(const Args& args) {
  const std::string device = args.get("device").value_or("auto");
  if (device != "auto" && device != "cpu" && device != "cuda") {
    throw InputError("--device is \"" + device + "\", expected auto, cpu or cuda");
  }
}

}  // namespace lily

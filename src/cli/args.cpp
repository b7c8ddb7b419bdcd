// Command-line options of the lily subcommands (parsed by CLI11), plus serve's environment variables and config file.
#include "cli/args.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "cli/config_file.h"
#include "core/error.h"

namespace lily {

namespace {

const OptionSpec* find_option(const std::vector<OptionSpec>& spec, const std::string& name) {
  for (const OptionSpec& s : spec) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// A flag's value from the environment or a config file: 1/true sets it, 0/false leaves it off.
bool flag_value(const std::string& source, const std::string& text, const char* expected) {
  if (text == "1" || text == "true") return true;
  if (text == "0" || text == "false") return false;
  throw InputError(source + " is \"" + text + "\", expected " + expected);
}

}  // namespace

std::string environment_name(const std::string& prefix, const std::string& option) {
  std::string name = prefix;
  for (const char c : option) {
    name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

Args::Args(const std::vector<std::string>& argv, const std::vector<OptionSpec>& spec,
           const ArgSources& sources) {
  // --help wins over everything else on the line, even an unknown option before it, so it
  // is looked for before CLI11 sees the arguments.
  for (const std::string& arg : argv) {
    if (arg == "--help" || arg == "-h") {
      std::string text = "options:\n" + describe_options(spec, sources);
      text += "  --help                    this list\n";
      if (!sources.env_prefix.empty()) {
        text +=
            "\nEvery option but the ones marked [command line only] can also be set by the "
            "environment\nvariable in brackets";
        if (!sources.config_option.empty()) {
          text += " or by a key of the --" + sources.config_option +
                  " file (TOML/INI lines:\nmax-seq = 8192, device = \"cuda\", no-auth = true)";
        }
        text += ". Precedence: command line, then environment,\n";
        if (!sources.config_option.empty()) text += "then config file, ";
        text += "then the default (docs/cli.md).\n";
      }
      throw HelpRequested(std::move(text));
    }
  }

  // CLI11 reads the command line. Values are kept as text: each command converts them with
  // the ranges it needs (uint_or), and the messages name the option the way the user wrote it.
  // Options take 0 or 1 values and every occurrence is kept, so that a missing value or a
  // repeated option gets lily's own message instead of CLI11's, and so that `--api-key
  // --no-auth` is not read as the key "--no-auth".
  CLI::App app;
  app.set_help_flag();
  app.allow_extras();  // left over arguments are reported below, naming the first
  std::vector<std::pair<const OptionSpec*, CLI::Option*>> options;
  for (const OptionSpec& s : spec) {
    CLI::Option* option =
        s.takes_value ? app.add_option("--" + s.name)->expected(0, 1) : app.add_flag("--" + s.name);
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    options.emplace_back(&s, option);
  }
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 pops from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& error) {
    throw InputError(std::string("bad command line: ") + error.what());
  }
  if (const std::vector<std::string> extras = app.remaining(); !extras.empty()) {
    const std::string& arg = extras.front();
    if (arg.rfind("--", 0) == 0 && arg.size() > 2) {
      std::string message = "unknown option ";
      message += arg.substr(0, arg.find('='));
      throw InputError(message + "; options are:\n" + describe_options(spec, sources));
    }
    throw InputError("unexpected argument \"" + arg + "\"; options are:\n" +
                     describe_options(spec, sources));
  }
  for (const auto& [s, option] : options) {
    if (option->count() == 0) continue;
    const std::string flag = "--" + s->name;
    if (option->count() > 1) throw InputError("option " + flag + " is given twice");
    const std::vector<std::string>& results = option->results();
    if (!s->takes_value) {
      if (results.size() != 1 || results.front() != "true") {
        throw InputError("option " + flag + " takes no value");
      }
      values_[s->name] = {"", flag};
      continue;
    }
    // CLI11 records a missing value as "", so `--model ""` reads as a missing one too.
    if (results.empty() || results.front().empty()) {
      throw InputError("option " + flag + " needs a value");
    }
    values_[s->name] = {results.front(), flag};
  }

  // The environment fills what the command line left out; an empty variable counts as unset.
  if (!sources.env_prefix.empty()) {
    for (const OptionSpec& s : spec) {
      if (s.command_line_only || values_.count(s.name) != 0) continue;
      const std::string variable = environment_name(sources.env_prefix, s.name);
      const char* text = std::getenv(variable.c_str());
      if (text == nullptr || *text == '\0') continue;
      if (!s.takes_value) {
        if (flag_value(variable, text, "1, true, 0 or false")) values_[s.name] = {"", variable};
        continue;
      }
      values_[s.name] = {text, variable};
    }
  }

  // Then the config file, named by --config or its environment variable.
  if (sources.config_option.empty()) return;
  const auto config = values_.find(sources.config_option);
  if (config == values_.end()) return;
  const std::string path = config->second.text;
  for (const ConfigEntry& entry : read_config_file(path)) {
    const std::string where = path + ": " + entry.key;
    const OptionSpec* s = find_option(spec, entry.key);
    if (s == nullptr) {
      std::string keys;
      for (const OptionSpec& known : spec) {
        if (known.command_line_only || known.name == sources.config_option) continue;
        keys += keys.empty() ? "" : ", ";
        keys += known.name;
      }
      throw InputError(path + ": unknown key \"" + entry.key +
                       "\", expected one of the options without \"--\": " + keys);
    }
    if (s->command_line_only || s->name == sources.config_option) {
      throw InputError(where + " cannot be set in a config file, only on the command line");
    }
    if (values_.count(s->name) != 0) continue;  // the command line or environment won
    if (!s->takes_value) {
      if (flag_value(where, entry.value, "true or false")) values_[s->name] = {"", where};
      continue;
    }
    values_[s->name] = {entry.value, where};
  }
}

std::string Args::required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw InputError("missing required option --" + name);
  return it->second.text;
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second.text;
}

std::string Args::source(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return "--" + name;
  return it->second.source;
}

uint64_t Args::uint_or(const std::string& name, uint64_t fallback, uint64_t min,
                       uint64_t max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& text = it->second.text;
  const std::string& where = it->second.source;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw InputError(where + " is \"" + text + "\", expected a non-negative integer");
  }
  if (value < min || value > max) {
    throw InputError(where + " is " + text + ", expected a value in [" + std::to_string(min) +
                     ", " + std::to_string(max) + "]");
  }
  return value;
}

std::string describe_options(const std::vector<OptionSpec>& spec, const ArgSources& sources) {
  std::string out;
  for (const OptionSpec& s : spec) {
    std::string left = "  --" + s.name + (s.takes_value ? " VALUE" : "");
    if (left.size() < 26) left.resize(26, ' ');
    out += left + " " + s.help;
    if (!sources.env_prefix.empty() && s.command_line_only) {
      out += " [command line only]";
    } else if (!sources.env_prefix.empty()) {
      out += " [";
      out += environment_name(sources.env_prefix, s.name);
      out += "]";
    }
    out += "\n";
  }
  return out;
}

void check_device_option(const Args& args) {
  const std::string device = args.get("device").value_or("auto");
  if (device != "auto" && device != "cpu" && device != "cuda") {
    throw InputError(args.source("device") + " is \"" + device + "\", expected auto, cpu or cuda");
  }
  (void)cuda_options_from(args);
  (void)cpu_precision_from(args);
}

CpuPrecision cpu_precision_from(const Args& args) {
  const std::optional<std::string> text = args.get("cpu-precision");
  if (!text) return CpuPrecision::exact;
  if (args.get("device").value_or("auto") == "cuda") {
    throw InputError(args.source("cpu-precision") + " applies to the CPU backend, not --device cuda");
  }
  if (*text == "exact") return CpuPrecision::exact;
  if (*text == "fast") return CpuPrecision::fast;
  if (*text == "q8") return CpuPrecision::q8;
  throw InputError(args.source("cpu-precision") + " is \"" + *text +
                   "\", expected exact, fast or q8");
}

OptionSpec cpu_precision_option() {
  return {"cpu-precision", true,
          "CPU matrix products (decode and prefill): exact (f32, the default), fast (int8 dot "
          "products on two activation planes, about 5e-5 relative per dot) or q8 (one plane, "
          "llama.cpp's 8-bit activations: faster, about 4e-3 relative per dot); docs/precision.md"};
}

CudaOptions cuda_options_from(const Args& args) {
  const std::optional<std::string> list = args.get("cuda-disable");
  if (!list) return CudaOptions{};
  if (args.get("device").value_or("auto") == "cpu") {
    throw InputError(args.source("cuda-disable") + " applies to the CUDA backend, not --device cpu");
  }
  try {
    return CudaOptions::disabling(*list);
  } catch (const std::invalid_argument& e) {
    throw InputError(args.source("cuda-disable") + " is \"" + *list + "\": " + e.what());
  }
}

OptionSpec cuda_disable_option() {
  return {"cuda-disable", true,
          std::string("CUDA paths to switch off for comparison, comma-separated: ") +
              CudaOptions::names() + " (default: none; docs/cuda.md)"};
}

}  // namespace lily

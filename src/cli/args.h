// Minimal command-line option parsing for the lily subcommands.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lily {

struct OptionSpec {
  std::string name;  // without the leading "--"
  bool takes_value = true;
  std::string help;
};

// Thrown by Args when the command line holds --help (or -h): `text` is the option list; the
// entry point prints it with the command's synopsis and exits 0.
class HelpRequested : public std::exception {
 public:
  explicit HelpRequested(std::string text) : text_(std::move(text)) {}
  const char* what() const noexcept override { return text_.c_str(); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// Parsed `--name value` / `--flag` options. Unknown options, missing values and repeated
// options throw InputError (exit code 2); --help anywhere throws HelpRequested.
class Args {
 public:
  Args(const std::vector<std::string>& argv, const std::vector<OptionSpec>& spec);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string required(const std::string& name) const;
  std::optional<std::string> get(const std::string& name) const;
  // Integer option in [min, max]; `fallback` when absent.
  uint64_t uint_or(const std::string& name, uint64_t fallback, uint64_t min, uint64_t max) const;

 private:
  std::map<std::string, std::string> values_;
};

// --device: auto (default), cpu or cuda; anything else is refused with InputError before any
// loading starts (cli/backend_choice.h does the choosing).
void check_device_option(const Args& args);

// "  --name VALUE   help" lines for usage messages.
std::string describe_options(const std::vector<OptionSpec>& spec);

}  // namespace lily

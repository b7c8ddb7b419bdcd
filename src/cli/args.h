// Command-line options of the lily subcommands (parsed by CLI11), plus serve's environment variables and config file.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_options.h"

namespace lily {

struct OptionSpec {
  std::string name;  // without the leading "--"
  bool takes_value = true;
  std::string help;
  // Neither an environment variable nor a config key sets it (serve's --test-script: a test
  // hook must not switch on because a variable leaked into a production environment).
  bool command_line_only = false;
};

// Where values may come from besides the command line. Empty fields: the command line only.
// Precedence, highest first: command line, environment, config file, the command's default.
struct ArgSources {
  std::string env_prefix;     // "LILY_": --max-seq is also read from LILY_MAX_SEQ
  std::string config_option;  // "config": --config FILE names a TOML/INI file of `name = value`
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
// options throw InputError (exit code 2), and so do a bad environment variable or config
// file; --help anywhere on the command line throws HelpRequested.
class Args {
 public:
  Args(const std::vector<std::string>& argv, const std::vector<OptionSpec>& spec,
       const ArgSources& sources = {});

  // A flag counts as present when it is given and, from the environment or a config file,
  // true (1/true; 0/false leaves it off).
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string required(const std::string& name) const;
  std::optional<std::string> get(const std::string& name) const;
  // Integer option in [min, max]; `fallback` when absent.
  uint64_t uint_or(const std::string& name, uint64_t fallback, uint64_t min, uint64_t max) const;
  // Where the option's value came from, for error messages: "--max-seq", "LILY_MAX_SEQ" or
  // "lily.toml: max-seq"; "--max-seq" when it is absent.
  std::string source(const std::string& name) const;

 private:
  struct Value {
    std::string text;
    std::string source;
  };
  std::map<std::string, Value> values_;
};

// LILY_MAX_SEQ for ("LILY_", "max-seq"): upper case, '-' -> '_'.
std::string environment_name(const std::string& prefix, const std::string& option);

// --device: auto (default), cpu or cuda; anything else is refused with InputError before any
// loading starts (cli/backend_choice.h does the choosing). Checks --cuda-disable too
// (cuda_options_from).
void check_device_option(const Args& args);

// --cuda-disable LIST (run, serve, bench): the CUDA paths to switch off, comma separated
// (pdl, stream-gemv, fused-conv, moe-layer; absent: all on). An unknown name is an InputError naming the
// valid ones, and so is a list with --device cpu, where it could not apply.
CudaOptions cuda_options_from(const Args& args);

// The OptionSpec of --cuda-disable, for the commands that take it.
OptionSpec cuda_disable_option();

// --cpu-precision exact|fast|q8 (run, serve, bench): how the CPU backend computes its
// quantized matrix products (backend.h CpuPrecision; absent: exact). Anything else is an
// InputError, and so is the option with --device cuda, where it could not apply.
CpuPrecision cpu_precision_from(const Args& args);
OptionSpec cpu_precision_option();

// "  --name VALUE   help" lines for usage messages, each naming its environment variable
// when `sources` has a prefix.
std::string describe_options(const std::vector<OptionSpec>& spec, const ArgSources& sources = {});

}  // namespace lily

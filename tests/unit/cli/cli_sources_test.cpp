// Where `lily serve` takes its options from: the command line (CLI11), LILY_* variables, a --config file, and their precedence.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "unit/cli_runner.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

// Every run names a checkpoint that does not exist: a run that gets past option parsing
// (and past --bind) stops at loading with exit 2 instead of serving, so a test that fails
// fails quickly instead of hanging.
constexpr const char* kNoModel = "/nonexistent/lily-cli-sources-model";

// The variables these tests set, cleared first so that the caller's environment (a
// LILY_MODEL in a developer's shell) cannot decide a result.
const char* const kVariables[] = {"LILY_MODEL",       "LILY_BIND",       "LILY_MAX_SEQ",
                                  "LILY_STRICT",      "LILY_CONFIG",     "LILY_DEVICE",
                                  "LILY_TEST_SCRIPT", "LILY_NO_AUTH",    "LILY_API_KEY",
                                  "LILY_DATA_DIR",    "LILY_TEMPERATURE", "LILY_CUDA_DISABLE"};

class ServeSources : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kVariables) ::unsetenv(name);
    dir_ = fs::temp_directory_path() /
           ("lily_cli_sources_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (const char* name : kVariables) ::unsetenv(name);
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  // Writes `text` to a config file in this test's folder and returns its path.
  std::string config(const std::string& text, const std::string& name = "lily.toml") {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }

  static test::LilyRun serve(const std::string& args) {
    std::string line = "serve --model ";
    line += kNoModel;
    line += " " + args;
    return test::run_lily(line);
  }

  fs::path dir_;
};

// The run got past every option (it stopped at the missing checkpoint).
void expect_reached_loading(const test::LilyRun& run) {
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find(kNoModel), std::string::npos) << run.err;
}

void expect_error(const test::LilyRun& run, const std::string& text) {
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("error: " + text), std::string::npos)
      << "expected \"error: " << text << "\" in:\n"
      << run.err;
}

TEST_F(ServeSources, AnEnvironmentVariableSetsAnOption) {
  ::setenv("LILY_MAX_SEQ", "abc", 1);
  expect_error(serve("--bind 127.0.0.1:0"),
               "LILY_MAX_SEQ is \"abc\", expected a non-negative integer");
  // A flag: LILY_STRICT=1 (or true) is --strict, which refuses a sampling flag.
  ::unsetenv("LILY_MAX_SEQ");
  for (const char* on : {"1", "true"}) {
    ::setenv("LILY_STRICT", on, 1);
    expect_error(serve("--bind 127.0.0.1:0 --temperature 0.5"), "--strict decodes greedily");
  }
  for (const char* off : {"0", "false", ""}) {  // empty: unset
    ::setenv("LILY_STRICT", off, 1);
    expect_reached_loading(serve("--bind 127.0.0.1:0 --temperature 0.5"));
  }
  ::setenv("LILY_STRICT", "yes", 1);
  expect_error(serve("--bind 127.0.0.1:0"), "LILY_STRICT is \"yes\", expected 1, true, 0 or false");
}

// --cuda-disable like every serve option: LILY_CUDA_DISABLE and the config key cuda-disable,
// checked before loading, the message naming where the bad list came from.
TEST_F(ServeSources, TheCudaDisableListFromTheEnvironmentOrTheConfigFile) {
  ::setenv("LILY_CUDA_DISABLE", "fused_conv", 1);
  expect_error(serve("--bind 127.0.0.1:0"),
               "LILY_CUDA_DISABLE is \"fused_conv\": unknown CUDA path \"fused_conv\", expected a "
               "comma-separated list of pdl, stream-gemv, fused-conv, moe-layer");
  ::setenv("LILY_CUDA_DISABLE", "pdl", 1);
  expect_error(serve("--bind 127.0.0.1:0 --device cpu"),
               "LILY_CUDA_DISABLE applies to the CUDA backend, not --device cpu");
  expect_reached_loading(serve("--bind 127.0.0.1:0"));  // auto: a valid list is kept for CUDA
  ::unsetenv("LILY_CUDA_DISABLE");
  const std::string path = config("cuda-disable = \"stream-gemv,nope\"\n");
  expect_error(serve("--bind 127.0.0.1:0 --config " + path),
               path + ": cuda-disable is \"stream-gemv,nope\": unknown CUDA path \"nope\"");
}

TEST_F(ServeSources, TheExistingModelAndApiKeyVariablesStillWork) {
  // Were LILY_MODEL ignored, serve would build the demo checkpoint: the unusable data
  // directory makes that fail quickly instead of serving.
  ::setenv("LILY_DATA_DIR", "/dev/null/lily", 1);
  ::setenv("LILY_MODEL", "/nonexistent/from-lily-model", 1);
  const test::LilyRun run = test::run_lily("serve --bind 127.0.0.1:0");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("/nonexistent/from-lily-model"), std::string::npos) << run.err;
  ::setenv("LILY_API_KEY", "k", 1);
  expect_error(serve("--bind 127.0.0.1:0 --no-auth"),
               "give at most one of --api-key and --no-auth");
}

TEST_F(ServeSources, TheTestScriptHasNoVariable) {
  // Read, LILY_TEST_SCRIPT would clash with --strict ("cannot be combined with ...
  // --test-script"); ignored, the run gets as far as loading.
  ::setenv("LILY_TEST_SCRIPT", "/nonexistent/script.json", 1);
  expect_reached_loading(serve("--bind 127.0.0.1:0 --strict"));
  // The clash the check relies on, when the option is given where it may be.
  expect_error(serve("--bind 127.0.0.1:0 --strict --test-script /nonexistent/script.json"),
               "--strict is Lily's contract (thinking off); it cannot be combined with");
}

TEST_F(ServeSources, AConfigFileSetsOptions) {
  const std::string bad = config("# lily\nmax-seq = \"abc\"\n");
  expect_error(serve("--bind 127.0.0.1:0 --config " + bad),
               bad + ": max-seq is \"abc\", expected a non-negative integer");
  const std::string device = config("device = \"tpu\"   # not a device\n", "device.toml");
  expect_error(serve("--bind 127.0.0.1:0 --config " + device),
               device + ": device is \"tpu\", expected auto, cpu or cuda");
  const std::string strict = config("strict = true\nmax-seq = 8192\n", "strict.toml");
  expect_error(serve("--bind 127.0.0.1:0 --temperature 0.5 --config " + strict),
               "--strict decodes greedily");
  const std::string off = config("strict = false\n", "off.toml");
  expect_reached_loading(serve("--bind 127.0.0.1:0 --temperature 0.5 --config " + off));
  // LILY_CONFIG names the file too.
  ::setenv("LILY_CONFIG", bad.c_str(), 1);
  expect_error(serve("--bind 127.0.0.1:0"), bad + ": max-seq is \"abc\"");
}

TEST_F(ServeSources, TheDocumentedExampleIsAccepted) {
  // Its model and bind are hidden by serve()'s --model and this --bind (a fixed port would
  // clash with a running server); every key and value layout is still checked.
  expect_reached_loading(
      serve("--bind 127.0.0.1:0 --config " LILY_SOURCE_DIR "/docs/lily.example.toml"));
}

// Which layer set --bind shows in the address the error quotes (each value is a bad port).
TEST_F(ServeSources, CommandLineBeatsEnvironmentBeatsConfigFile) {
  const std::string file = config("bind = \"127.0.0.1:fromconfig\"\n");
  ::setenv("LILY_BIND", "127.0.0.1:fromenv", 1);
  const test::LilyRun cli = serve("--bind 127.0.0.1:fromcli --config " + file);
  expect_error(cli, "--bind is \"127.0.0.1:fromcli\"");
  EXPECT_EQ(cli.err.find("fromenv"), std::string::npos) << cli.err;
  const test::LilyRun env = serve("--config " + file);
  expect_error(env, "LILY_BIND: --bind is \"127.0.0.1:fromenv\"");
  EXPECT_EQ(env.err.find("fromconfig"), std::string::npos) << env.err;
  ::unsetenv("LILY_BIND");
  expect_error(serve("--config " + file), file + ": bind: --bind is \"127.0.0.1:fromconfig\"");
  // A valid higher layer hides a bad lower one entirely.
  ::setenv("LILY_MAX_SEQ", "abc", 1);
  expect_reached_loading(serve("--bind 127.0.0.1:0 --max-seq 64"));
}

TEST_F(ServeSources, BadConfigFilesAreRefusedNamingFileAndKey) {
  const std::string unknown = config("max-seq = 64\nmax-sq = 64\n");
  const test::LilyRun run = serve("--bind 127.0.0.1:0 --config " + unknown);
  expect_error(run, unknown + ": unknown key \"max-sq\", expected one of the options");
  EXPECT_NE(run.err.find("max-seq, device"), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find("test-script"), std::string::npos) << "not settable there: " << run.err;

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"test-script = \"x.json\"\n", "test-script cannot be set in a config file"},
      {"config = \"other.toml\"\n", "config cannot be set in a config file"},
      {"no-auth = maybe\n", "no-auth is \"maybe\", expected true or false"},
      {"max-seq = 64\nmax-seq = 128\n", "max-seq has more than one value"},
      {"max-seq = 64\nqueue = 2\nmax-seq = 128\n", "max-seq has more than one value"},
      {"max-seq = [64, 128]\n", "max-seq has more than one value"},
      {"max-seq =\n", "max-seq is empty"},
      {"model = /tmp/a b\n", "model has more than one value"},
      // CLI11's reader would cut these values at '#' or run the quote to the end of the line.
      {"# a comment's apostrophe is fine\napi-key = \"ab#cd\"\n", "2: '#' inside quotes"},
      {"api-key = 'a b#cd' # comment\n", "1: '#' inside quotes"},
      {"model = \"/tmp/a b\n", "1: a quote (\") is not closed on its line"},
  };
  for (const auto& [text, message] : cases) {
    const std::string path = config(text, "case.toml");
    const std::string separator = std::isdigit(static_cast<unsigned char>(message[0])) ? ":" : ": ";
    expect_error(serve("--bind 127.0.0.1:0 --config " + path), path + separator + message);
  }
  // Quoted spaces and a '#' comment after the value are read as TOML means them. (The
  // unusable data directory: were the file's model not read, the demo checkpoint would fail.)
  ::setenv("LILY_DATA_DIR", "/dev/null/lily", 1);
  const std::string spaces = config("model = \"/nonexistent/a b\"  # the model\n", "spaces.toml");
  expect_error(test::run_lily("serve --bind 127.0.0.1:0 --config " + spaces),
               "model directory /nonexistent/a b does not exist");
  const std::string section = config("[server]\nmax-seq = 64\n", "section.toml");
  expect_error(serve("--bind 127.0.0.1:0 --config " + section),
               section + ": section [server] is not read");
  expect_error(serve("--bind 127.0.0.1:0 --config /nonexistent/lily.toml"),
               "config file /nonexistent/lily.toml: not a readable regular file");
  expect_error(serve("--bind 127.0.0.1:0 --config " + dir_.string()),
               "config file " + dir_.string() + ": not a readable regular file");
}

TEST_F(ServeSources, HelpNamesEveryVariable) {
  const test::LilyRun run = test::run_lily("serve --help");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  int options = 0;
  for (const std::string& line : run.lines()) {
    if (line.rfind("  --", 0) != 0 || line.rfind("  --help ", 0) == 0) continue;
    const std::string name = line.substr(4, line.find(' ', 4) - 4);
    std::string variable = "[LILY_";
    for (const char c : name)
      variable += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    variable += "]";
    const bool test_hook = name == "test-script" || name == "test-fault";
    const std::string expected = test_hook ? "[command line only]" : variable;
    EXPECT_NE(line.find(expected), std::string::npos) << line;
    ++options;
  }
  EXPECT_GE(options, 20) << run.out;
  for (const char* variable :
       {"[LILY_MAX_SEQ]", "[LILY_NO_AUTH]", "[LILY_MODEL]", "[LILY_API_KEY]", "[LILY_CONFIG]"}) {
    EXPECT_NE(run.out.find(variable), std::string::npos) << variable;
  }
  EXPECT_NE(run.out.find("Precedence: command line, then environment,\nthen config file, then "
                         "the default"),
            std::string::npos)
      << run.out;
  // The other commands read the command line only.
  EXPECT_EQ(test::run_lily("run --help").out.find("[LILY_"), std::string::npos);
}

// CLI11 reads the command line; the usage errors keep naming the option.
TEST_F(ServeSources, CommandLineErrorsNameTheOption) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--bogus 1", "unknown option --bogus; options are:"},
      {"--bogus=1", "unknown option --bogus; options are:"},
      {"-x", "unexpected argument \"-x\""},
      {"stray", "unexpected argument \"stray\""},
      {"--max-seq", "option --max-seq needs a value"},
      {"--max-seq --strict", "option --max-seq needs a value"},
      {"--max-seq ''", "option --max-seq needs a value"},
      {"--max-seq 64 --max-seq 64", "option --max-seq is given twice"},
      {"--strict --strict", "option --strict is given twice"},
      {"--strict=yes", "option --strict takes no value"},
      {"--max-seq 12x", "--max-seq is \"12x\", expected a non-negative integer"},
      {"--max-seq -1", "--max-seq is \"-1\", expected a non-negative integer"},
      {"--max-seq 0", "--max-seq is 0, expected a value in [1, 262144]"},
  };
  for (const auto& [args, message] : cases) expect_error(serve(args), message);
  // Values that look like options' neighbours still parse: a negative number, `=` form.
  expect_reached_loading(serve("--bind=127.0.0.1:0 --presence-penalty -0.5 --max-seq=64"));
}

}  // namespace
}  // namespace lily

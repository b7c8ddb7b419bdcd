// --kv-cache f32|bf16|int8 on run, bench and serve: bad values refused before loading, bf16 and int8 accepted on the CPU, f32 the default.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "synth/make_checkpoint.h"
#include "unit/cli_runner.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

constexpr const char* kNoModel = "/nonexistent/lily-kv-cache-model";

void expect_error(const test::LilyRun& run, const std::string& text) {
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("error: " + text), std::string::npos)
      << "expected \"error: " << text << "\" in:\n"
      << run.err;
}

// The three commands that take the option, each stopping at the missing checkpoint once the
// options pass (so a check that does not fire shows up as the loading error instead).
const char* const kCommands[] = {"run --prompt-ids 1", "bench --prompt-len 4 --json-out /dev/null",
                                 "serve --bind 127.0.0.1:0"};

std::string command(const char* base, const std::string& options) {
  std::string line = base;
  line += " --model ";
  line += kNoModel;
  line += " " + options;
  return line;
}

class KvCacheOption : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("LILY_KV_CACHE");
    ::unsetenv("LILY_DEVICE");
  }
  void TearDown() override {
    ::unsetenv("LILY_KV_CACHE");
    ::unsetenv("LILY_DEVICE");
  }
};

TEST_F(KvCacheOption, AnUnknownTypeIsRefusedNamingTheChoices) {
  for (const char* base : kCommands) {
    for (const char* value : {"fp8", "f16", "BF16", "\"\" --device cpu"}) {
      const test::LilyRun run = test::run_lily(command(base, std::string("--kv-cache ") + value));
      EXPECT_EQ(run.exit_code, 2) << base << " " << value << "\n" << run.err;
      if (std::string(value).rfind("\"\"", 0) == 0) {
        EXPECT_NE(run.err.find("option --kv-cache needs a value"), std::string::npos) << run.err;
      } else {
        EXPECT_NE(run.err.find(std::string("error: --kv-cache is \"") + value +
                               "\", expected f32, bf16 or int8"),
                  std::string::npos)
            << base << "\n" << run.err;
      }
      EXPECT_EQ(run.err.find(kNoModel), std::string::npos) << "refused only after loading: " << run.err;
    }
  }
}

TEST_F(KvCacheOption, EveryTypeWithDeviceCpuGetsAsFarAsLoading) {
  for (const char* base : kCommands) {
    for (const char* value : {"bf16", "f32", "int8"}) {
      const test::LilyRun run = test::run_lily(command(base, std::string("--device cpu --kv-cache ") + value));
      EXPECT_EQ(run.exit_code, 2) << base << " " << value << "\n" << run.err;
      EXPECT_NE(run.err.find(kNoModel), std::string::npos) << base << " " << value << "\n" << run.err;
      EXPECT_EQ(run.err.find("needs the CUDA backend"), std::string::npos) << run.err;
    }
  }
}

TEST_F(KvCacheOption, ServeReadsTheVariableAndTheConfigFile) {
  ::setenv("LILY_KV_CACHE", "fp8", 1);
  expect_error(test::run_lily(command("serve", "--bind 127.0.0.1:0")),
               "LILY_KV_CACHE is \"fp8\", expected f32, bf16 or int8");
  // bf16 from the variable is served on the CPU: serve gets as far as loading.
  ::setenv("LILY_KV_CACHE", "bf16", 1);
  ::setenv("LILY_DEVICE", "cpu", 1);
  const test::LilyRun env = test::run_lily(command("serve", "--bind 127.0.0.1:0"));
  EXPECT_EQ(env.exit_code, 2) << env.err;
  EXPECT_NE(env.err.find(kNoModel), std::string::npos) << env.err;
  ::setenv("LILY_KV_CACHE", "fp8", 1);
  // The command line beats the variable.
  const test::LilyRun cli = test::run_lily(command("serve", "--bind 127.0.0.1:0 --kv-cache f32"));
  EXPECT_NE(cli.err.find(kNoModel), std::string::npos) << cli.err;
  ::unsetenv("LILY_KV_CACHE");
  ::unsetenv("LILY_DEVICE");
  const fs::path file = fs::temp_directory_path() / ("lily_kv_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(file) << "kv-cache = \"f8\"\n";
  expect_error(test::run_lily(command("serve", "--bind 127.0.0.1:0 --config " + file.string())),
               file.string() + ": kv-cache is \"f8\", expected f32, bf16 or int8");
  fs::remove(file);
}

// With a real (tiny) checkpoint: the CPU runs f32 by default and says so; --kv-cache bf16 runs
// on the CPU, under --device cpu and under --device auto without a usable GPU, and the start-up
// line, the run's summary and lily bench's JSON name it.
TEST_F(KvCacheOption, TheCpuDefaultIsF32AndBf16RunsOnTheCpu) {
  const fs::path dir = fs::temp_directory_path() / ("lily_kv_tiny_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  MakeCheckpointOptions options;
  options.out_dir = dir.string();
  make_checkpoint(options);
  const std::string model = " --model '" + dir.string() + "' --prompt-ids 1,2,3 --max-tokens 2";
  const test::LilyRun cpu = test::run_lily("run --device cpu" + model);
  EXPECT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_NE(cpu.err.find("cpu backend, "), std::string::npos) << cpu.err;
  EXPECT_NE(cpu.err.find("KV cache f32"), std::string::npos) << cpu.err;
  const test::LilyRun f32 = test::run_lily("run --device cpu --kv-cache f32" + model);
  EXPECT_EQ(f32.exit_code, 0) << f32.err;
  EXPECT_EQ(f32.out, cpu.out);  // the same tokens and text
  const test::LilyRun bf16 = test::run_lily("run --device cpu --threads 2 --kv-cache bf16" + model);
  EXPECT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_NE(bf16.err.find("lily: using the CPU ("), std::string::npos) << bf16.err;
  EXPECT_NE(bf16.err.find("); KV cache bf16\n"), std::string::npos) << bf16.err;
  EXPECT_NE(bf16.err.find("cpu backend, 2 threads, KV cache bf16"), std::string::npos) << bf16.err;
  EXPECT_NE(bf16.out.find("\"tokens\":["), std::string::npos) << bf16.out;
  const fs::path json = dir / "bench.json";
  const test::LilyRun bench = test::run_lily("bench --device cpu --threads 2 --kv-cache bf16 --model '" +
                                             dir.string() + "' --prompt-len 8 --decode-steps 4 --json-out '" +
                                             json.string() + "'");
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_NE(bench.err.find("| KV cache bf16"), std::string::npos) << bench.err;
  std::ifstream report(json);
  const nlohmann::json r = nlohmann::json::parse(report);
  EXPECT_EQ(r["workload"]["kv_cache"], "bf16");
  std::string why;
  if (!cuda_available(&why)) {
    const test::LilyRun autod = test::run_lily("run" + model);
    EXPECT_EQ(autod.exit_code, 0) << autod.err;
    EXPECT_NE(autod.err.find("--device auto: using the CPU (" + why + "); KV cache f32"),
              std::string::npos)
        << autod.err;
    const test::LilyRun auto_bf16 = test::run_lily("run --kv-cache bf16" + model);
    EXPECT_EQ(auto_bf16.exit_code, 0) << auto_bf16.err;
    EXPECT_NE(auto_bf16.err.find("--device auto: using the CPU (" + why + "); KV cache bf16"),
              std::string::npos)
        << auto_bf16.err;
    EXPECT_EQ(auto_bf16.out, bf16.out);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lily

// --device as a user meets it: a bad value, CUDA asked for where there is none, auto's choice.
#include <gtest/gtest.h>

#include <string>

#include "backend/backend.h"
#include "checkpoint_fixtures.h"

namespace lily {
namespace {

using test::run_lily;
using test::RunResult;
using test::TinyCheckpoint;

// Built by appending: GCC 12 -O3 raises a false -Wrestrict on `"'" + std::string&&`.
std::string quoted(const std::filesystem::path& path) {
  std::string out = "'";
  out += path.string();
  out += '\'';
  return out;
}

TEST(CliDevice, UnknownDeviceIsRefusedBeforeLoading) {
  for (const char* command : {"run --prompt-ids 1", "bench --prompt-len 4 --json-out /dev/null"}) {
    const RunResult r = run_lily(std::string(command) + " --model /nonexistent --device tpu");
    EXPECT_EQ(r.exit_code, 2) << command;
    EXPECT_NE(r.err.find("--device is \"tpu\", expected auto, cpu or cuda"), std::string::npos)
        << r.err;
  }
}

TEST(CliDevice, CudaWithoutAUsableDeviceSaysWhy) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "this machine has a usable CUDA device";
  TinyCheckpoint ckpt;
  const RunResult r = run_lily("run --model " + quoted(ckpt.dir()) + " --prompt-ids 1,2 --device cuda");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("error: --device cuda: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(why), std::string::npos)
      << "stderr: " << r.err << "\nwhy: " << why;
  EXPECT_EQ(r.out, "");
}

TEST(CliDevice, AutoFallsBackToTheCpuAndSaysSo) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "this machine has a usable CUDA device";
  TinyCheckpoint ckpt;
  const RunResult r = run_lily("run --model " + quoted(ckpt.dir()) + " --prompt-ids 1,2 --max-tokens 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--device auto: using the CPU (" + why + ")"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lily

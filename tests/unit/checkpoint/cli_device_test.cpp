// --device as a user meets it: a bad value, CUDA asked for where there is none, auto's choice.
#include <gtest/gtest.h>

#include <string>

#include "backend/backend.h"
#include "backend/cuda/cuda_options.h"
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

TEST(CudaOptions, DisablingTurnsOffTheNamedPathsOnly) {
  EXPECT_EQ(CudaOptions{}.describe(), "pdl on, stream-gemv on, fused-conv on, moe-layer on");
  EXPECT_EQ(CudaOptions::disabling("").describe(), "pdl on, stream-gemv on, fused-conv on, moe-layer on");
  EXPECT_EQ(CudaOptions::disabling("pdl").describe(), "pdl off, stream-gemv on, fused-conv on, moe-layer on");
  EXPECT_EQ(CudaOptions::disabling("fused-conv,stream-gemv").describe(),
            "pdl on, stream-gemv off, fused-conv off, moe-layer on");
  EXPECT_EQ(CudaOptions::disabling("moe-layer").describe(),
            "pdl on, stream-gemv on, fused-conv on, moe-layer off");
  EXPECT_FALSE(CudaOptions::disabling("moe-layer").all_on());
  EXPECT_FALSE(CudaOptions::disabling("pdl,stream-gemv,fused-conv").all_on());
  for (const char* bad : {"bogus", "pdl,", ",pdl", "pdl,,fused-conv", "PDL", "pdl stream-gemv"}) {
    try {
      CudaOptions::disabling(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("expected a comma-separated list of pdl, stream-gemv, "
                                           "fused-conv"),
                std::string::npos)
          << bad << ": " << e.what();
    }
  }
  EXPECT_THROW(CudaOptions::disabling("pdl,pdl"), std::invalid_argument);
}

// The one table of paths (kCudaPaths) names each member once: disabling a path by its flag
// turns off exactly that member, and describe() and names() list every flag.
TEST(CudaOptions, EachPathOfTheTableTurnsOffItsOwnMember) {
  ASSERT_EQ(kCudaPathCount, 4u);
  for (const CudaPath& path : kCudaPaths) {
    const CudaOptions off = CudaOptions::disabling(path.flag);
    EXPECT_FALSE(off.*path.on) << path.flag;
    for (const CudaPath& other : kCudaPaths) {
      if (other.flag != path.flag) {
        EXPECT_TRUE(off.*other.on) << path.flag << " turned off " << other.flag;
      }
    }
    EXPECT_NE(off.describe().find(std::string(path.flag) + " off"), std::string::npos) << off.describe();
    EXPECT_NE(CudaOptions::names().find(path.flag), std::string::npos) << path.flag;
  }
  EXPECT_EQ(CudaOptions::names(), "pdl, stream-gemv, fused-conv, moe-layer");
}

// --cuda-disable on run, bench and serve: an unknown path is refused before loading, naming
// the valid ones; with --device cpu any list is refused (LILY_CUDA_DISABLE and the config
// key: cli_sources_test.cpp).
TEST(CliDevice, CudaDisableIsCheckedBeforeLoading) {
  for (const char* command :
       {"run --prompt-ids 1", "bench --prompt-len 4 --json-out /dev/null", "serve"}) {
    const RunResult bad = run_lily(std::string(command) + " --model /nonexistent --cuda-disable pdl,tma");
    EXPECT_EQ(bad.exit_code, 2) << command;
    EXPECT_NE(bad.err.find("--cuda-disable is \"pdl,tma\": unknown CUDA path \"tma\", expected a "
                           "comma-separated list of pdl, stream-gemv, fused-conv, moe-layer"),
              std::string::npos)
        << command << ": " << bad.err;
    const RunResult cpu =
        run_lily(std::string(command) + " --model /nonexistent --device cpu --cuda-disable pdl");
    EXPECT_EQ(cpu.exit_code, 2) << command;
    EXPECT_NE(cpu.err.find("--cuda-disable applies to the CUDA backend, not --device cpu"),
              std::string::npos)
        << command << ": " << cpu.err;
  }
}

// --cpu-precision: an unknown value and --device cuda are refused before loading; each valid
// one runs and the start-up line names its path (the plane count for the int8 ones).
TEST(CliDevice, CpuPrecisionChoosesThePathTheStartUpLineNames) {
  const RunResult bad = run_lily("run --prompt-ids 1 --model /nonexistent --cpu-precision q4");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--cpu-precision is \"q4\", expected exact, fast or q8"),
            std::string::npos)
      << bad.err;
  const RunResult cuda =
      run_lily("run --prompt-ids 1 --model /nonexistent --device cuda --cpu-precision q8");
  EXPECT_EQ(cuda.exit_code, 2);
  EXPECT_NE(cuda.err.find("--cpu-precision applies to the CPU backend, not --device cuda"),
            std::string::npos)
      << cuda.err;
  TinyCheckpoint ckpt;
  const struct {
    const char* value;
    const char* path;
  } cases[] = {{"exact", "one-token GEMVs in f32 (--cpu-precision exact)"},
               {"fast", "two activation planes"},
               {"q8", "one activation plane (two for 8-bit weights)"}};
  for (const auto& c : cases) {
    const RunResult r =
        run_lily("run --model " + quoted(ckpt.dir()) +
                 " --prompt-ids 1,2 --max-tokens 2 --device cpu --cpu-precision " + c.value);
    EXPECT_EQ(r.exit_code, 0) << c.value << ": " << r.err;
    EXPECT_NE(r.err.find(c.path), std::string::npos) << c.value << ": " << r.err;
    EXPECT_NE(r.err.find(std::string("(--cpu-precision ") + c.value + ")"), std::string::npos)
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

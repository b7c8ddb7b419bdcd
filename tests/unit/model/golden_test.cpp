// The CPU model against goldens from transformers' Qwen3_5MoeForCausalLM (float64).
#include <gtest/gtest.h>

#include "golden_check.h"

namespace lily {
namespace {

// Tolerances (docs/precision.md): the CPU computes in f32 throughout.
constexpr double kMarginTolerance = 1e-3;
constexpr double kLogitTolerance = 1e-3;

class GoldenTest : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(GoldenTest, GreedyTokensAndTopLogitsMatchTransformers) {
  std::unique_ptr<Backend> backend = make_cpu_backend(0);
  testing::check_golden(GetParam(), *backend, 256, {kLogitTolerance, kMarginTolerance, 0, 0});
}

INSTANTIATE_TEST_SUITE_P(Tiny, GoldenTest, ::testing::ValuesIn(testing::golden_files()),
                         [](const auto& param_info) { return testing::golden_test_name(param_info.param); });

// --cpu-precision fast: the one-token matrix products by int8 dot products (the prefill stays
// exact f32).
constexpr double kFastLogitTolerance = 5e-3;
constexpr double kFastMarginTolerance = 5e-3;
constexpr double kFastRouterTie = 4e-4;
constexpr double kFastRouterFlipLogitTolerance = 1e-1;

class FastGoldenTest : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(FastGoldenTest, GreedyTokensAndTopLogitsMatchTransformers) {
  std::unique_ptr<Backend> backend = make_cpu_backend(0, CpuPrecision::fast);
  ASSERT_NE(backend->code_path().find("int8"), std::string::npos) << backend->code_path();
  testing::check_golden(GetParam(), *backend, 256,
                        {kFastLogitTolerance, kFastMarginTolerance, kFastRouterTie,
                         kFastRouterFlipLogitTolerance});
}

INSTANTIATE_TEST_SUITE_P(Tiny, FastGoldenTest, ::testing::ValuesIn(testing::golden_files()),
                         [](const auto& param_info) { return testing::golden_test_name(param_info.param); });

}  // namespace
}  // namespace lily

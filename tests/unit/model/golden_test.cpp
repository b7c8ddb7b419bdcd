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

// --cpu-precision fast: every matrix product by int8 dot products, the prefill's too (which,
// bit for bit per op, is then the token-by-token decode of the prompt: chunk 1 gives the same
// figures). A greedy flip needs two logits to move towards each other, so the margin bound is
// twice the logit bound: seed2-chat flips at a margin of 5.7e-3 with its logits within 3.5e-3.
// Where a prompt token's router is near a tie the logits are held to 1e-1 and flips to 5e-2
// (seed2-plain: a flip at step 30 at a margin of 1.2e-2, logits within 4.2e-2). docs/precision.md.
constexpr double kFastLogitTolerance = 5e-3;
constexpr double kFastMarginTolerance = 1e-2;
constexpr double kFastRouterTie = 4e-4;
constexpr double kFastRouterFlipLogitTolerance = 1e-1;
constexpr double kFastRouterFlipMarginTolerance = 5e-2;

class FastGoldenTest : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(FastGoldenTest, GreedyTokensAndTopLogitsMatchTransformers) {
  std::unique_ptr<Backend> backend = make_cpu_backend(0, CpuPrecision::fast);
  ASSERT_NE(backend->code_path().find("int8"), std::string::npos) << backend->code_path();
  testing::check_golden(GetParam(), *backend, 256,
                        {kFastLogitTolerance, kFastMarginTolerance, kFastRouterTie,
                         kFastRouterFlipLogitTolerance, kFastRouterFlipMarginTolerance});
}

INSTANTIATE_TEST_SUITE_P(Tiny, FastGoldenTest, ::testing::ValuesIn(testing::golden_files()),
                         [](const auto& param_info) { return testing::golden_test_name(param_info.param); });

}  // namespace
}  // namespace lily

// CPU backend: results do not depend on the thread count (each output is computed by one thread, in one order).
#include <gtest/gtest.h>

#include <vector>

#include "backend_test_support.h"

namespace lily::testing {
namespace {

template <typename Op>
void expect_same_for_thread_counts(Op op, const char* what) {
  const std::vector<float> one = op(*cpu(1));
  for (int threads : {2, 5}) {
    EXPECT_EQ(op(*cpu(threads)), one) << what << " with " << threads << " threads";
  }
}

TEST(BackendThreads, OutputsAreBitwiseIndependentOfTheThreadCount) {
  Rng rng(101);
  const QuantWeight w(rng, 4, 1, 37, 256);
  const std::vector<float> x = rng.uniform_vector(6 * 256, -1.0f, 1.0f);
  for (int64_t n : {1, 6}) {
    expect_same_for_thread_counts([&](Backend& be) {
      std::vector<float> y(static_cast<size_t>(n) * 37);
      be.matmul(w.view(), 0, 37, x.data(), n, y.data());
      return y;
    }, "matmul");
  }

  const QuantWeight gate(rng, 4, 4, 64, 256);
  const QuantWeight up(rng, 4, 4, 64, 256);
  const QuantWeight down(rng, 4, 4, 256, 64);
  const QuantWeight shared_down(rng, 4, 1, 256, 64);
  const std::vector<int32_t> ids = {3, 0, 1, 3, 2, 0, 0, 1, 3, 2, 1, 0};  // n = 6, k = 2
  const std::vector<float> weights = rng.uniform_vector(12, 0.1f, 0.9f);
  const std::vector<float> shared_h = rng.uniform_vector(6 * 64, -1.0f, 1.0f);
  const std::vector<float> logit = rng.uniform_vector(6, -2.0f, 2.0f);
  for (int64_t n : {1, 6}) {
    expect_same_for_thread_counts([&](Backend& be) {
      std::vector<float> h(static_cast<size_t>(n) * 2 * 64);
      be.expert_swiglu(gate.view(), up.view(), x.data(), ids.data(), n, 2, h.data());
      std::vector<float> out(static_cast<size_t>(n) * 256);
      be.expert_down_combine(down.view(), h.data(), ids.data(), weights.data(), n, 2,
                             shared_down.view(), shared_h.data(), logit.data(), out.data());
      h.insert(h.end(), out.begin(), out.end());
      return h;
    }, "expert_swiglu + expert_down_combine");
  }

  const GatedDeltaNetDims d{2, 4, 32, 16, 4};
  const DenseTensor a_log(DType::F32, {4}, rng.uniform_vector(4, 0.0f, 2.0f));
  const DenseTensor dt_bias(DType::BF16, {4}, rng.uniform_vector(4, -1.0f, 1.0f));
  const std::vector<float> conv = rng.uniform_vector(static_cast<size_t>(5 * d.channels()), -0.3f, 2.0f);
  const std::vector<float> a = rng.uniform_vector(20, -2.0f, 2.0f);
  const std::vector<float> b = rng.uniform_vector(20, -2.0f, 2.0f);
  expect_same_for_thread_counts([&](Backend& be) {
    std::vector<float> state(4 * 32 * 16, 0.0f);
    std::vector<float> out(5 * 4 * 16);
    be.gated_delta_rule(conv.data(), a.data(), b.data(), a_log.view(), dt_bias.view(), state.data(), d, 5,
                        out.data());
    out.insert(out.end(), state.begin(), state.end());
    return out;
  }, "gated_delta_rule");
}

}  // namespace
}  // namespace lily::testing

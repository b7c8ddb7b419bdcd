// CPU backend vs the float64 reference: expert_swiglu (routed and shared) and expert_down_combine.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

// f32 vs f64: two dots of `in` terms and a SiLU per output; the down projection adds at most
// k + 1 weighted dots. Same 1e-5 bound as the other ops (see dense_ops_test.cpp).
constexpr double kTol = 1e-5;

std::vector<double> widen(const std::vector<float>& v) { return ref::widen(v); }

constexpr uint64_t kExperts = 6;
constexpr uint64_t kHidden = 128;        // H: input width of gate/up, output rows of down
constexpr uint64_t kIntermediate = 64;   // I
constexpr uint64_t kShared = 128;        // S

// Expert ids for n tokens, k each, over this file's kExperts.
std::vector<int32_t> random_ids(Rng& rng, int64_t n, int64_t k) {
  return random_expert_ids(rng, n, k, static_cast<int64_t>(kExperts));
}

void check_swiglu(Backend& be, const QuantWeight& gate, const QuantWeight& up, Rng& rng,
                  const std::vector<int32_t>& ids, bool null_ids, int64_t n, int64_t k,
                  const std::string& label) {
  const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * gate.view().in, -2.0f, 2.0f);
  std::vector<float> h(static_cast<size_t>(n * k) * gate.view().out, 1e30f);
  be.expert_swiglu(gate.view(), up.view(), x.data(), null_ids ? nullptr : ids.data(), n, k, h.data());
  const std::vector<double> want = ref::expert_swiglu(gate.view(), up.view(), widen(x),
                                                      null_ids ? std::span<const int32_t>() : ids, n, k);
  const ErrorFigures f = report("expert_swiglu", label, h, want);
  EXPECT_LT(f.normalised, kTol) << label;
}

TEST(BackendExpertSwiglu, RoutedDecodeAndPrefill) {
  Rng rng(81);
  auto be = cpu(3);
  const QuantWeight gate(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_gate");
  const QuantWeight up(rng, 4, kExperts, kIntermediate, kHidden, 2, "experts_up");
  check_swiglu(*be, gate, up, rng, {5, 0, 3}, false, 1, 3, "n=1 k=3 ids {5,0,3}");
  check_swiglu(*be, gate, up, rng, {5}, false, 1, 1, "n=1 k=1 last expert");
  check_swiglu(*be, gate, up, rng, random_ids(rng, 5, 3), false, 5, 3, "n=5 k=3 shared experts");
  check_swiglu(*be, gate, up, rng, random_ids(rng, 9, 6), false, 9, 6, "n=9 k=6=E");
  // Not produced by top-k but allowed by the contract: the same expert twice in a token.
  check_swiglu(*be, gate, up, rng, {2, 2, 4, 2}, false, 2, 2, "n=2 k=2 repeated id");
}

TEST(BackendExpertSwiglu, WithSharedMatchesBothParts) {
  Rng rng(83);
  auto be = cpu(2);
  const QuantWeight gate(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_gate");
  const QuantWeight up(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_up");
  const QuantWeight sgate(rng, 4, 1, kShared, kHidden, 0, "shared_gate");
  const QuantWeight sup(rng, 4, 1, kShared, kHidden, 0, "shared_up");
  for (int64_t n : {1, 5}) {
    const int64_t k = 3;
    const std::vector<int32_t> ids = random_ids(rng, n, k);
    const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * kHidden, -2.0f, 2.0f);
    std::vector<float> h(static_cast<size_t>(n * k) * kIntermediate, 1e30f);
    std::vector<float> sh(static_cast<size_t>(n) * kShared, 1e30f);
    be->expert_swiglu_with_shared(gate.view(), up.view(), ids.data(), k, h.data(), sgate.view(),
                                  sup.view(), sh.data(), x.data(), n);
    const std::string label = "n=" + std::to_string(n);
    EXPECT_LT(report("expert_swiglu_with_shared", label + " routed", h,
                     ref::expert_swiglu(gate.view(), up.view(), widen(x), ids, n, k))
                  .normalised,
              kTol);
    EXPECT_LT(report("expert_swiglu_with_shared", label + " shared", sh,
                     ref::expert_swiglu(sgate.view(), sup.view(), widen(x),
                                        std::span<const int32_t>(), n, 1))
                  .normalised,
              kTol);
  }
}

TEST(BackendExpertSwiglu, RouteThenSwigluAsOneOp) {
  Rng rng(84);
  auto be = cpu(2);
  const QuantWeight gate(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_gate");
  const QuantWeight up(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_up");
  const QuantWeight sgate(rng, 4, 1, kShared, kHidden, 0, "shared_gate");
  const QuantWeight sup(rng, 4, 1, kShared, kHidden, 0, "shared_up");
  const int64_t n = 3;
  const int64_t k = 2;
  const std::vector<float> logits = rng.uniform_vector(n * kExperts, -3.0f, 3.0f);
  const std::vector<float> x = rng.uniform_vector(n * kHidden, -2.0f, 2.0f);
  std::vector<int32_t> ids(n * k, -1);
  std::vector<float> w(n * k, 1e30f);
  std::vector<float> h(n * k * kIntermediate, 1e30f);
  std::vector<float> sh(n * kShared, 1e30f);
  be->route_expert_swiglu(logits.data(), kExperts, k, ids.data(), w.data(), gate.view(), up.view(),
                          h.data(), sgate.view(), sup.view(), sh.data(), x.data(), n, nullptr);
  // The routing op on its own gives the same ids and weights.
  std::vector<int32_t> want_ids(n * k, -1);
  std::vector<float> want_w(n * k, 1e30f);
  be->moe_route(logits.data(), n, kExperts, k, want_ids.data(), want_w.data());
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(w, want_w);
  EXPECT_LT(report("route_expert_swiglu", "routed", h,
                   ref::expert_swiglu(gate.view(), up.view(), widen(x), want_ids, n, k)).normalised,
            kTol);
  EXPECT_LT(report("route_expert_swiglu", "shared", sh,
                   ref::expert_swiglu(sgate.view(), sup.view(), widen(x), std::span<const int32_t>(),
                                      n, 1)).normalised,
            kTol);
}

TEST(BackendExpertSwiglu, NullIdsUseExpertZero) {
  Rng rng(82);
  auto be = cpu();
  // The shared expert: one unstacked projection, k = 1.
  const QuantWeight sgate(rng, 4, 1, kShared, kHidden, 0, "shared_gate");
  const QuantWeight sup(rng, 4, 1, kShared, kHidden, 0, "shared_up");
  check_swiglu(*be, sgate, sup, rng, {}, true, 1, 1, "shared n=1 ids=nullptr");
  check_swiglu(*be, sgate, sup, rng, {}, true, 4, 1, "shared n=4 ids=nullptr");
  // Stacked weights with ids = nullptr: every slot reads expert 0.
  const QuantWeight gate(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_gate");
  const QuantWeight up(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_up");
  check_swiglu(*be, gate, up, rng, {}, true, 1, 2, "stacked n=1 k=2 ids=nullptr");
  check_swiglu(*be, gate, up, rng, {}, true, 3, 2, "stacked n=3 k=2 ids=nullptr");
}

void check_down(Backend& be, Rng& rng, const QuantWeight& down, const QuantWeight& shared_down,
                const std::vector<int32_t>& ids, int64_t n, int64_t k, const std::string& label) {
  const std::vector<float> h = rng.uniform_vector(static_cast<size_t>(n * k) * kIntermediate, -1.0f, 1.0f);
  const std::vector<float> shared_h = rng.uniform_vector(static_cast<size_t>(n) * kShared, -1.0f, 1.0f);
  std::vector<float> shared_logit = rng.uniform_vector(static_cast<size_t>(n), -4.0f, 4.0f);
  // Router-like weights: positive, summing to 1 per token.
  std::vector<float> weights = rng.uniform_vector(static_cast<size_t>(n * k), 0.05f, 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += weights[static_cast<size_t>(t * k + j)];
    for (int64_t j = 0; j < k; ++j) weights[static_cast<size_t>(t * k + j)] /= sum;
  }
  if (n > 1) shared_logit[1] = -80.0f;  // shared expert switched off for token 1
  std::vector<float> out(static_cast<size_t>(n) * kHidden, 1e30f);
  be.expert_down_combine(down.view(), h.data(), ids.data(), weights.data(), n, k,
                         shared_down.view(), shared_h.data(), shared_logit.data(), out.data());
  const std::vector<double> want = ref::expert_down_combine(down.view(), widen(h), ids, widen(weights), n, k,
                                                            shared_down.view(), widen(shared_h),
                                                            widen(shared_logit));
  const ErrorFigures f = report("expert_down_combine", label, out, want);
  EXPECT_LT(f.normalised, kTol) << label;
}

TEST(BackendExpertDownCombine, DecodeAndPrefillPaths) {
  Rng rng(83);
  auto be = cpu(3);
  const QuantWeight down(rng, 4, kExperts, kHidden, kIntermediate, 0, "experts_down");
  const QuantWeight shared_down(rng, 4, 1, kHidden, kShared, 1, "shared_down");
  // n = 1 takes the decode path (rows in parallel, slots in order), n > 1 the grouped path.
  check_down(*be, rng, down, shared_down, {4, 1, 5}, 1, 3, "n=1 k=3");
  check_down(*be, rng, down, shared_down, {0}, 1, 1, "n=1 k=1");
  check_down(*be, rng, down, shared_down, random_ids(rng, 2, 3), 2, 3, "n=2 k=3");
  check_down(*be, rng, down, shared_down, random_ids(rng, 7, 4), 7, 4, "n=7 k=4 shared experts");
  check_down(*be, rng, down, shared_down, random_ids(rng, 3, 6), 3, 6, "n=3 k=6=E");
}

TEST(BackendExpertDownCombine, DecodeAndPrefillPathsAgreePerToken) {
  Rng rng(84);
  auto be = cpu();
  const QuantWeight down(rng, 4, kExperts, kHidden, kIntermediate, 0, "experts_down");
  const QuantWeight shared_down(rng, 4, 1, kHidden, kShared, 0, "shared_down");
  const int64_t n = 4;
  const int64_t k = 2;
  const std::vector<int32_t> ids = random_ids(rng, n, k);
  const std::vector<float> h = rng.uniform_vector(static_cast<size_t>(n * k) * kIntermediate, -1.0f, 1.0f);
  const std::vector<float> shared_h = rng.uniform_vector(static_cast<size_t>(n) * kShared, -1.0f, 1.0f);
  const std::vector<float> logit = rng.uniform_vector(static_cast<size_t>(n), -2.0f, 2.0f);
  const std::vector<float> weights = rng.uniform_vector(static_cast<size_t>(n * k), 0.1f, 0.9f);
  std::vector<float> batched(static_cast<size_t>(n) * kHidden);
  be->expert_down_combine(down.view(), h.data(), ids.data(), weights.data(), n, k, shared_down.view(),
                          shared_h.data(), logit.data(), batched.data());
  std::vector<float> single(batched.size());
  for (int64_t t = 0; t < n; ++t) {
    be->expert_down_combine(down.view(), h.data() + t * k * static_cast<int64_t>(kIntermediate),
                            ids.data() + t * k, weights.data() + t * k, 1, k, shared_down.view(),
                            shared_h.data() + t * static_cast<int64_t>(kShared), logit.data() + t,
                            single.data() + t * static_cast<int64_t>(kHidden));
  }
  const ErrorFigures f = report("expert_down_combine", "n=4 batched vs 4 x n=1 (f32 vs f32)",
                                batched, widen(single));
  EXPECT_LT(f.normalised, kTol);
}

}  // namespace
}  // namespace lily::testing

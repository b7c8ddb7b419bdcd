// CPU backend argument validation: each op throws std::invalid_argument for what it cannot serve (the contract's exact messages: op_contract_test.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend_test_support.h"

namespace lily::testing {
namespace {

constexpr float kEps = 1e-6f;

TEST(BackendRejects, EmbedBadIdsAndBadTables) {
  Rng rng(91);
  auto be = cpu();
  const QuantWeight table(rng, 4, 1, 10, 64);
  std::vector<float> out(2 * 64);
  const std::vector<int32_t> good = {0, 9};
  EXPECT_NO_THROW(be->embed(table.view(), good.data(), 2, out.data()));
  const std::vector<int32_t> past_end = {0, 10};
  EXPECT_THROW(be->embed(table.view(), past_end.data(), 2, out.data()), std::invalid_argument);
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(be->embed(table.view(), negative.data(), 1, out.data()), std::invalid_argument);
  QuantView three_bits = table.view();
  three_bits.bits = 3;
  EXPECT_THROW(be->embed(three_bits, good.data(), 2, out.data()), std::invalid_argument);
}

TEST(BackendRejects, MatmulRowsOutsideTheWeightAndBadShapes) {
  Rng rng(92);
  auto be = cpu();
  const QuantWeight w(rng, 8, 2, 8, 128);  // 16 rows
  std::vector<float> x(2 * 128, 0.5f);
  std::vector<float> y(2 * 16);
  EXPECT_NO_THROW(be->matmul(w.view(), 0, 16, x.data(), 2, y.data()));
  EXPECT_THROW(be->matmul(w.view(), 10, 7, x.data(), 1, y.data()), std::invalid_argument);
  EXPECT_THROW(be->matmul(w.view(), 16, 1, x.data(), 1, y.data()), std::invalid_argument);
  EXPECT_THROW(be->matmul(w.view(), -1, 2, x.data(), 1, y.data()), std::invalid_argument);
  EXPECT_THROW(be->matmul(w.view(), 0, 0, x.data(), 1, y.data()), std::invalid_argument);
  EXPECT_THROW(be->matmul(w.view(), 0, 4, x.data(), 0, y.data()), std::invalid_argument);
  EXPECT_THROW(be->matmul(w.view(), 0, 4, nullptr, 1, y.data()), std::invalid_argument);
  QuantView ragged = w.view();
  ragged.in = 96;  // not a multiple of the group size
  EXPECT_THROW(be->matmul(ragged, 0, 4, x.data(), 1, y.data()), std::invalid_argument);
  QuantView no_data = w.view();
  no_data.scales = nullptr;
  EXPECT_THROW(be->matmul(no_data, 0, 4, x.data(), 1, y.data()), std::invalid_argument);
}

TEST(BackendRejects, NormsWithWrongGains) {
  Rng rng(93);
  auto be = cpu();
  const std::vector<float> g(64, 1.0f);
  const DenseTensor gain(DType::BF16, {64}, g);
  const DenseTensor short_gain(DType::BF16, {32}, std::vector<float>(32, 1.0f));
  const DenseTensor matrix_gain(DType::F32, {8, 8}, g);
  const DenseTensor f16_gain(DType::BF16, {64}, g);
  DenseView f16 = f16_gain.view();  // F16 is neither of the two gain types
  f16.dtype = DType::F16;
  DenseView no_data = gain.view();
  no_data.data = nullptr;
  std::vector<float> x(2 * 64, 1.0f);
  std::vector<float> z(2 * 64, 1.0f);
  std::vector<float> out(2 * 64);
  EXPECT_NO_THROW(be->rms_norm(x.data(), gain.view(), 2, 64, kEps, out.data()));
  for (const DenseView* bad : {&short_gain.view(), &matrix_gain.view(),
                               static_cast<const DenseView*>(&f16),
                               static_cast<const DenseView*>(&no_data)}) {
    EXPECT_THROW(be->rms_norm(x.data(), *bad, 2, 64, kEps, out.data()), std::invalid_argument);
    EXPECT_THROW(be->add_rms_norm(x.data(), z.data(), *bad, 2, 64, kEps, out.data()),
                 std::invalid_argument);
    EXPECT_THROW(be->gated_rms_norm(x.data(), z.data(), *bad, 2, 64, kEps, out.data()),
                 std::invalid_argument);
  }
}

TEST(BackendRejects, AttentionPrepareBadDimsAndNormSizes) {
  auto be = cpu();
  const AttentionDims good{4, 2, 64, 16, 1e7};
  const DenseTensor norm(DType::BF16, {64}, std::vector<float>(64, 1.0f));
  const DenseTensor short_norm(DType::BF16, {63}, std::vector<float>(63, 1.0f));
  std::vector<float> qg(4 * 2 * 64, 1.0f);
  std::vector<float> k(2 * 64, 1.0f);
  EXPECT_NO_THROW(be->attention_prepare(qg.data(), k.data(), norm.view(), norm.view(), good, 0, 1, kEps));
  EXPECT_THROW(be->attention_prepare(qg.data(), k.data(), short_norm.view(), norm.view(), good, 0, 1, kEps),
               std::invalid_argument);
  EXPECT_THROW(be->attention_prepare(qg.data(), k.data(), norm.view(), short_norm.view(), good, 0, 1, kEps),
               std::invalid_argument);
  AttentionDims uneven = good;
  uneven.q_heads = 3;  // not a multiple of kv_heads
  EXPECT_THROW(be->attention_prepare(qg.data(), k.data(), norm.view(), norm.view(), uneven, 0, 1, kEps),
               std::invalid_argument);
  AttentionDims odd_rotary = good;
  odd_rotary.rotary_dim = 15;
  EXPECT_THROW(be->attention_prepare(qg.data(), k.data(), norm.view(), norm.view(), odd_rotary, 0, 1, kEps),
               std::invalid_argument);
  AttentionDims wide_rotary = good;
  wide_rotary.rotary_dim = 66;
  EXPECT_THROW(be->attention_prepare(qg.data(), k.data(), norm.view(), norm.view(), wide_rotary, 0, 1, kEps),
               std::invalid_argument);
}

// The CPU backend serves f32 and bf16 KV caches (--kv-cache), but keys and values of two
// dtypes break the shared contract (op_contract.cpp).
TEST(BackendRejects, AttentionOnKvCachesOfTwoDtypes) {
  auto be = cpu();
  const AttentionDims d{4, 2, 64, 16, 1e7};
  std::vector<float> qg(4 * 2 * 64, 0.1f);
  std::vector<float> k(2 * 64, 0.1f);
  std::vector<float> v(k.size(), 0.1f);
  std::vector<float> k_f32(4 * 2 * 64);
  std::vector<uint16_t> v_bf16(k_f32.size());
  std::vector<float> out(4 * 64);
  try {
    be->attention(qg.data(), k.data(), v.data(), k_f32.data(), KvCacheView::bf16(v_bf16.data()), 4,
                  d, 0, 1, out.data());
    ADD_FAILURE() << "a bf16 value cache next to f32 keys was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "attention: v_cache dtype is bf16, expected the keys' dtype f32");
  }
  std::vector<uint16_t> k_bf16(k_f32.size());
  std::vector<float> v_f32(k_f32.size());
  try {
    be->attention(qg.data(), k.data(), v.data(), KvCacheView::bf16(k_bf16.data()), v_f32.data(), 4,
                  d, 0, 1, out.data());
    ADD_FAILURE() << "an f32 value cache next to bf16 keys was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "attention: v_cache dtype is f32, expected the keys' dtype bf16");
  }
  // bf16 caches of both kinds are served (bf16_kv_cache_test.cpp checks the results).
  EXPECT_NO_THROW(be->attention(qg.data(), k.data(), v.data(), KvCacheView::bf16(k_bf16.data()),
                                KvCacheView::bf16(v_bf16.data()), 4, d, 0, 1, out.data()));
  EXPECT_TRUE(be->serves_kv_cache(KvDtype::bf16));
  // The typed accessors refuse the other dtype.
  EXPECT_THROW(KvCacheView::bf16(v_bf16.data()).f32(), std::logic_error);
  EXPECT_THROW(KvCacheView(k_f32.data()).bf16_bits(), std::logic_error);
}

TEST(BackendRejects, AttentionBeyondCapacity) {
  auto be = cpu();
  const AttentionDims d{4, 2, 64, 16, 1e7};
  const int64_t capacity = 4;
  std::vector<float> qg(3 * 4 * 2 * 64, 0.1f);
  std::vector<float> k(3 * 2 * 64, 0.1f);
  std::vector<float> v(k.size(), 0.1f);
  std::vector<float> k_cache(static_cast<size_t>(capacity) * 2 * 64);
  std::vector<float> v_cache(k_cache.size());
  std::vector<float> out(3 * 4 * 64);
  auto call = [&](int64_t start_pos, int64_t n, const AttentionDims& dims) {
    be->attention(qg.data(), k.data(), v.data(), k_cache.data(), v_cache.data(), capacity, dims,
                  start_pos, n, out.data());
  };
  EXPECT_NO_THROW(call(1, 3, d));  // exactly fills the cache
  EXPECT_THROW(call(2, 3, d), std::invalid_argument);
  EXPECT_THROW(call(4, 1, d), std::invalid_argument);
  EXPECT_THROW(call(-1, 1, d), std::invalid_argument);
  EXPECT_THROW(call(0, 0, d), std::invalid_argument);
  AttentionDims no_kv = d;
  no_kv.kv_heads = 0;
  EXPECT_THROW(call(0, 1, no_kv), std::invalid_argument);
}

TEST(BackendRejects, Conv1dSiluWrongWeight) {
  auto be = cpu();
  const GatedDeltaNetDims d{2, 4, 32, 16, 4};
  const auto C = static_cast<size_t>(d.channels());
  const DenseTensor weight(DType::BF16, {C, 4, 1}, std::vector<float>(C * 4, 0.1f));
  const DenseTensor short_weight(DType::BF16, {C, 3, 1}, std::vector<float>(C * 3, 0.1f));
  const DenseTensor f32_weight(DType::F32, {C, 4, 1}, std::vector<float>(C * 4, 0.1f));
  DenseView f16_weight = f32_weight.view();  // F16 is neither of the two tensor types
  f16_weight.dtype = DType::F16;
  f16_weight.nbytes = C * 4 * 2;
  std::vector<float> mixed(C, 1.0f);
  std::vector<float> window(3 * C);
  std::vector<float> out(C);
  EXPECT_NO_THROW(be->conv1d_silu(mixed.data(), window.data(), weight.view(), d, 1, out.data()));
  EXPECT_THROW(be->conv1d_silu(mixed.data(), window.data(), short_weight.view(), d, 1, out.data()),
               std::invalid_argument);
  // F32 taps are served, as every dense tensor of the contract (op_contract.h) may be F32.
  EXPECT_NO_THROW(be->conv1d_silu(mixed.data(), window.data(), f32_weight.view(), d, 1, out.data()));
  EXPECT_THROW(be->conv1d_silu(mixed.data(), window.data(), f16_weight, d, 1, out.data()),
               std::invalid_argument);
  GatedDeltaNetDims kernel_one = d;
  kernel_one.conv_kernel = 1;
  EXPECT_THROW(be->conv1d_silu(mixed.data(), window.data(), weight.view(), kernel_one, 1, out.data()),
               std::invalid_argument);
}

TEST(BackendRejects, GatedDeltaRuleWrongHeadVectors) {
  auto be = cpu();
  const GatedDeltaNetDims d{2, 4, 32, 16, 4};
  const DenseTensor a_log(DType::F32, {4}, std::vector<float>(4, 0.5f));
  const DenseTensor dt_bias(DType::BF16, {4}, std::vector<float>(4, 0.5f));
  const DenseTensor short_vec(DType::BF16, {2}, std::vector<float>(2, 0.5f));
  std::vector<float> conv(static_cast<size_t>(d.channels()), 0.3f);
  std::vector<float> a(4, 0.1f);
  std::vector<float> b(4, 0.1f);
  std::vector<float> state(4 * 32 * 16);
  std::vector<float> out(4 * 16);
  auto call = [&](const DenseView& al, const DenseView& dt, const GatedDeltaNetDims& dims) {
    be->gated_delta_rule(conv.data(), a.data(), b.data(), al, dt, state.data(), dims, 1, out.data());
  };
  EXPECT_NO_THROW(call(a_log.view(), dt_bias.view(), d));
  EXPECT_THROW(call(short_vec.view(), dt_bias.view(), d), std::invalid_argument);
  EXPECT_THROW(call(a_log.view(), short_vec.view(), d), std::invalid_argument);
  GatedDeltaNetDims uneven = d;
  uneven.key_heads = 3;  // 4 value heads cannot share 3 key heads
  EXPECT_THROW(call(a_log.view(), dt_bias.view(), uneven), std::invalid_argument);
}

TEST(BackendRejects, MoeRouteKOutsideOneToE) {
  auto be = cpu();
  const std::vector<float> logits(8, 0.0f);
  std::vector<int32_t> ids(9);
  std::vector<float> weights(9);
  EXPECT_NO_THROW(be->moe_route(logits.data(), 1, 8, 8, ids.data(), weights.data()));
  EXPECT_THROW(be->moe_route(logits.data(), 1, 8, 9, ids.data(), weights.data()), std::invalid_argument);
  EXPECT_THROW(be->moe_route(logits.data(), 1, 8, 0, ids.data(), weights.data()), std::invalid_argument);
}

TEST(BackendRejects, ExpertSwigluBadIdsAndShapes) {
  Rng rng(94);
  auto be = cpu();
  const QuantWeight gate(rng, 4, 3, 64, 128);
  const QuantWeight up(rng, 4, 3, 64, 128);
  const QuantWeight narrow_up(rng, 4, 3, 32, 128);
  std::vector<float> x(2 * 128, 0.1f);
  std::vector<float> h(2 * 2 * 64);
  const std::vector<int32_t> good = {0, 2, 1, 2};
  EXPECT_NO_THROW(be->expert_swiglu(gate.view(), up.view(), x.data(), good.data(), 2, 2, h.data()));
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{0, 3, 1, 2}, std::vector<int32_t>{0, 1, -1, 2}}) {
    EXPECT_THROW(be->expert_swiglu(gate.view(), up.view(), x.data(), bad.data(), 2, 2, h.data()),
                 std::invalid_argument);  // n > 1 path
    EXPECT_THROW(be->expert_swiglu(gate.view(), up.view(), x.data(), bad.data() + 1, 1, 2, h.data()),
                 std::invalid_argument);  // n = 1 path: ids {3, 1} and {1, -1}
  }
  EXPECT_THROW(be->expert_swiglu(gate.view(), narrow_up.view(), x.data(), good.data(), 2, 2, h.data()),
               std::invalid_argument);
  EXPECT_THROW(be->expert_swiglu(gate.view(), up.view(), x.data(), good.data(), 0, 2, h.data()),
               std::invalid_argument);
}

TEST(BackendRejects, ExpertDownCombineBadIdsAndShapes) {
  Rng rng(95);
  auto be = cpu();
  const QuantWeight down(rng, 4, 3, 32, 64);
  const QuantWeight shared_down(rng, 4, 1, 32, 64);
  const QuantWeight other_shared(rng, 4, 1, 16, 64);
  std::vector<float> h(2 * 2 * 64, 0.1f);
  std::vector<float> weights(4, 0.5f);
  std::vector<float> shared_h(2 * 64, 0.1f);
  std::vector<float> logit(2, 0.0f);
  std::vector<float> out(2 * 32);
  auto call = [&](const QuantView& shared, const int32_t* ids, int64_t n) {
    be->expert_down_combine(down.view(), h.data(), ids, weights.data(), n, 2, shared, shared_h.data(),
                            logit.data(), out.data());
  };
  const std::vector<int32_t> good = {0, 2, 1, 2};
  const std::vector<int32_t> bad = {0, 2, 3, 1};
  EXPECT_NO_THROW(call(shared_down.view(), good.data(), 2));
  EXPECT_THROW(call(shared_down.view(), bad.data(), 2), std::invalid_argument);
  EXPECT_THROW(call(shared_down.view(), bad.data() + 2, 1), std::invalid_argument);
  EXPECT_THROW(call(shared_down.view(), nullptr, 2), std::invalid_argument);
  EXPECT_THROW(call(other_shared.view(), good.data(), 2), std::invalid_argument);
}

}  // namespace
}  // namespace lily::testing

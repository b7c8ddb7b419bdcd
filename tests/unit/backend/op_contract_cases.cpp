// The base ops' rejection cases, shared by backend_tests (CPU) and cuda_tests (CUDA).
#include "op_contract_cases.h"

#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend_test_support.h"

namespace lily::testing {

void expect_contract_rejections(Backend& be) {
  Rng rng(97);
  // Backend memory for every activation, cache, id and position argument: large enough for
  // each call below, zero-filled (ids 0 are valid token and expert ids).
  float* buf = be.alloc(1 << 16);
  int32_t* ids = be.alloc_i32(1 << 10);

  const QuantWeight table(rng, 4, 1, 10, 64, 0, "table");
  const QuantWeight w(rng, 4, 2, 8, 128, 0, "proj");  // 16 rows
  const std::vector<float> ones(64, 1.0f);
  const DenseTensor gain(DType::BF16, {64}, ones, "gain");
  const DenseTensor short_gain(DType::BF16, {32}, std::vector<float>(32, 1.0f), "gain");
  const DenseTensor matrix_gain(DType::F32, {8, 8}, ones, "gain");
  const DenseTensor q_norm(DType::BF16, {64}, ones, "q_norm");
  const DenseTensor short_k_norm(DType::BF16, {63}, std::vector<float>(63, 1.0f), "k_norm");
  const AttentionDims attn{4, 2, 64, 16, 1e7};
  const GatedDeltaNetDims gdn{2, 4, 32, 16, 4};  // 192 channels
  const DenseTensor conv(DType::BF16, {192, 4, 1}, std::vector<float>(192 * 4, 0.1f), "conv1d");
  const DenseTensor short_conv(DType::BF16, {192, 3, 1}, std::vector<float>(192 * 3, 0.1f), "conv1d");
  const DenseTensor a_log(DType::F32, {4}, std::vector<float>(4, 0.5f), "A_log");
  const DenseTensor dt_bias(DType::BF16, {4}, std::vector<float>(4, 0.5f), "dt_bias");
  const DenseTensor short_a_log(DType::F32, {2}, std::vector<float>(2, 0.5f), "A_log");
  const QuantWeight gate(rng, 4, 3, 64, 128, 0, "experts_gate");
  const QuantWeight up(rng, 4, 3, 64, 128, 0, "experts_up");
  const QuantWeight narrow_up(rng, 4, 3, 32, 128, 0, "experts_up");
  const QuantWeight down(rng, 4, 3, 32, 64, 0, "experts_down");
  const QuantWeight shared_down(rng, 4, 1, 32, 64, 0, "shared_down");
  const QuantWeight other_shared(rng, 4, 1, 16, 64, 0, "shared_down");

  QuantView three_bits = table.view();
  three_bits.bits = 3;
  QuantView no_scales = table.view();
  no_scales.scales = nullptr;
  QuantView ragged = w.view();
  ragged.in = 96;
  QuantView no_rows = w.view();
  no_rows.experts = 0;
  DenseView f16 = gain.view();
  f16.dtype = DType::F16;
  DenseView no_data = gain.view();
  no_data.data = nullptr;
  DenseView short_bytes = gain.view();
  short_bytes.nbytes = 126;
  DenseView f16_conv = conv.view();
  f16_conv.dtype = DType::F16;
  AttentionDims uneven_q = attn;
  uneven_q.q_heads = 3;
  AttentionDims odd_rotary = attn;
  odd_rotary.rotary_dim = 15;
  AttentionDims no_kv = attn;
  no_kv.kv_heads = 0;
  GatedDeltaNetDims kernel_one = gdn;
  kernel_one.conv_kernel = 1;
  GatedDeltaNetDims uneven_k = gdn;
  uneven_k.key_heads = 3;
  const float eps = 1e-6f;
  float* b = buf;

  struct Case {
    std::string expected;
    std::function<void()> call;
  };
  const std::vector<Case> cases = {
      // embed
      {"embed: table (table) bits is 3, expected 4 or 8",
       [&] { be.embed(three_bits, ids, 2, b); }},
      {"embed: table (table) scales is null, expected the group scales",
       [&] { be.embed(no_scales, ids, 2, b); }},
      {"embed: n is 0, expected > 0", [&] { be.embed(table.view(), ids, 0, b); }},
      {"embed: ids is null, expected a buffer of n token ids",
       [&] { be.embed(table.view(), nullptr, 2, b); }},
      // matmul
      {"matmul: row_begin + rows is 17, expected at most the 16 rows of w (proj)",
       [&] { be.matmul(w.view(), 10, 7, b, 1, b + 4096); }},
      {"matmul: row_begin is -1, expected >= 0", [&] { be.matmul(w.view(), -1, 2, b, 1, b + 4096); }},
      {"matmul: rows is 0, expected > 0", [&] { be.matmul(w.view(), 0, 0, b, 1, b + 4096); }},
      {"matmul: n is 0, expected > 0", [&] { be.matmul(w.view(), 0, 4, b, 0, b + 4096); }},
      {"matmul: x is null, expected a buffer of n x in values",
       [&] { be.matmul(w.view(), 0, 4, nullptr, 1, b + 4096); }},
      {"matmul: w (proj) input width is 96, expected a positive multiple of 64 (the group size)",
       [&] { be.matmul(ragged, 0, 4, b, 1, b + 4096); }},
      {"matmul: w (proj) rows is 0 x 8, expected at least one row",
       [&] { be.matmul(no_rows, 0, 4, b, 1, b + 4096); }},
      // rms_norm, add_rms_norm, gated_rms_norm
      {"rms_norm: gain (gain) shape is [32], expected [64]",
       [&] { be.rms_norm(b, short_gain.view(), 2, 64, eps, b + 4096); }},
      {"rms_norm: gain (gain) shape is [8, 8], expected [64]",
       [&] { be.rms_norm(b, matrix_gain.view(), 2, 64, eps, b + 4096); }},
      {"rms_norm: gain (gain) dtype is F16, expected BF16 or F32",
       [&] { be.rms_norm(b, f16, 2, 64, eps, b + 4096); }},
      {"rms_norm: gain (gain) data is null, expected the tensor's values",
       [&] { be.rms_norm(b, no_data, 2, 64, eps, b + 4096); }},
      {"rms_norm: n is 0, expected > 0", [&] { be.rms_norm(b, gain.view(), 0, 64, eps, b + 4096); }},
      {"add_rms_norm: delta is null, expected a buffer of n x dim values",
       [&] { be.add_rms_norm(b, nullptr, gain.view(), 2, 64, eps, b + 4096); }},
      {"add_rms_norm: gain (gain) shape is [32], expected [64]",
       [&] { be.add_rms_norm(b, b + 1024, short_gain.view(), 2, 64, eps, b + 4096); }},
      {"gated_rms_norm: z is null, expected a buffer of rows x dim values",
       [&] { be.gated_rms_norm(b, nullptr, gain.view(), 2, 64, eps, b + 4096); }},
      {"gated_rms_norm: dim is 0, expected > 0",
       [&] { be.gated_rms_norm(b, b + 1024, gain.view(), 2, 0, eps, b + 4096); }},
      {"gated_rms_norm: gain (gain) nbytes is 126, expected 128 (64 values)",
       [&] { be.gated_rms_norm(b, b + 1024, short_bytes, 2, 64, eps, b + 4096); }},
      // attention_prepare, attention
      {"attention_prepare: dims.q_heads is 3, expected a multiple of dims.kv_heads = 2",
       [&] { be.attention_prepare(b, b + 4096, q_norm.view(), q_norm.view(), uneven_q, 0, 1, eps); }},
      {"attention_prepare: dims.rotary_dim is 15, expected even, in [2, dims.head_dim = 64]",
       [&] { be.attention_prepare(b, b + 4096, q_norm.view(), q_norm.view(), odd_rotary, 0, 1, eps); }},
      {"attention_prepare: k_norm (k_norm) shape is [63], expected [64]",
       [&] { be.attention_prepare(b, b + 4096, q_norm.view(), short_k_norm.view(), attn, 0, 1, eps); }},
      {"attention_prepare: n is 2, expected 1 with a device position (one decode step)",
       [&] { be.attention_prepare(b, b + 4096, q_norm.view(), q_norm.view(), attn, SeqPos(0, ids), 2, eps); }},
      {"attention_prepare: start_pos is -1, expected >= 0",
       [&] { be.attention_prepare(b, b + 4096, q_norm.view(), q_norm.view(), attn, -1, 1, eps); }},
      {"attention: start_pos + n is 5, expected at most the KV cache capacity 4",
       [&] { be.attention(b, b + 8192, b + 9216, b + 10240, b + 11264, 4, attn, 2, 3, b + 12288); }},
      {"attention: dims.kv_heads is 0, expected > 0",
       [&] { be.attention(b, b + 8192, b + 9216, b + 10240, b + 11264, 4, no_kv, 0, 1, b + 12288); }},
      {"attention: capacity is 0, expected > 0",
       [&] { be.attention(b, b + 8192, b + 9216, b + 10240, b + 11264, 0, attn, 0, 1, b + 12288); }},
      {"attention: v_cache is null, expected a buffer of capacity x kv_heads x head_dim values",
       [&] { be.attention(b, b + 8192, b + 9216, b + 10240, nullptr, 4, attn, 0, 1, b + 12288); }},
      // Keys and values of two KV cache dtypes (the bf16 view is never read: refused first).
      {"attention: v_cache dtype is bf16, expected the keys' dtype f32",
       [&] {
         be.attention(b, b + 8192, b + 9216, b + 10240,
                      KvCacheView::bf16(reinterpret_cast<uint16_t*>(b + 11264)), 4, attn, 0, 1,
                      b + 12288);
       }},
      // conv1d_silu, gated_delta_rule
      {"conv1d_silu: weight (conv1d) shape is [192, 3, 1], expected [192, 4, 1] or [192, 1, 4] "
       "(channels, conv_kernel)",
       [&] { be.conv1d_silu(b, b + 1024, short_conv.view(), gdn, 1, b + 4096); }},
      {"conv1d_silu: dims.conv_kernel is 1, expected >= 2",
       [&] { be.conv1d_silu(b, b + 1024, conv.view(), kernel_one, 1, b + 4096); }},
      {"conv1d_silu: weight (conv1d) dtype is F16, expected BF16 or F32",
       [&] { be.conv1d_silu(b, b + 1024, f16_conv, gdn, 1, b + 4096); }},
      {"conv1d_silu: window is null, expected a buffer of (conv_kernel - 1) x channels values",
       [&] { be.conv1d_silu(b, nullptr, conv.view(), gdn, 1, b + 4096); }},
      {"gated_delta_rule: a_log (A_log) shape is [2], expected [4]",
       [&] { be.gated_delta_rule(b, b + 1024, b + 1100, short_a_log.view(), dt_bias.view(), b + 8192, gdn, 1, b + 4096); }},
      {"gated_delta_rule: dims.value_heads is 4, expected a multiple of dims.key_heads = 3",
       [&] { be.gated_delta_rule(b, b + 1024, b + 1100, a_log.view(), dt_bias.view(), b + 8192, uneven_k, 1, b + 4096); }},
      {"gated_delta_rule: state is null, expected a buffer of value_heads x key_dim x value_dim values",
       [&] { be.gated_delta_rule(b, b + 1024, b + 1100, a_log.view(), dt_bias.view(), nullptr, gdn, 1, b + 4096); }},
      // moe_route, expert_swiglu, expert_down_combine, argmax
      {"moe_route: k is 9, expected in [1, experts = 8]",
       [&] { be.moe_route(b, 1, 8, 9, ids, b + 4096); }},
      {"moe_route: k is 0, expected in [1, experts = 8]",
       [&] { be.moe_route(b, 1, 8, 0, ids, b + 4096); }},
      {"moe_route: n is 0, expected > 0", [&] { be.moe_route(b, 0, 8, 2, ids, b + 4096); }},
      {"expert_swiglu: up (experts_up) shape is 3 x [32, 128], expected the shape of gate "
       "(experts_gate), 3 x [64, 128]",
       [&] { be.expert_swiglu(gate.view(), narrow_up.view(), b, ids, 2, 2, b + 4096); }},
      {"expert_swiglu: n is 0, expected > 0",
       [&] { be.expert_swiglu(gate.view(), up.view(), b, ids, 0, 2, b + 4096); }},
      {"expert_swiglu: k is 0, expected > 0",
       [&] { be.expert_swiglu(gate.view(), up.view(), b, ids, 2, 0, b + 4096); }},
      {"expert_swiglu: h is null, expected a buffer of n x k x out values",
       [&] { be.expert_swiglu(gate.view(), up.view(), b, ids, 2, 2, nullptr); }},
      {"expert_down_combine: shared_down (shared_down) rows is 1 x 16, expected one matrix of the "
       "routed output width 32",
       [&] { be.expert_down_combine(down.view(), b, ids, b + 1024, 2, 2, other_shared.view(), b + 2048, b + 3072, b + 4096); }},
      {"expert_down_combine: ids is null, expected a buffer of n x k expert ids",
       [&] { be.expert_down_combine(down.view(), b, nullptr, b + 1024, 2, 2, shared_down.view(), b + 2048, b + 3072, b + 4096); }},
      {"expert_down_combine: shared_logit is null, expected a buffer of n values",
       [&] { be.expert_down_combine(down.view(), b, ids, b + 1024, 2, 2, shared_down.view(), b + 2048, nullptr, b + 4096); }},
      {"argmax: vocab is 0, expected > 0", [&] { be.argmax(b, 1, 0, ids); }},
      {"argmax: out is null, expected a buffer of n ids", [&] { be.argmax(b, 1, 16, nullptr); }},
  };
  for (const Case& c : cases) {
    try {
      c.call();
      ADD_FAILURE() << be.name() << " accepted what the contract refuses: " << c.expected;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), c.expected) << be.name();
    }
  }
  be.synchronize();  // nothing was launched: the stream is still clean
}

}  // namespace lily::testing

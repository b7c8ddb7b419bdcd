// The exact tensor inventory of the MLX checkpoint, derived from the model shape.
#include "checkpoint/tensor_plan.h"

namespace lily {

std::vector<uint64_t> PlannedTensor::codes_shape() const {
  std::vector<uint64_t> shape;
  if (experts > 0) shape.push_back(experts);
  shape.push_back(out);
  shape.push_back(in * static_cast<uint64_t>(bits) / 32);
  return shape;
}

std::vector<uint64_t> PlannedTensor::groups_shape() const {
  std::vector<uint64_t> shape;
  if (experts > 0) shape.push_back(experts);
  shape.push_back(out);
  shape.push_back(in / kQuantGroupSize);
  return shape;
}

std::vector<std::string> PlannedTensor::stored_names() const {
  if (!quantized) return {base};
  return {base + ".weight", base + ".scales", base + ".biases"};
}

namespace {

class PlanBuilder {
 public:
  void quant(std::string base, TensorRole role, int64_t layer, uint64_t experts, uint64_t out,
             uint64_t in, int bits) {
    PlannedTensor t;
    t.base = std::move(base);
    t.role = role;
    t.layer = layer;
    t.quantized = true;
    t.experts = experts;
    t.out = out;
    t.in = in;
    t.bits = bits;
    plan.push_back(std::move(t));
  }
  void dense(std::string name, TensorRole role, int64_t layer, std::vector<DType> dtypes,
             std::vector<std::vector<uint64_t>> shapes, NormKind norm = NormKind::not_a_norm) {
    PlannedTensor t;
    t.base = std::move(name);
    t.role = role;
    t.layer = layer;
    t.dtypes = std::move(dtypes);
    t.shapes = std::move(shapes);
    t.norm = norm;
    plan.push_back(std::move(t));
  }
  void norm(std::string name, TensorRole role, int64_t layer, uint64_t size) {
    dense(std::move(name), role, layer, {DType::BF16}, {{size}}, NormKind::baked_plus_one);
  }
  std::vector<PlannedTensor> plan;
};

}  // namespace

std::vector<PlannedTensor> plan_tensors(const ModelShape& s) {
  const std::string P = kLanguageModelPrefix;
  const uint64_t H = s.hidden_size;
  PlanBuilder b;
  b.quant(P + "embed_tokens", TensorRole::embed, -1, 0, s.vocab_size, H, kQuantBits);
  for (uint64_t i = 0; i < s.num_layers; ++i) {
    const auto layer = static_cast<int64_t>(i);
    const std::string L = P + "layers." + std::to_string(i) + ".";
    b.norm(L + "input_layernorm.weight", TensorRole::input_norm, layer, H);
    b.norm(L + "post_attention_layernorm.weight", TensorRole::post_attention_norm, layer, H);
    if (ModelShape::layer_kind(i) == LayerKind::linear_attention) {
      const std::string A = L + "linear_attn.";
      const uint64_t conv = s.gdn_conv_channels();
      const uint64_t vheads = s.linear_num_value_heads;
      b.quant(A + "in_proj_qkv", TensorRole::gdn_in_qkv, layer, 0, conv, H, kQuantBits);
      b.quant(A + "in_proj_z", TensorRole::gdn_in_z, layer, 0, s.gdn_value_width(), H, kQuantBits);
      b.quant(A + "in_proj_a", TensorRole::gdn_in_a, layer, 0, vheads, H, kQuantBits);
      b.quant(A + "in_proj_b", TensorRole::gdn_in_b, layer, 0, vheads, H, kQuantBits);
      // mlx stores depthwise conv weights [C, K, 1]; the HF layout [C, 1, K] is also accepted.
      b.dense(A + "conv1d.weight", TensorRole::gdn_conv1d, layer, {DType::BF16},
              {{conv, s.linear_conv_kernel_dim, 1}, {conv, 1, s.linear_conv_kernel_dim}});
      // A_log stays in its source dtype (mlx excludes it from casting); accept F32 or BF16.
      b.dense(A + "A_log", TensorRole::gdn_a_log, layer, {DType::F32, DType::BF16}, {{vheads}});
      b.dense(A + "dt_bias", TensorRole::gdn_dt_bias, layer, {DType::BF16, DType::F32}, {{vheads}});
      b.dense(A + "norm.weight", TensorRole::gdn_norm, layer, {DType::BF16, DType::F32},
              {{s.linear_value_head_dim}}, NormKind::plain_gain);
      b.quant(A + "out_proj", TensorRole::gdn_out, layer, 0, H, s.gdn_value_width(), kQuantBits);
    } else {
      const std::string A = L + "self_attn.";
      b.quant(A + "q_proj", TensorRole::attn_q, layer, 0, s.attn_q_rows(), H, kQuantBits);
      b.quant(A + "k_proj", TensorRole::attn_k, layer, 0, s.attn_kv_rows(), H, kQuantBits);
      b.quant(A + "v_proj", TensorRole::attn_v, layer, 0, s.attn_kv_rows(), H, kQuantBits);
      b.quant(A + "o_proj", TensorRole::attn_o, layer, 0, H, s.attn_o_in(), kQuantBits);
      b.norm(A + "q_norm.weight", TensorRole::attn_q_norm, layer, s.head_dim);
      b.norm(A + "k_norm.weight", TensorRole::attn_k_norm, layer, s.head_dim);
    }
    const std::string M = L + "mlp.";
    const uint64_t E = s.num_experts;
    const uint64_t I = s.moe_intermediate_size;
    const uint64_t S = s.shared_expert_intermediate_size;
    b.quant(M + "gate", TensorRole::router, layer, 0, E, H, kQuantBitsGates);
    b.quant(M + "switch_mlp.gate_proj", TensorRole::experts_gate, layer, E, I, H, kQuantBits);
    b.quant(M + "switch_mlp.up_proj", TensorRole::experts_up, layer, E, I, H, kQuantBits);
    b.quant(M + "switch_mlp.down_proj", TensorRole::experts_down, layer, E, H, I, kQuantBits);
    b.quant(M + "shared_expert.gate_proj", TensorRole::shared_gate, layer, 0, S, H, kQuantBits);
    b.quant(M + "shared_expert.up_proj", TensorRole::shared_up, layer, 0, S, H, kQuantBits);
    b.quant(M + "shared_expert.down_proj", TensorRole::shared_down, layer, 0, H, S, kQuantBits);
    b.quant(M + "shared_expert_gate", TensorRole::shared_expert_gate, layer, 0, 1, H,
            kQuantBitsGates);
  }
  b.norm(P + "norm.weight", TensorRole::final_norm, -1, H);
  b.quant("language_model.lm_head", TensorRole::lm_head, -1, 0, s.vocab_size, H, kQuantBits);
  return std::move(b.plan);
}

uint64_t stored_tensor_count(const std::vector<PlannedTensor>& plan) {
  uint64_t count = 0;
  for (const PlannedTensor& t : plan) count += t.quantized ? 3 : 1;
  return count;
}

}  // namespace lily

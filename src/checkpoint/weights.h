// Load-time view of every model weight: validated views into the mapped shards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"

namespace lily {

// A quantized projection in the mapping. Stacked experts are flattened: expert e's row r
// is row e * out + r. Pointers may be unaligned (safetensors offsets are byte offsets);
// read through memcpy or unaligned loads.
struct QuantView {
  std::string name;          // base name, e.g. language_model.model.layers.0.mlp.gate
  int bits = 0;              // 4 or 8, inferred from the packed width
  uint64_t experts = 1;      // 1 unless stacked
  uint64_t out = 0;          // rows per expert
  uint64_t in = 0;           // logical input features (multiple of 64)
  const std::byte* codes = nullptr;   // U32  [experts * out, in * bits / 32]
  const std::byte* scales = nullptr;  // BF16 [experts * out, in / 64]
  const std::byte* biases = nullptr;  // BF16 [experts * out, in / 64]

  uint64_t rows() const { return experts * out; }
  uint64_t words_per_row() const { return in * static_cast<uint64_t>(bits) / 32; }
  uint64_t groups_per_row() const { return in / kQuantGroupSize; }
  uint64_t stored_bytes() const { return rows() * (words_per_row() * 4 + groups_per_row() * 4); }
};

// An unquantized tensor in the mapping (norm gains, conv taps, A_log, dt_bias).
struct DenseView {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<uint64_t> shape;
  const std::byte* data = nullptr;  // possibly unaligned
  uint64_t nbytes = 0;
};

struct GatedDeltaNetWeights {
  QuantView in_proj_qkv;  // [conv_channels, H]: q | k | v rows
  QuantView in_proj_z;    // [value_width, H]
  QuantView in_proj_a;    // [value_heads, H]
  QuantView in_proj_b;    // [value_heads, H]
  DenseView conv1d;       // BF16 [C, K, 1] (mlx) or [C, 1, K] (HF); tap k of channel c at c*K + k
  DenseView a_log;        // F32 or BF16 [value_heads]
  DenseView dt_bias;      // BF16 or F32 [value_heads]
  DenseView norm;         // BF16 or F32 [value_head_dim], plain gain (no +1 baked in)
  QuantView out_proj;     // [H, value_width]
};

struct AttentionWeights {
  QuantView q_proj;  // [heads * head_dim * 2, H]: per head, head_dim query rows then head_dim gate rows
  QuantView k_proj;  // [kv_heads * head_dim, H]
  QuantView v_proj;  // [kv_heads * head_dim, H]
  QuantView o_proj;  // [H, heads * head_dim]
  DenseView q_norm;  // BF16 [head_dim], +1 baked in
  DenseView k_norm;  // BF16 [head_dim], +1 baked in
};

struct MoeWeights {
  QuantView router;              // Q8 [E, H]
  QuantView experts_gate;        // Q4 [E x I, H]
  QuantView experts_up;          // Q4 [E x I, H]
  QuantView experts_down;        // Q4 [E x H, I]
  QuantView shared_gate;         // Q4 [S, H]
  QuantView shared_up;           // Q4 [S, H]
  QuantView shared_down;         // Q4 [H, S]
  QuantView shared_expert_gate;  // Q8 [1, H]
};

struct LayerWeights {
  LayerKind kind = LayerKind::linear_attention;
  DenseView input_norm;           // BF16 [H], +1 baked in
  DenseView post_attention_norm;  // BF16 [H], +1 baked in
  GatedDeltaNetWeights gdn;       // valid when kind == linear_attention
  AttentionWeights attn;          // valid when kind == full_attention
  MoeWeights moe;
};

struct ModelWeights {
  QuantView embed;       // Q4 [V, H]
  DenseView final_norm;  // BF16 [H], +1 baked in
  QuantView lm_head;     // Q4 [V, H]
  std::vector<LayerWeights> layers;
};

// Inventory statistics for `lily inspect`.
struct WeightStats {
  uint64_t stored_tensors = 0;   // language-model tensors consumed
  uint64_t skipped_tensors = 0;  // vision_tower.* entries ignored
  uint64_t q4_projections = 0;
  uint64_t q8_projections = 0;
  uint64_t dense_tensors = 0;
  uint64_t weight_bytes = 0;     // bytes of all consumed tensors
};

// Binds every expected tensor (see tensor_plan.h) to its view, checking dtype, shape and
// bit width, then refuses any tensor that was neither consumed nor skipped (vision_tower.*).
// Throws InputError naming the tensor, what was expected and what was found.
ModelWeights bind_weights(const TensorStore& store, const ModelShape& shape, WeightStats* stats);

}  // namespace lily

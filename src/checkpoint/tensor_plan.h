// The exact tensor inventory of the MLX checkpoint, derived from the model shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"

namespace lily {

// What a tensor is for; the loader binds each role to a field of ModelWeights.
enum class TensorRole {
  embed, lm_head, final_norm,
  input_norm, post_attention_norm,
  router, experts_gate, experts_up, experts_down,
  shared_gate, shared_up, shared_down, shared_expert_gate,
  gdn_in_qkv, gdn_in_z, gdn_in_a, gdn_in_b, gdn_conv1d, gdn_a_log, gdn_dt_bias, gdn_norm, gdn_out,
  attn_q, attn_k, attn_v, attn_o, attn_q_norm, attn_k_norm,
};

// How the norm weights are stored: mlx bakes the zero-centred norms' +1 into the weight;
// the Gated DeltaNet gated norm is a plain gain.
enum class NormKind { not_a_norm, baked_plus_one, plain_gain };

// One expected checkpoint entry. A quantized projection is three stored tensors:
//   base.weight  U32  [experts?, out, in * bits / 32]   packed codes, low bits first
//   base.scales  BF16 [experts?, out, in / 64]
//   base.biases  BF16 [experts?, out, in / 64]
// A dense tensor is stored under `base` itself with one of `dtypes` and one of `shapes`.
struct PlannedTensor {
  std::string base;
  TensorRole role;
  int64_t layer = -1;  // -1 for global tensors
  bool quantized = false;
  // quantized
  uint64_t experts = 0;  // 0: a plain [out, in] matrix; else stacked [experts, out, in]
  uint64_t out = 0;
  uint64_t in = 0;
  int bits = 0;
  // dense: accepted dtypes and shapes; the first of each is what mlx writes
  std::vector<DType> dtypes;
  std::vector<std::vector<uint64_t>> shapes;
  NormKind norm = NormKind::not_a_norm;

  std::vector<uint64_t> codes_shape() const;
  std::vector<uint64_t> groups_shape() const;  // scales and biases
  // Stored tensors this entry stands for (3 for quantized, 1 for dense).
  std::vector<std::string> stored_names() const;
};

inline constexpr const char* kLanguageModelPrefix = "language_model.model.";
inline constexpr const char* kSkippedPrefix = "vision_tower.";

// In checkpoint order: embed, layers 0..N-1, final norm, lm_head.
std::vector<PlannedTensor> plan_tensors(const ModelShape& shape);

// Number of stored tensors the plan expects (1,757 for production).
uint64_t stored_tensor_count(const std::vector<PlannedTensor>& plan);

}  // namespace lily

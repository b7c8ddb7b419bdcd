// config.json: the model shape (production or tiny test profile) and the quantization block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/strict_json.h"

namespace lily {

enum class Profile { production, tiny };
enum class LayerKind { linear_attention, full_attention };

const char* profile_name(Profile profile);
const char* layer_kind_name(LayerKind kind);

// Every number of the architecture that config.json fixes. Only two values are accepted:
// ModelShape::production() and, with the "lily_test_profile": "tiny" marker, ::tiny().
struct ModelShape {
  uint64_t hidden_size = 0;
  uint64_t num_layers = 0;
  uint64_t num_attention_heads = 0;
  uint64_t num_key_value_heads = 0;
  uint64_t head_dim = 0;
  bool attn_output_gate = false;
  double partial_rotary_factor = 0;
  double rope_theta = 0;
  uint64_t linear_num_key_heads = 0;
  uint64_t linear_num_value_heads = 0;
  uint64_t linear_key_head_dim = 0;
  uint64_t linear_value_head_dim = 0;
  uint64_t linear_conv_kernel_dim = 0;
  uint64_t num_experts = 0;
  uint64_t num_experts_per_tok = 0;
  uint64_t moe_intermediate_size = 0;
  uint64_t shared_expert_intermediate_size = 0;
  uint64_t vocab_size = 0;
  double rms_norm_eps = 0;
  uint64_t max_position_embeddings = 0;
  bool tie_word_embeddings = true;

  static ModelShape production();
  static ModelShape tiny();

  // Full attention at every fourth layer (i % 4 == 3), Gated DeltaNet elsewhere.
  static LayerKind layer_kind(uint64_t layer) {
    return layer % 4 == 3 ? LayerKind::full_attention : LayerKind::linear_attention;
  }
  // Derived sizes.
  uint64_t rotary_dim() const {
    return static_cast<uint64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  uint64_t gdn_key_width() const { return linear_num_key_heads * linear_key_head_dim; }
  uint64_t gdn_value_width() const { return linear_num_value_heads * linear_value_head_dim; }
  uint64_t gdn_conv_channels() const { return 2 * gdn_key_width() + gdn_value_width(); }
  uint64_t attn_q_rows() const {  // query + output gate, interleaved per head
    return num_attention_heads * head_dim * (attn_output_gate ? 2 : 1);
  }
  uint64_t attn_kv_rows() const { return num_key_value_heads * head_dim; }
  uint64_t attn_o_in() const { return num_attention_heads * head_dim; }
};

inline constexpr uint64_t kQuantGroupSize = 64;
inline constexpr int kQuantBits = 4;
inline constexpr int kQuantBitsGates = 8;  // mlp.gate (router) and mlp.shared_expert_gate

// The validated content of config.json.
struct ModelConfig {
  Profile profile = Profile::production;
  ModelShape shape;
  std::vector<uint32_t> eos_token_ids;  // top-level eos_token_id, else text_config's
};

// Validates a parsed config.json. Throws InputError naming the field, what was found and
// what was expected. `where` prefixes messages (normally "config.json").
ModelConfig parse_model_config(const Json& config, const std::string& where);

// Reads and validates DIR/config.json.
ModelConfig load_model_config(const std::string& dir);

// The exact per-tensor override keys mlx writes into the quantization block.
std::string quant_override_key(uint64_t layer, const char* module);  // module: "mlp.gate", ...

}  // namespace lily

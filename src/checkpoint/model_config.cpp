// config.json: the model shape (production or tiny test profile) and the quantization block.
#include "checkpoint/model_config.h"

#include <set>
#include <sstream>

#include "core/error.h"

namespace lily {

namespace {

constexpr uint64_t kMaxConfigBytes = 4ull << 20;
constexpr int kMaxConfigDepth = 8;

std::string format_double(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}

// One row of the shape comparison: the config key and how to read/print it.
struct Mismatch {
  std::string field;
  std::string found;
  std::string expected;
};

// Returns the first field where `found` differs from `expected`, in config order.
std::optional<Mismatch> first_difference(const ModelShape& found, const ModelShape& expected) {
  auto u = [](uint64_t v) { return std::to_string(v); };
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  auto d = [](double v) { return format_double(v); };
#define LILY_COMPARE(member, key, fmt)                                  \
  if (found.member != expected.member) {                                \
    return Mismatch{key, fmt(found.member), fmt(expected.member)};      \
  }
  LILY_COMPARE(hidden_size, "text_config.hidden_size", u)
  LILY_COMPARE(num_layers, "text_config.num_hidden_layers", u)
  LILY_COMPARE(num_attention_heads, "text_config.num_attention_heads", u)
  LILY_COMPARE(num_key_value_heads, "text_config.num_key_value_heads", u)
  LILY_COMPARE(head_dim, "text_config.head_dim", u)
  LILY_COMPARE(attn_output_gate, "text_config.attn_output_gate", b)
  LILY_COMPARE(partial_rotary_factor, "text_config.rope_parameters.partial_rotary_factor", d)
  LILY_COMPARE(rope_theta, "text_config.rope_parameters.rope_theta", d)
  LILY_COMPARE(linear_num_key_heads, "text_config.linear_num_key_heads", u)
  LILY_COMPARE(linear_num_value_heads, "text_config.linear_num_value_heads", u)
  LILY_COMPARE(linear_key_head_dim, "text_config.linear_key_head_dim", u)
  LILY_COMPARE(linear_value_head_dim, "text_config.linear_value_head_dim", u)
  LILY_COMPARE(linear_conv_kernel_dim, "text_config.linear_conv_kernel_dim", u)
  LILY_COMPARE(num_experts, "text_config.num_experts", u)
  LILY_COMPARE(num_experts_per_tok, "text_config.num_experts_per_tok", u)
  LILY_COMPARE(moe_intermediate_size, "text_config.moe_intermediate_size", u)
  LILY_COMPARE(shared_expert_intermediate_size, "text_config.shared_expert_intermediate_size", u)
  LILY_COMPARE(vocab_size, "text_config.vocab_size", u)
  LILY_COMPARE(rms_norm_eps, "text_config.rms_norm_eps", d)
  LILY_COMPARE(max_position_embeddings, "text_config.max_position_embeddings", u)
  LILY_COMPARE(tie_word_embeddings, "text_config.tie_word_embeddings", b)
#undef LILY_COMPARE
  return std::nullopt;
}

// Optional fields that, when present, must hold the one value this model uses.
void check_optional_equal(const Json& object, const char* key, const Json& expected,
                          const std::string& where) {
  auto it = object.find(key);
  if (it != object.end() && *it != expected) {
    throw InputError(where + "." + key + " is " + describe_json(*it) + ", expected " +
                     expected.dump());
  }
}

void check_quant_params(const Json& block, int bits, const std::string& where) {
  const uint64_t group = require_uint(block, "group_size", where);
  const uint64_t found_bits = require_uint(block, "bits", where);
  std::string mode = "affine";
  if (auto it = block.find("mode"); it != block.end()) {
    if (!it->is_string()) {
      throw InputError(where + ".mode is " + describe_json(*it) + ", expected \"affine\"");
    }
    mode = it->get<std::string>();
  }
  if (mode != "affine" || found_bits != static_cast<uint64_t>(bits) ||
      group != kQuantGroupSize) {
    throw InputError(where + " is mode=" + mode + ", bits=" + std::to_string(found_bits) +
                     ", group_size=" + std::to_string(group) + "; expected MLX affine " +
                     std::to_string(bits) + "-bit with group_size=64");
  }
}

void check_quantization(const Json& config, const ModelShape& shape, const std::string& where) {
  const std::string qwhere = where + ": quantization";
  auto it = config.find("quantization");
  if (it == config.end()) {
    throw InputError(qwhere + " is missing; lily needs the MLX affine 4-bit checkpoint");
  }
  const Json& quant = *it;
  if (!quant.is_object()) {
    throw InputError(qwhere + " is " + describe_json(quant) + ", expected an object");
  }
  check_quant_params(quant, kQuantBits, qwhere);

  std::set<std::string> expected_overrides;
  for (uint64_t layer = 0; layer < shape.num_layers; ++layer) {
    expected_overrides.insert(quant_override_key(layer, "mlp.gate"));
    expected_overrides.insert(quant_override_key(layer, "mlp.shared_expert_gate"));
  }
  for (const auto& [key, value] : quant.items()) {
    if (!value.is_object()) continue;  // group_size/bits/mode, or "module: false" markers
    if (key.rfind("vision_tower.", 0) == 0) continue;  // the vision tower is not loaded
    if (expected_overrides.erase(key) == 0) {
      throw InputError(qwhere + " has an unexpected per-tensor override \"" + key +
                       "\"; only mlp.gate and mlp.shared_expert_gate are 8-bit");
    }
    check_quant_params(value, kQuantBitsGates, qwhere + "[\"" + key + "\"]");
  }
  if (!expected_overrides.empty()) {
    throw InputError(qwhere + " lacks the 8-bit override \"" + *expected_overrides.begin() +
                     "\" (expected {\"group_size\": 64, \"bits\": 8} for every mlp.gate and " +
                     "mlp.shared_expert_gate)");
  }
}

std::vector<uint32_t> parse_eos(const Json& value, uint64_t vocab, const std::string& where) {
  std::vector<uint32_t> ids;
  auto add = [&](const Json& item, const std::string& item_where) {
    const uint64_t id = as_uint(item, item_where);
    if (id >= vocab) {
      throw InputError(item_where + " is " + std::to_string(id) + ", expected a token id below " +
                       std::to_string(vocab));
    }
    ids.push_back(static_cast<uint32_t>(id));
  };
  if (value.is_array()) {
    if (value.empty()) throw InputError(where + " is an empty list, expected token ids");
    for (size_t i = 0; i < value.size(); ++i) add(value[i], where + "[" + std::to_string(i) + "]");
  } else {
    add(value, where);
  }
  return ids;
}

}  // namespace

const char* profile_name(Profile profile) {
  return profile == Profile::tiny ? "tiny" : "production";
}

const char* layer_kind_name(LayerKind kind) {
  return kind == LayerKind::full_attention ? "full_attention" : "linear_attention";
}

ModelShape ModelShape::production() {
  ModelShape s;
  s.hidden_size = 2048;
  s.num_layers = 40;
  s.num_attention_heads = 16;
  s.num_key_value_heads = 2;
  s.head_dim = 256;
  s.attn_output_gate = true;
  s.partial_rotary_factor = 0.25;
  s.rope_theta = 10000000.0;
  s.linear_num_key_heads = 16;
  s.linear_num_value_heads = 32;
  s.linear_key_head_dim = 128;
  s.linear_value_head_dim = 128;
  s.linear_conv_kernel_dim = 4;
  s.num_experts = 256;
  s.num_experts_per_tok = 8;
  s.moe_intermediate_size = 512;
  s.shared_expert_intermediate_size = 512;
  s.vocab_size = 248320;
  s.rms_norm_eps = 1e-6;
  s.max_position_embeddings = 262144;
  s.tie_word_embeddings = false;
  return s;
}

ModelShape ModelShape::tiny() {
  ModelShape s = production();
  s.hidden_size = 256;
  s.num_layers = 8;
  s.num_attention_heads = 8;
  s.num_key_value_heads = 1;
  s.linear_num_key_heads = 2;
  s.linear_num_value_heads = 4;
  s.num_experts = 32;
  s.moe_intermediate_size = 128;
  s.shared_expert_intermediate_size = 128;
  s.vocab_size = 4096;
  return s;
}

std::string quant_override_key(uint64_t layer, const char* module) {
  return "language_model.model.layers." + std::to_string(layer) + "." + module;
}

ModelConfig parse_model_config(const Json& config, const std::string& where) {
  if (!config.is_object()) {
    throw InputError(where + " is " + describe_json(config) + ", expected an object");
  }
  const std::string model_type = require_string(config, "model_type", where);
  if (model_type != "qwen3_5_moe") {
    throw InputError(where + ": model_type is \"" + model_type +
                     "\", expected \"qwen3_5_moe\" (lily only serves Qwen3.6-35B-A3B)");
  }

  Profile profile = Profile::production;
  if (auto marker = config.find("lily_test_profile"); marker != config.end()) {
    if (*marker != Json("tiny")) {
      throw InputError(where + ": lily_test_profile is " + describe_json(*marker) +
                       ", expected \"tiny\" (the only test profile)");
    }
    profile = Profile::tiny;
  }

  const std::string tw = where + ": text_config";
  const Json& text = require_field(config, "text_config", where);
  if (!text.is_object()) throw InputError(tw + " is " + describe_json(text) + ", expected an object");

  ModelShape found;
  found.hidden_size = require_uint(text, "hidden_size", tw);
  found.num_layers = require_uint(text, "num_hidden_layers", tw);
  found.num_attention_heads = require_uint(text, "num_attention_heads", tw);
  found.num_key_value_heads = require_uint(text, "num_key_value_heads", tw);
  found.head_dim = require_uint(text, "head_dim", tw);
  found.attn_output_gate = require_bool(text, "attn_output_gate", tw);
  const Json& rope = require_field(text, "rope_parameters", tw);
  found.partial_rotary_factor = require_number(rope, "partial_rotary_factor", tw + ".rope_parameters");
  found.rope_theta = require_number(rope, "rope_theta", tw + ".rope_parameters");
  found.linear_num_key_heads = require_uint(text, "linear_num_key_heads", tw);
  found.linear_num_value_heads = require_uint(text, "linear_num_value_heads", tw);
  found.linear_key_head_dim = require_uint(text, "linear_key_head_dim", tw);
  found.linear_value_head_dim = require_uint(text, "linear_value_head_dim", tw);
  found.linear_conv_kernel_dim = require_uint(text, "linear_conv_kernel_dim", tw);
  found.num_experts = require_uint(text, "num_experts", tw);
  found.num_experts_per_tok = require_uint(text, "num_experts_per_tok", tw);
  found.moe_intermediate_size = require_uint(text, "moe_intermediate_size", tw);
  found.shared_expert_intermediate_size = require_uint(text, "shared_expert_intermediate_size", tw);
  found.vocab_size = require_uint(text, "vocab_size", tw);
  found.rms_norm_eps = require_number(text, "rms_norm_eps", tw);
  found.max_position_embeddings = require_uint(text, "max_position_embeddings", tw);
  found.tie_word_embeddings = require_bool(text, "tie_word_embeddings", tw);

  // Layer pattern: an explicit list, one entry per layer, full attention at i % 4 == 3.
  const Json& layer_types = require_field(text, "layer_types", tw);
  if (!layer_types.is_array()) {
    throw InputError(tw + ".layer_types is " + describe_json(layer_types) + ", expected a list");
  }

  const ModelShape expected = profile == Profile::tiny ? ModelShape::tiny() : ModelShape::production();
  if (auto diff = first_difference(found, expected)) {
    std::string message = where + ": " + diff->field + " is " + diff->found + ", expected " +
                          diff->expected + " for the " +
                          (profile == Profile::tiny ? "tiny test profile"
                                                    : "production Qwen3.6-35B-A3B shape");
    if (profile == Profile::production && !first_difference(found, ModelShape::tiny())) {
      message += " (this is the tiny test shape, which needs the top-level marker "
                 "\"lily_test_profile\": \"tiny\")";
    }
    if (profile == Profile::tiny && !first_difference(found, ModelShape::production())) {
      message += " (the \"lily_test_profile\": \"tiny\" marker is on the production shape)";
    }
    throw InputError(message);
  }
  // After the shape check, so a wrong num_hidden_layers is reported as such.
  if (layer_types.size() != found.num_layers) {
    throw InputError(tw + ".layer_types has " + std::to_string(layer_types.size()) +
                     " entries for " + std::to_string(found.num_layers) + " layers");
  }
  for (uint64_t i = 0; i < found.num_layers; ++i) {
    const char* want = layer_kind_name(ModelShape::layer_kind(i));
    if (layer_types[i] != Json(want)) {
      throw InputError(tw + ".layer_types[" + std::to_string(i) + "] is " +
                       describe_json(layer_types[i]) + ", expected \"" + want +
                       "\" (full attention exactly at layers with i % 4 == 3)");
    }
  }

  // Values that may be present and then must be this model's.
  check_optional_equal(text, "model_type", "qwen3_5_moe_text", tw);
  check_optional_equal(text, "partial_rotary_factor", expected.partial_rotary_factor, tw);
  check_optional_equal(text, "hidden_act", "silu", tw);
  check_optional_equal(text, "attention_bias", false, tw);
  check_optional_equal(text, "norm_topk_prob", true, tw);
  check_optional_equal(text, "mlp_only_layers", Json::array(), tw);
  check_optional_equal(text, "full_attention_interval", 4, tw);
  check_optional_equal(text, "decoder_sparse_step", 1, tw);
  check_optional_equal(text, "mamba_ssm_dtype", "float32", tw);
  check_optional_equal(text, "use_sliding_window", false, tw);
  // Text positions are equal on all three mRoPE axes, so the sections do not change the
  // math; still, a different rope type or layout means a different model.
  check_optional_equal(rope, "rope_type", "default", tw + ".rope_parameters");
  check_optional_equal(rope, "mrope_interleaved", true, tw + ".rope_parameters");
  check_optional_equal(rope, "mrope_section", Json::array({11, 11, 10}), tw + ".rope_parameters");
  check_optional_equal(config, "tie_word_embeddings", false, where);
  if (auto arch = config.find("architectures"); arch != config.end()) {
    if (*arch != Json::array({"Qwen3_5MoeForConditionalGeneration"}) &&
        *arch != Json::array({"Qwen3_5MoeForCausalLM"})) {
      throw InputError(where + ": architectures is " + describe_json(*arch) +
                       ", expected [\"Qwen3_5MoeForConditionalGeneration\"]");
    }
  }

  check_quantization(config, found, where);
  // mlx writes the same block twice; a disagreement would make the file ambiguous.
  if (auto copy = config.find("quantization_config"); copy != config.end()) {
    if (auto quant = config.find("quantization"); quant != config.end() && *copy != *quant) {
      throw InputError(where + ": quantization_config differs from quantization; expected "
                       "the same block (mlx writes both)");
    }
  }

  ModelConfig result;
  result.profile = profile;
  result.shape = found;
  if (auto top = config.find("eos_token_id"); top != config.end()) {
    result.eos_token_ids = parse_eos(*top, found.vocab_size, where + ": eos_token_id");
  } else if (auto inner = text.find("eos_token_id"); inner != text.end()) {
    result.eos_token_ids = parse_eos(*inner, found.vocab_size, tw + ".eos_token_id");
  }
  return result;
}

ModelConfig load_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const Json config = read_strict_json_file(path, kMaxConfigBytes, kMaxConfigDepth);
  return parse_model_config(config, "config.json");
}

}  // namespace lily

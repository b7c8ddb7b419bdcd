// `lily make-checkpoint`: writes a complete synthetic checkpoint in the MLX on-disk layout.
#include "synth/make_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/tensor_plan.h"
#include "core/error.h"
#include "synth/safetensors_writer.h"
#include "synth/synthetic_tokenizer.h"
#include "synth/synthetic_weights.h"

namespace lily {

namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write " + path.string());
}

std::string shard_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

}  // namespace

std::string synthetic_generation_config_json(uint32_t endoftext_id, uint32_t im_end_id) {
  // The Qwen3.5/3.6 family's generation_config.json (docs/checkpoint.md): sampling on,
  // temperature 1.0, top_k 20, top_p 0.95; eos both <|im_end|> and <|endoftext|>.
  OrderedJson out = OrderedJson::object();
  out["bos_token_id"] = endoftext_id;
  out["do_sample"] = true;
  out["eos_token_id"] = OrderedJson::array({im_end_id, endoftext_id});
  out["pad_token_id"] = endoftext_id;
  out["temperature"] = 1.0;
  out["top_k"] = 20;
  out["top_p"] = 0.95;
  return out.dump(2) + "\n";
}

std::string synthetic_config_json(Profile profile, uint32_t endoftext_id, uint32_t im_end_id) {
  const ModelShape s = profile == Profile::tiny ? ModelShape::tiny() : ModelShape::production();
  OrderedJson layer_types = OrderedJson::array();
  for (uint64_t i = 0; i < s.num_layers; ++i) {
    layer_types.push_back(layer_kind_name(ModelShape::layer_kind(i)));
  }
  OrderedJson quant = {{"group_size", kQuantGroupSize}, {"bits", kQuantBits}, {"mode", "affine"}};
  for (uint64_t i = 0; i < s.num_layers; ++i) {
    for (const char* module : {"mlp.gate", "mlp.shared_expert_gate"}) {
      quant[quant_override_key(i, module)] = {{"group_size", kQuantGroupSize},
                                              {"bits", kQuantBitsGates}};
    }
  }
  OrderedJson text = {
      {"model_type", "qwen3_5_moe_text"},
      {"hidden_size", s.hidden_size},
      {"num_hidden_layers", s.num_layers},
      {"layer_types", layer_types},
      {"full_attention_interval", 4},
      {"num_attention_heads", s.num_attention_heads},
      {"num_key_value_heads", s.num_key_value_heads},
      {"head_dim", s.head_dim},
      {"attn_output_gate", s.attn_output_gate},
      {"partial_rotary_factor", s.partial_rotary_factor},
      {"rope_parameters",
       {{"rope_type", "default"}, {"rope_theta", s.rope_theta},
        {"partial_rotary_factor", s.partial_rotary_factor}, {"mrope_interleaved", true},
        {"mrope_section", {11, 11, 10}}}},
      {"linear_num_key_heads", s.linear_num_key_heads},
      {"linear_num_value_heads", s.linear_num_value_heads},
      {"linear_key_head_dim", s.linear_key_head_dim},
      {"linear_value_head_dim", s.linear_value_head_dim},
      {"linear_conv_kernel_dim", s.linear_conv_kernel_dim},
      {"num_experts", s.num_experts},
      {"num_experts_per_tok", s.num_experts_per_tok},
      {"moe_intermediate_size", s.moe_intermediate_size},
      {"shared_expert_intermediate_size", s.shared_expert_intermediate_size},
      {"hidden_act", "silu"},
      {"rms_norm_eps", s.rms_norm_eps},
      {"vocab_size", s.vocab_size},
      {"max_position_embeddings", s.max_position_embeddings},
      {"tie_word_embeddings", s.tie_word_embeddings},
      {"attention_bias", false},
      {"mamba_ssm_dtype", "float32"},
      {"eos_token_id", endoftext_id},
      {"dtype", "bfloat16"},
  };
  OrderedJson config = {
      {"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
      {"model_type", "qwen3_5_moe"},
  };
  if (profile == Profile::tiny) config["lily_test_profile"] = "tiny";
  config["eos_token_id"] = {im_end_id, endoftext_id};
  config["tie_word_embeddings"] = false;
  config["quantization"] = quant;
  config["quantization_config"] = quant;
  config["text_config"] = text;
  return config.dump(4) + "\n";
}

MakeCheckpointResult make_checkpoint(const MakeCheckpointOptions& options) {
  const fs::path out(options.out_dir);
  if (options.out_dir.empty()) throw InputError("--out is empty; expected a directory path");
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec)) {
      throw InputError("--out " + options.out_dir + " exists and is not a directory");
    }
    if (!fs::is_empty(out, ec)) {
      throw InputError("--out " + options.out_dir +
                       " is not empty; refusing to overwrite (expected a new or empty directory)");
    }
  } else if (!fs::create_directories(out, ec)) {
    throw InputError("cannot create --out " + options.out_dir + ": " + ec.message());
  }

  const ModelShape shape =
      options.profile == Profile::tiny ? ModelShape::tiny() : ModelShape::production();
  const uint64_t bpe_tokens = shape.vocab_size == ModelShape::production().vocab_size
                                  ? 248044
                                  : shape.vocab_size - kQwen36AddedTokens.size();
  MakeCheckpointResult result;
  const SyntheticTokenizerFiles tokenizer = make_synthetic_tokenizer(bpe_tokens, options.seed);
  write_text(out / "config.json",
             synthetic_config_json(options.profile, tokenizer.endoftext_id, tokenizer.im_end_id));
  write_text(out / "tokenizer.json", tokenizer.tokenizer_json);
  write_text(out / "tokenizer_config.json", tokenizer.tokenizer_config_json);
  write_text(out / "generation_config.json",
             synthetic_generation_config_json(tokenizer.endoftext_id, tokenizer.im_end_id));
  result.files = 4;

  // Assign planned entries to shards in checkpoint order (a projection's triple stays
  // together), starting a new shard when the next entry would pass the cap.
  const uint64_t cap =
      options.profile == Profile::tiny ? kTinyShardBytes : kProductionShardBytes;
  std::vector<std::vector<TensorSource>> shards(1);
  uint64_t shard_bytes = 0;
  uint64_t total_bytes = 0;
  for (const PlannedTensor& planned : plan_tensors(shape)) {
    std::vector<TensorSource> sources = synthetic_tensors(planned, options.seed);
    uint64_t bytes = 0;
    for (const TensorSource& s : sources) bytes += s.nbytes();
    if (shard_bytes > 0 && shard_bytes + bytes > cap) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shard_bytes += bytes;
    total_bytes += bytes;
    for (TensorSource& s : sources) shards.back().push_back(std::move(s));
  }

  const std::map<std::string, std::string> metadata = {{"format", "mlx"}};
  std::map<std::string, std::string> weight_map;
  uint64_t written = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_name(i, shards.size());
    for (const TensorSource& s : shards[i]) {
      weight_map.emplace(s.name, name);
      written += s.nbytes();
    }
    result.stored_tensors += shards[i].size();
    write_safetensors((out / name).string(), std::move(shards[i]), metadata);
    result.files += 1;
    result.shards += 1;
    if (options.progress) options.progress(name, written, total_bytes);
  }
  const OrderedJson index = {{"metadata", {{"total_size", total_bytes}}},
                             {"weight_map", weight_map}};
  write_text(out / "model.safetensors.index.json", index.dump(4) + "\n");
  result.files += 1;
  result.bytes = total_bytes;
  return result;
}

}  // namespace lily

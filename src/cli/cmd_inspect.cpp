// `lily inspect --model DIR [--json]`: validate a checkpoint and print its summary.
#include <cstdio>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/strict_json.h"

namespace lily {

int cmd_inspect(const std::vector<std::string>& argv) {
  const std::vector<OptionSpec> spec = {
      {"model", true, "checkpoint directory (required)"},
      {"json", false, "print the summary as one JSON object"},
  };
  const Args args(argv, spec);
  const std::string dir = args.required("model");
  const std::unique_ptr<Checkpoint> checkpoint = open_checkpoint(dir);
  const ModelShape& s = checkpoint->config.shape;
  uint64_t full = 0;
  for (uint64_t i = 0; i < s.num_layers; ++i) {
    full += ModelShape::layer_kind(i) == LayerKind::full_attention ? 1u : 0u;
  }
  const WeightStats& st = checkpoint->stats;
  Json summary = {
      {"model", dir},
      {"profile", profile_name(checkpoint->config.profile)},
      {"layers", s.num_layers},
      {"linear_attention_layers", s.num_layers - full},
      {"full_attention_layers", full},
      {"hidden_size", s.hidden_size},
      {"vocab_size", s.vocab_size},
      {"experts", s.num_experts},
      {"experts_per_token", s.num_experts_per_tok},
      {"shards", checkpoint->store.shard_files().size()},
      {"file_bytes", checkpoint->store.file_bytes()},
      {"tensors", st.stored_tensors},
      {"skipped_vision_tensors", st.skipped_tensors},
      {"q4_projections", st.q4_projections},
      {"q8_projections", st.q8_projections},
      {"dense_tensors", st.dense_tensors},
      {"weight_bytes", st.weight_bytes},
      {"eos_token_ids", checkpoint->config.eos_token_ids},
  };
  if (args.has("json")) {
    std::cout << summary.dump() << "\n";
    return 0;
  }
  std::printf("checkpoint   %s\n", dir.c_str());
  std::printf("profile      %s (Qwen3.6-35B-A3B architecture, MLX affine 4-bit, group 64)\n",
              profile_name(checkpoint->config.profile));
  std::printf("layers       %llu: %llu Gated DeltaNet (linear_attention), %llu full attention "
              "(every i %% 4 == 3)\n",
              static_cast<unsigned long long>(s.num_layers),
              static_cast<unsigned long long>(s.num_layers - full),
              static_cast<unsigned long long>(full));
  std::printf("shape        hidden %llu, vocab %llu, %llu experts (top-%llu), head_dim %llu\n",
              static_cast<unsigned long long>(s.hidden_size),
              static_cast<unsigned long long>(s.vocab_size),
              static_cast<unsigned long long>(s.num_experts),
              static_cast<unsigned long long>(s.num_experts_per_tok),
              static_cast<unsigned long long>(s.head_dim));
  std::printf("tensors      %llu language-model tensors (%llu Q4 projections, %llu Q8 "
              "projections, %llu dense), %llu vision_tower tensors skipped\n",
              static_cast<unsigned long long>(st.stored_tensors),
              static_cast<unsigned long long>(st.q4_projections),
              static_cast<unsigned long long>(st.q8_projections),
              static_cast<unsigned long long>(st.dense_tensors),
              static_cast<unsigned long long>(st.skipped_tensors));
  std::printf("bytes        %.3f GB of weights in %zu shard(s), %.3f GB on disk\n",
              static_cast<double>(st.weight_bytes) / 1e9, checkpoint->store.shard_files().size(),
              static_cast<double>(checkpoint->store.file_bytes()) / 1e9);
  std::printf("status       ok\n");
  return 0;
}

}  // namespace lily

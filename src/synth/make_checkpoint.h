// `lily make-checkpoint`: writes a complete synthetic checkpoint in the MLX on-disk layout.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "checkpoint/model_config.h"

namespace lily {

struct MakeCheckpointOptions {
  Profile profile = Profile::tiny;
  uint64_t seed = 1;
  std::string out_dir;  // created if missing; must be empty if it exists
  // Called after each file is written: (file name, bytes written so far, total bytes).
  std::function<void(const std::string&, uint64_t, uint64_t)> progress;
};

struct MakeCheckpointResult {
  uint64_t files = 0;
  uint64_t shards = 0;
  uint64_t stored_tensors = 0;
  uint64_t bytes = 0;
};

// Shards hold at most 5 GB (production) or 4 MiB (tiny, so sharding is always exercised).
inline constexpr uint64_t kProductionShardBytes = 5'000'000'000ull;
inline constexpr uint64_t kTinyShardBytes = 4ull << 20;

// Writes config.json, tokenizer.json, tokenizer_config.json, generation_config.json (the
// family's recommended sampling, read by `lily serve --sampling-defaults checkpoint`),
// model-0000K-of-0000N.safetensors
// and model.safetensors.index.json. Byte-identical output for the same profile and seed.
// Throws InputError for a bad output directory, std::runtime_error on I/O failure.
MakeCheckpointResult make_checkpoint(const MakeCheckpointOptions& options);

// The config.json text the generator writes for a profile (exposed for tests that mutate it).
// generation_config.json as the Qwen3.6 family ships it, with the checkpoint's token ids.
std::string synthetic_generation_config_json(uint32_t endoftext_id, uint32_t im_end_id);

std::string synthetic_config_json(Profile profile, uint32_t endoftext_id, uint32_t im_end_id);

}  // namespace lily

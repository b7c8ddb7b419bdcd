// Opening a checkpoint directory: config, shards and weight inventory, all validated.
#pragma once

#include <memory>
#include <string>

#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"

namespace lily {

// A validated checkpoint. The weight views point into `store`'s mappings, so the object
// is pinned (held by unique_ptr, neither copied nor moved).
struct Checkpoint {
  std::string dir;
  ModelConfig config;
  TensorStore store;
  ModelWeights weights;
  WeightStats stats;

  Checkpoint() = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
};

// Validates config.json, every shard header, the index, and the full tensor inventory.
// Throws InputError with the first problem (file, tensor or field; expected; found).
std::unique_ptr<Checkpoint> open_checkpoint(const std::string& dir);

}  // namespace lily

// Test helper: tiny synthetic checkpoints written once per seed and opened for model tests.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "model/qwen36_model.h"
#include "synth/make_checkpoint.h"

namespace lily::testing {

// The tiny checkpoint for `seed`, generated on first use under the temp directory.
inline const Checkpoint& tiny_checkpoint(uint64_t seed) {
  // Removes the generated directories when the test process exits.
  struct Cache {
    std::map<uint64_t, std::unique_ptr<Checkpoint>> checkpoints;
    ~Cache() {
      for (const auto& [unused, checkpoint] : checkpoints) {
        std::filesystem::remove_all(checkpoint->dir);
      }
    }
  };
  static Cache cache_holder;
  auto& cache = cache_holder.checkpoints;
  auto it = cache.find(seed);
  if (it != cache.end()) return *it->second;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("lily_model_test_tiny_seed" + std::to_string(seed) + "_" +
                    std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  MakeCheckpointOptions options;
  options.profile = Profile::tiny;
  options.seed = seed;
  options.out_dir = dir.string();
  make_checkpoint(options);
  return *cache.emplace(seed, open_checkpoint(dir.string())).first->second;
}

// One CPU backend and model per test process over tiny_checkpoint(seed 5).
struct TinyModel {
  const Checkpoint& checkpoint = tiny_checkpoint(5);
  std::unique_ptr<Backend> backend = make_cpu_backend(0);
  Qwen36Model model{checkpoint, *backend};
};

inline TinyModel& tiny_model() {
  static TinyModel instance;
  return instance;
}

}  // namespace lily::testing

// Opening a checkpoint directory: config, shards and weight inventory, all validated.
#include "checkpoint/checkpoint.h"

#include <filesystem>

#include "core/error.h"

namespace lily {

std::unique_ptr<Checkpoint> open_checkpoint(const std::string& dir) {
  // The error_code overloads: a symlink loop or an over-long name is bad input, not a
  // filesystem_error escaping as an internal fault.
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InputError("model directory " + dir + " does not exist or is not a directory" +
                     (ec ? " (" + ec.message() + ")" : ""));
  }
  auto checkpoint = std::make_unique<Checkpoint>();
  checkpoint->dir = dir;
  checkpoint->config = load_model_config(dir);
  checkpoint->store = TensorStore::open(dir);
  checkpoint->weights = bind_weights(checkpoint->store, checkpoint->config.shape, &checkpoint->stats);
  return checkpoint;
}

}  // namespace lily

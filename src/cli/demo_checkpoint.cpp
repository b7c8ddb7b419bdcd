// The demo checkpoint (tiny profile, seed 1), generated once per user.
#include "cli/demo_checkpoint.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "synth/make_checkpoint.h"

namespace lily {

namespace fs = std::filesystem;

std::string lily_data_dir() {
  if (const char* dir = std::getenv("LILY_DATA_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg) return std::string(xdg) + "/lily";
  const char* home = std::getenv("HOME");
  if (!home || !*home) {
    throw InputError("cannot place the demo checkpoint: neither LILY_DATA_DIR, XDG_DATA_HOME nor "
                     "HOME is set (or pass --model DIR)");
  }
  return std::string(home) + "/.local/share/lily";
}

std::string ensure_demo_checkpoint() {
  const std::string root = lily_data_dir();
  const std::string dir = root + "/demo-tiny-seed1";
  if (fs::exists(dir + "/model.safetensors.index.json")) return dir;
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw InputError("cannot create the data directory " + root + ": " + ec.message());
  const std::string partial = dir + ".partial-" + std::to_string(::getpid());
  fs::remove_all(partial, ec);
  std::fprintf(stderr, "generating the demo checkpoint (tiny, seed 1) in %s\n", dir.c_str());
  MakeCheckpointOptions options;
  options.profile = Profile::tiny;
  options.seed = 1;
  options.out_dir = partial;
  make_checkpoint(options);
  fs::rename(partial, dir, ec);
  if (ec) {
    fs::remove_all(partial);  // another process finished first; use its copy
    if (!fs::exists(dir + "/model.safetensors.index.json")) {
      throw InputError("cannot move the demo checkpoint into " + dir + ": " + ec.message());
    }
  }
  return dir;
}

std::string demo_banner(const std::string& dir) {
  const std::string rule(72, '=');
  return rule + "\n" +
         "  DEMO MODE: no --model given. Serving a tiny SYNTHETIC checkpoint with random\n"
         "  weights from " + dir + "\n"
         "  ITS ANSWERS ARE NOISE. Pass --model DIR (or LILY_MODEL) to serve the real\n"
         "  Qwen3.6-35B-A3B MLX 4-bit checkpoint.\n" +
         rule + "\n";
}

}  // namespace lily

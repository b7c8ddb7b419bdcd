// `lily make-checkpoint --profile tiny|full --seed N --out DIR`: write a synthetic checkpoint.
#include <chrono>
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "synth/make_checkpoint.h"

namespace lily {

int cmd_make_checkpoint(const std::vector<std::string>& argv) {
  const std::vector<OptionSpec> spec = {
      {"profile", true, "tiny or full (required)"},
      {"seed", true, "PRNG seed, a non-negative integer (default 1)"},
      {"out", true, "output directory, new or empty (required)"},
  };
  const Args args(argv, spec);
  MakeCheckpointOptions options;
  const std::string profile = args.required("profile");
  if (profile == "tiny") {
    options.profile = Profile::tiny;
  } else if (profile == "full") {
    options.profile = Profile::production;
  } else {
    throw InputError("--profile is \"" + profile + "\", expected tiny or full");
  }
  options.seed = args.uint_or("seed", 1, 0, UINT64_MAX);
  options.out_dir = args.required("out");
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  options.progress = [&](const std::string& file, uint64_t done, uint64_t total) {
    std::fprintf(stderr, "wrote %s (%.2f / %.2f GB, %.1f s)\n", file.c_str(),
                 static_cast<double>(done) / 1e9, static_cast<double>(total) / 1e9, elapsed());
  };
  const MakeCheckpointResult result = make_checkpoint(options);
  std::printf("wrote %s: profile %s, seed %llu, %llu shards, %llu tensors, %.3f GB in %.1f s\n",
              options.out_dir.c_str(), profile.c_str(),
              static_cast<unsigned long long>(options.seed),
              static_cast<unsigned long long>(result.shards),
              static_cast<unsigned long long>(result.stored_tensors),
              static_cast<double>(result.bytes) / 1e9, elapsed());
  return 0;
}

}  // namespace lily

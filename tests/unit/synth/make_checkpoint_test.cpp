// Generator -> loader round trip and determinism for the tiny profile.
#include "synth/make_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/mlx_quant.h"
#include "checkpoint/tensor_plan.h"
#include "core/bf16.h"
#include "core/error.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

// Every directory a test made, removed when the test process exits.
struct MadeDirs {
  std::vector<fs::path> dirs;
  ~MadeDirs() {
    for (const fs::path& dir : dirs) {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  }
};

fs::path fresh_dir(const std::string& name) {
  static MadeDirs made;
  const fs::path dir = fs::temp_directory_path() /
                       ("lily_synth_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  made.dirs.push_back(dir);
  return dir;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

fs::path make(const std::string& name, Profile profile, uint64_t seed) {
  const fs::path dir = fresh_dir(name);
  MakeCheckpointOptions options;
  options.profile = profile;
  options.seed = seed;
  options.out_dir = dir.string();
  make_checkpoint(options);
  return dir;
}

TEST(MakeCheckpoint, TinyRoundTripsThroughTheLoader) {
  const fs::path dir = make("roundtrip", Profile::tiny, 1);
  const auto checkpoint = open_checkpoint(dir.string());
  EXPECT_EQ(checkpoint->config.profile, Profile::tiny);
  const ModelShape& s = checkpoint->config.shape;
  EXPECT_EQ(checkpoint->stats.stored_tensors, stored_tensor_count(plan_tensors(s)));
  EXPECT_EQ(checkpoint->stats.stored_tensors, 6u * 45u + 2u * 40u + 7u);
  EXPECT_GE(checkpoint->store.shard_files().size(), 2u);
  EXPECT_EQ(checkpoint->stats.q8_projections, 2 * s.num_layers);
  ASSERT_EQ(checkpoint->weights.layers.size(), 8u);
  EXPECT_EQ(checkpoint->weights.layers[3].kind, LayerKind::full_attention);
  EXPECT_EQ(checkpoint->weights.layers[3].attn.q_proj.out, 8u * 256u * 2u);
  EXPECT_EQ(checkpoint->weights.layers[0].moe.experts_down.rows(), 32u * 256u);
  EXPECT_EQ(checkpoint->weights.layers[0].moe.router.bits, 8);
  // eos: <|im_end|> then <|endoftext|>, the two ids right after the BPE ids.
  EXPECT_EQ(checkpoint->config.eos_token_ids, (std::vector<uint32_t>{4065, 4063}));
}

TEST(MakeCheckpoint, SameSeedGivesByteIdenticalFiles) {
  const fs::path a = make("same_a", Profile::tiny, 7);
  const fs::path b = make("same_b", Profile::tiny, 7);
  const fs::path c = make("same_c", Profile::tiny, 8);
  size_t files = 0;
  bool any_difference_with_other_seed = false;
  for (const auto& entry : fs::directory_iterator(a)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(read_file(a / name), read_file(b / name)) << name;
    if (read_file(a / name) != read_file(c / name)) any_difference_with_other_seed = true;
    ++files;
  }
  EXPECT_GE(files, 6u);
  EXPECT_TRUE(any_difference_with_other_seed);
}

TEST(MakeCheckpoint, WeightsAreFiniteZeroMeanWithExpectedSpread) {
  const fs::path dir = make("values", Profile::tiny, 3);
  const auto checkpoint = open_checkpoint(dir.string());
  const QuantView& w = checkpoint->weights.layers[0].gdn.in_proj_qkv;
  std::vector<float> row(w.in);
  double sum = 0, sum_sq = 0;
  for (uint64_t r = 0; r < w.rows(); ++r) {
    dequantize_row(w, r, row);
    for (float v : row) {
      ASSERT_TRUE(std::isfinite(v));
      sum += static_cast<double>(v);
      sum_sq += static_cast<double>(v) * static_cast<double>(v);
    }
  }
  const double n = static_cast<double>(w.rows() * w.in);
  const double mean = sum / n;
  const double std = std::sqrt(sum_sq / n - mean * mean);
  const double target = 1.0 / std::sqrt(static_cast<double>(w.in));
  EXPECT_LT(std::abs(mean), 0.1 * target);
  EXPECT_GT(std, 0.7 * target);
  EXPECT_LT(std, 1.3 * target);
  // Norm gains are stored with +1 baked in: close to 1.
  const DenseView& norm = checkpoint->weights.layers[0].input_norm;
  for (uint64_t i = 0; i < norm.shape[0]; ++i) {
    uint16_t bits;
    std::memcpy(&bits, norm.data + 2 * i, 2);
    EXPECT_NEAR(bf16_to_f32(bits), 1.0f, 0.5f);
  }
}

TEST(MakeCheckpoint, RefusesANonEmptyOutputDirectory) {
  const fs::path dir = make("nonempty", Profile::tiny, 1);
  MakeCheckpointOptions options;
  options.out_dir = dir.string();
  EXPECT_THROW(make_checkpoint(options), InputError);
}

}  // namespace
}  // namespace lily

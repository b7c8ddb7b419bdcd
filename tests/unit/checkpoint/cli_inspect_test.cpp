// `lily inspect --model DIR` as a process: exit 0 when valid, 2 and "error: ..." when not.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "checkpoint_fixtures.h"

namespace lily {
namespace {

using test::Contains;
using test::OrderedJson;
using test::run_lily;
using test::RunResult;
using test::TinyCheckpoint;
namespace fs = std::filesystem;

std::string quoted(const fs::path& path) {
  // Built by appending: GCC 12 -O3 raises a false -Wrestrict on `"'" + std::string&&`.
  std::string out = "'";
  out += path.string();
  out += '\'';
  return out;
}

TEST(CliInspect, ValidCheckpointExitsZero) {
  TinyCheckpoint ckpt;
  const RunResult r = run_lily("inspect --model " + quoted(ckpt.dir()));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(
      Contains(r.out, {"profile      tiny", "357 language-model tensors", "status       ok"}));
  EXPECT_EQ(r.err, "");
}

TEST(CliInspect, JsonSummary) {
  TinyCheckpoint ckpt;
  const RunResult r = run_lily("inspect --json --model " + quoted(ckpt.dir()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const OrderedJson summary = OrderedJson::parse(r.out);
  EXPECT_EQ(summary.at("profile"), "tiny");
  EXPECT_EQ(summary.at("tensors"), 357);
  EXPECT_EQ(summary.at("q8_projections"), 16);
}

TEST(CliInspect, MissingTensorExitsTwo) {
  TinyCheckpoint ckpt;
  const std::string tensor = std::string(test::kP) + "layers.3.self_attn.q_norm.weight";
  ckpt.edit_shard_of(tensor, [&](test::ShardFile& shard) { shard.remove_tensor(tensor); });
  OrderedJson index = ckpt.index();
  index["weight_map"].erase(tensor);
  ckpt.set_index(index);
  const RunResult r = run_lily("inspect --model " + quoted(ckpt.dir()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_TRUE(Contains(r.err, {"tensor " + tensor + " is missing from the checkpoint"}));
  EXPECT_EQ(r.out, "");
}

TEST(CliInspect, TruncatedShardExitsTwo) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files().front();
  const std::string bytes = test::read_file(ckpt.path(file));
  test::write_file(ckpt.path(file), std::string_view(bytes).substr(0, bytes.size() / 2));
  const RunResult r = run_lily("inspect --model " + quoted(ckpt.dir()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("error: " + file + ": tensor ", 0), 0u) << r.err;
  EXPECT_TRUE(Contains(r.err, {"run past the data section"}));
}

TEST(CliInspect, BadConfigExitsTwo) {
  TinyCheckpoint ckpt;
  OrderedJson config = ckpt.config();
  config["text_config"]["num_experts"] = 64;
  ckpt.set_config(config);
  const RunResult r = run_lily("inspect --model " + quoted(ckpt.dir()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("error: config.json: text_config.num_experts is 64, expected 32", 0), 0u)
      << r.err;
}

TEST(CliInspect, MissingDirectoryExitsTwo) {
  test::TempDir dir;
  const RunResult r = run_lily("inspect --model " + quoted(dir.path() / "absent"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("error: model directory ", 0), 0u) << r.err;
}

TEST(CliInspect, SymlinkLoopExitsTwo) {
  test::TempDir dir;
  fs::create_symlink("loop", dir.path() / "loop");
  const RunResult r = run_lily("inspect --model " + quoted(dir.path() / "loop"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("error: model directory ", 0), 0u) << r.err;
}

TEST(CliInspect, MissingModelOptionExitsTwo) {
  const RunResult r = run_lily("inspect");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_TRUE(Contains(r.err, {"model"}));
}

}  // namespace
}  // namespace lily

// open_checkpoint on a tiny checkpoint with one file-level defect: the exact InputError.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint_fixtures.h"
#include "core/error.h"

namespace lily {
namespace {

using test::Contains;
using test::kP;
using test::OrderedJson;
using test::ShardFile;
using test::TinyCheckpoint;
namespace fs = std::filesystem;

const std::string kNorm = std::string(kP) + "layers.1.input_layernorm.weight";
const std::string kRouter = std::string(kP) + "layers.0.mlp.gate";
const std::string kExpertsUp = std::string(kP) + "layers.2.mlp.switch_mlp.up_proj";
const std::string kInProjA = std::string(kP) + "layers.0.linear_attn.in_proj_a";
const std::string kALog = std::string(kP) + "layers.4.linear_attn.A_log";
const std::string kConv = std::string(kP) + "layers.5.linear_attn.conv1d.weight";

// The tensor whose data ends last in `shard` (the first casualty of a truncation).
std::string last_tensor(const ShardFile& shard) {
  std::string best;
  uint64_t best_end = 0;
  for (const std::string& name : shard.tensor_names()) {
    const auto end = shard.header.at(name).at("data_offsets")[1].get<uint64_t>();
    if (end >= best_end) {
      best_end = end;
      best = name;
    }
  }
  return best;
}

TEST(MalformedCheckpoint, TemplateIsValid) {
  TinyCheckpoint ckpt;
  const auto checkpoint = open_checkpoint(ckpt.dir().string());
  EXPECT_EQ(checkpoint->config.profile, Profile::tiny);
  EXPECT_GE(ckpt.shard_files().size(), 2u);
}

TEST(MalformedCheckpoint, EditsNeverReachTheSharedTemplate) {
  TinyCheckpoint edited;
  const std::string file = edited.shard_of(kNorm);
  const uint64_t size = fs::file_size(edited.path(file));
  edited.edit_shard_of(kNorm, [&](ShardFile& shard) { shard.remove_tensor(kNorm); });
  EXPECT_LT(fs::file_size(edited.path(file)), size);
  TinyCheckpoint fresh;  // would throw if the template had changed
  EXPECT_EQ(fs::file_size(fresh.path(file)), size);
  EXPECT_EQ(fs::file_size(test::template_checkpoint() / file), size);
  EXPECT_NO_THROW(open_checkpoint(fresh.dir().string()));
}

// ---- shard bytes ----

TEST(MalformedCheckpoint, TruncatedShardFile) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files().front();
  const std::string bytes = test::read_file(ckpt.path(file));
  const std::string victim = last_tensor(ShardFile::parse(bytes));
  test::write_file(ckpt.path(file), std::string_view(bytes).substr(0, bytes.size() - 100));
  EXPECT_TRUE(Contains(ckpt.open_error(), {file + ": tensor " + victim + ".data_offsets [",
                                           "] run past the data "
                                           "section ("}));
}

TEST(MalformedCheckpoint, ShardTruncatedInsideTheHeader) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files().back();
  const std::string bytes = test::read_file(ckpt.path(file));
  test::write_file(ckpt.path(file), std::string_view(bytes).substr(0, 20));
  EXPECT_TRUE(Contains(ckpt.open_error(), {file + ": header length ",
                                           " runs past the end of the file (12 bytes "
                                           "follow the length prefix)"}));
}

TEST(MalformedCheckpoint, ShardTruncatedInsideTheLengthPrefix) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files()[1];
  test::write_file(ckpt.path(file), test::read_file(ckpt.path(file)).substr(0, 5));
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {file + ": file is 5 bytes, too short for the 8-byte header length"}));
}

TEST(MalformedCheckpoint, EmptyShardFile) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files()[2];
  test::write_file(ckpt.path(file), "");
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {file + ": file is 0 bytes, too short for the 8-byte header length"}));
}

TEST(MalformedCheckpoint, HeaderLengthPastTheEnd) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files()[1];
  std::string bytes = test::read_file(ckpt.path(file));
  const uint64_t size = bytes.size();
  uint64_t length = size - 7;  // one byte more than follows the prefix
  for (size_t i = 0; i < 8; ++i, length >>= 8) bytes[i] = static_cast<char>(length & 0xffu);
  test::write_file(ckpt.path(file), bytes);
  EXPECT_TRUE(Contains(
      ckpt.open_error(),
      {file + ": header length " + std::to_string(size - 7) + " runs past the end of the file (" +
       std::to_string(size - 8) + " bytes follow the length prefix)"}));
}

TEST(MalformedCheckpoint, HeaderNotJson) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files()[1];
  const ShardFile shard = ckpt.shard(file);
  test::write_file(ckpt.path(file), test::safetensors_bytes("{\"a\": nope}     ", shard.data));
  EXPECT_TRUE(Contains(ckpt.open_error(), {file + " header: not valid JSON"}));
}

TEST(MalformedCheckpoint, HeaderWithTrailingGarbage) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files()[0];
  const ShardFile shard = ckpt.shard(file);
  test::write_file(ckpt.path(file), test::safetensors_bytes(shard.header.dump() + "}", shard.data));
  EXPECT_TRUE(Contains(ckpt.open_error(), {file + " header: not valid JSON"}));
}

TEST(MalformedCheckpoint, DeeplyNestedHeader) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files()[0];
  const size_t depth = 100000;
  std::string header = "{\"x\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
  test::write_file(ckpt.path(file), test::safetensors_bytes(header, ""));
  EXPECT_TRUE(Contains(ckpt.open_error(), {file + " header: JSON nesting deeper than 3 levels"}));
}

TEST(MalformedCheckpoint, HeaderIsNotAnObject) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_files()[0];
  test::write_file(ckpt.path(file), test::safetensors_bytes("[1, 2, 3]", ""));
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {file + ": header is array [1,2,3], expected an object"}));
}

TEST(MalformedCheckpoint, OffsetsOutOfRange) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_of(kNorm);
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) {
    const uint64_t end = shard.data.size() + 2;
    shard.entry(kNorm)["data_offsets"] = {end - 512, end};
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {file + ": tensor " + kNorm + ".data_offsets [",
                                           "] run past the data section"}));
}

TEST(MalformedCheckpoint, OffsetsBeyondSixtyFourBits) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) {
    shard.entry(kNorm)["data_offsets"] = OrderedJson::parse("[0, 18446744073709551616]");
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + kNorm + ".data_offsets[1] is number",
                                           "expected a non-negative integer"}));
}

TEST(MalformedCheckpoint, ReversedOffsets) {
  TinyCheckpoint ckpt;
  uint64_t begin = 0;
  uint64_t end = 0;
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) {
    OrderedJson& offsets = shard.entry(kNorm)["data_offsets"];
    begin = offsets[0].get<uint64_t>();
    end = offsets[1].get<uint64_t>();
    offsets = {end, begin};
  });
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"tensor " + kNorm + ".data_offsets [" + std::to_string(end) +
                                   ", " + std::to_string(begin) + "] are reversed"}));
}

TEST(MalformedCheckpoint, OverlappingTensors) {
  TinyCheckpoint ckpt;
  const std::string scales = kRouter + ".scales";
  const std::string biases = kRouter + ".biases";
  ckpt.edit_shard_of(scales, [&](ShardFile& shard) {
    shard.entry(biases)["data_offsets"] = shard.entry(scales)["data_offsets"];
  });
  const std::string message = ckpt.open_error();
  EXPECT_TRUE(Contains(message, {"overlap in the data section", scales, biases}));
}

TEST(MalformedCheckpoint, PartiallyOverlappingTensors) {
  TinyCheckpoint ckpt;
  const std::string a = kInProjA + ".scales";
  const std::string b = kInProjA + ".weight";
  ckpt.edit_shard_of(a, [&](ShardFile& shard) {
    const uint64_t a_begin = shard.entry(a)["data_offsets"][0].get<uint64_t>();
    const uint64_t b_size = shard.tensor_bytes(b).size();
    shard.entry(b)["data_offsets"] = {a_begin + 2, a_begin + 2 + b_size};
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"overlap in the data section", a, b}));
}

TEST(MalformedCheckpoint, UnknownDtype) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) { shard.entry(kNorm)["dtype"] = "F4"; });
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {": tensor " + kNorm + ".dtype \"F4\" is not a safetensors dtype"}));
}

TEST(MalformedCheckpoint, UnexpectedFieldInTensorEntry) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) { shard.entry(kNorm)["offset"] = 0; });
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {": tensor " + kNorm + " has unexpected field \"offset\""}));
}

TEST(MalformedCheckpoint, SizeDoesNotMatchShapeAndDtype) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) { shard.entry(kNorm)["dtype"] = "F32"; });
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {": tensor " + kNorm + " spans 512 bytes, expected 1024 for F32 [256]"}));
}

TEST(MalformedCheckpoint, NormStoredAsF32) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) {
    shard.set_tensor(kNorm, "F32", {256}, test::zero_bytes(1024));
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + kNorm + " is F32, expected BF16"}));
}

TEST(MalformedCheckpoint, CodesNotU32) {
  TinyCheckpoint ckpt;
  const std::string codes = kRouter + ".weight";
  ckpt.edit_shard_of(codes, [&](ShardFile& shard) { shard.entry(codes)["dtype"] = "I32"; });
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"tensor " + codes + " is I32, expected U32 packed codes"}));
}

TEST(MalformedCheckpoint, ScalesNotBf16) {
  TinyCheckpoint ckpt;
  const std::string scales = kExpertsUp + ".scales";
  ckpt.edit_shard_of(scales, [&](ShardFile& shard) { shard.entry(scales)["dtype"] = "F16"; });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + scales + " is F16, expected BF16"}));
}

TEST(MalformedCheckpoint, BiasesNotBf16) {
  TinyCheckpoint ckpt;
  const std::string biases = kInProjA + ".biases";
  ckpt.edit_shard_of(biases, [&](ShardFile& shard) {
    shard.set_tensor(biases, "F32", {4, 4}, test::zero_bytes(64));
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + biases + " is F32, expected BF16"}));
}

TEST(MalformedCheckpoint, ALogStoredAsF16) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(
      kALog, [&](ShardFile& shard) { shard.set_tensor(kALog, "F16", {4}, test::zero_bytes(8)); });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + kALog + " is F16, expected F32 or BF16"}));
}

TEST(MalformedCheckpoint, ALogAsBf16AndHfConvLayoutAreAccepted) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(
      kALog, [&](ShardFile& shard) { shard.set_tensor(kALog, "BF16", {4}, test::zero_bytes(8)); });
  ckpt.edit_shard_of(kConv, [&](ShardFile& shard) { shard.entry(kConv)["shape"] = {1024, 1, 4}; });
  const auto checkpoint = open_checkpoint(ckpt.dir().string());
  EXPECT_EQ(checkpoint->weights.layers[4].gdn.a_log.dtype, DType::BF16);
  EXPECT_EQ(checkpoint->weights.layers[5].gdn.conv1d.shape, (std::vector<uint64_t>{1024, 1, 4}));
}

TEST(MalformedCheckpoint, WrongShape) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) {
    shard.set_tensor(kNorm, "BF16", {255}, test::zero_bytes(510));
  });
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"tensor " + kNorm + " has shape [255], expected [256]"}));
}

TEST(MalformedCheckpoint, ConvWithNeitherLayout) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(kConv, [&](ShardFile& shard) { shard.entry(kConv)["shape"] = {1024, 2, 2}; });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + kConv +
                                           " has shape [1024, 2, 2], expected "
                                           "[1024, 4, 1] or [1024, 1, 4]"}));
}

TEST(MalformedCheckpoint, ShapeProductOverflow) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) {
    shard.entry(kNorm)["shape"] = {uint64_t{1} << 40, uint64_t{1} << 40};
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + kNorm +
                                           ".shape array [1099511627776,1099511627776] "
                                           "overflows 64 bits"}));
}

TEST(MalformedCheckpoint, ShapeByteSizeOverflow) {
  TinyCheckpoint ckpt;
  const std::string codes = kRouter + ".weight";
  ckpt.edit_shard_of(codes, [&](ShardFile& shard) {
    shard.entry(codes)["shape"] = {uint64_t{1} << 31, uint64_t{1} << 31};  // x4 bytes > 2^64
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + codes +
                                           ".shape array [2147483648,2147483648] "
                                           "overflows 64 bits in bytes"}));
}

TEST(MalformedCheckpoint, RankAboveEight) {
  TinyCheckpoint ckpt;
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) {
    shard.entry(kNorm)["shape"] = {256, 1, 1, 1, 1, 1, 1, 1, 1};
  });
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"tensor " + kNorm + ".shape has rank 9, expected at most 8"}));
}

// ---- inventory ----

TEST(MalformedCheckpoint, MissingTensor) {
  TinyCheckpoint ckpt;
  const std::string biases = kExpertsUp + ".biases";
  ckpt.edit_shard_of(biases, [&](ShardFile& shard) { shard.remove_tensor(biases); });
  OrderedJson index = ckpt.index();
  index["weight_map"].erase(biases);
  ckpt.set_index(index);
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"tensor " + biases + " is missing from the checkpoint"}));
}

TEST(MalformedCheckpoint, TensorListedInTheIndexButAbsentFromItsShard) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_of(kALog);
  ckpt.edit_shard_of(kALog, [&](ShardFile& shard) { shard.remove_tensor(kALog); });
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"model.safetensors.index.json puts tensor " + kALog + " in " +
                                   file + ", but that shard does not contain it"}));
}

TEST(MalformedCheckpoint, ExtraUnconsumedTensor) {
  TinyCheckpoint ckpt;
  const std::string extra = std::string(kP) + "layers.0.mlp.experts.0.up_proj.weight";
  const std::string file = ckpt.shard_of(kNorm);
  ckpt.edit_shard_of(
      kNorm, [&](ShardFile& shard) { shard.set_tensor(extra, "BF16", {2}, test::zero_bytes(4)); });
  OrderedJson index = ckpt.index();
  index["weight_map"][extra] = file;
  ckpt.set_index(index);
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {"1 checkpoint tensor(s) are not part of Qwen3.6-35B-A3B's language model "
                        "(only vision_tower.* may be skipped): " +
                        extra}));
}

TEST(MalformedCheckpoint, ManyExtraTensorsAreListedWithACount) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_of(kNorm);
  OrderedJson index = ckpt.index();
  ckpt.edit_shard_of(kNorm, [&](ShardFile& shard) {
    for (int i = 0; i < 20; ++i) {
      const std::string name = "mtp.layers." + std::to_string(10 + i) + ".weight";
      shard.set_tensor(name, "BF16", {1}, test::zero_bytes(2));
      index["weight_map"][name] = file;
    }
  });
  ckpt.set_index(index);
  EXPECT_TRUE(Contains(ckpt.open_error(), {"20 checkpoint tensor(s) are not part",
                                           "mtp.layers.10.weight", ", ... and 4 more"}));
}

TEST(MalformedCheckpoint, TensorInAShardButNotInTheIndex) {
  TinyCheckpoint ckpt;
  const std::string extra = "vision_tower.blocks.0.norm.weight";
  const std::string file = ckpt.shard_of(kNorm);
  ckpt.edit_shard_of(
      kNorm, [&](ShardFile& shard) { shard.set_tensor(extra, "BF16", {2}, test::zero_bytes(4)); });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"shard " + file + " holds tensor " + extra +
                                           ", which model.safetensors.index.json does not list"}));
}

TEST(MalformedCheckpoint, VisionTowerTensorsAreSkipped) {
  TinyCheckpoint ckpt;
  const std::string extra = "vision_tower.blocks.0.norm.weight";
  const std::string file = ckpt.shard_of(kNorm);
  ckpt.edit_shard_of(
      kNorm, [&](ShardFile& shard) { shard.set_tensor(extra, "F32", {3}, test::zero_bytes(12)); });
  OrderedJson index = ckpt.index();
  index["weight_map"][extra] = file;
  ckpt.set_index(index);
  const auto checkpoint = open_checkpoint(ckpt.dir().string());
  EXPECT_EQ(checkpoint->stats.skipped_tensors, 1u);
}

TEST(MalformedCheckpoint, SameTensorInTwoShards) {
  TinyCheckpoint ckpt;
  // The copy goes into a shard read after the tensor's own, so the duplicate is seen
  // before the index disagreement.
  const std::vector<std::string> files = ckpt.shard_files();
  const std::string home = ckpt.shard_of(kNorm);
  ASSERT_NE(home, files.back());
  const std::string other = files.back();
  const std::string bytes = ckpt.shard(home).tensor_bytes(kNorm);
  ShardFile shard = ckpt.shard(other);
  shard.set_tensor(kNorm, "BF16", {256}, bytes);
  ckpt.put_shard(other, shard);
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + kNorm + " appears in two shards: "}));
  EXPECT_TRUE(Contains(ckpt.open_error(), {home, other}));
}

TEST(MalformedCheckpoint, IndexPutsATensorInTheWrongShard) {
  TinyCheckpoint ckpt;
  const std::vector<std::string> files = ckpt.shard_files();
  const std::string home = ckpt.shard_of(kNorm);
  const std::string other = home == files.back() ? files.front() : files.back();
  OrderedJson index = ckpt.index();
  index["weight_map"][kNorm] = other;
  ckpt.set_index(index);
  EXPECT_TRUE(Contains(ckpt.open_error(), {"model.safetensors.index.json puts tensor " + kNorm +
                                           " in " + other + ", but it is in " + home}));
}

TEST(MalformedCheckpoint, IndexNamesAMissingShard) {
  TinyCheckpoint ckpt;
  OrderedJson index = ckpt.index();
  index["weight_map"][kNorm] = "model-00009-of-00009.safetensors";
  ckpt.set_index(index);
  EXPECT_TRUE(
      Contains(ckpt.open_error(),
               {"model.safetensors.index.json names shard model-00009-of-00009.safetensors, "
                "which does not exist in " +
                ckpt.dir().string()}));
}

TEST(MalformedCheckpoint, IndexNamesADirectoryAsShard) {
  TinyCheckpoint ckpt;
  fs::create_directory(ckpt.path("subdir.safetensors"));
  OrderedJson index = ckpt.index();
  index["weight_map"][kNorm] = "subdir.safetensors";
  ckpt.set_index(index);
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"names shard subdir.safetensors, which does not exist in "}));
}

TEST(MalformedCheckpoint, IndexShardNameEscapesTheDirectory) {
  TinyCheckpoint ckpt;
  OrderedJson index = ckpt.index();
  index["weight_map"][kNorm] = "../x";
  ckpt.set_index(index);
  EXPECT_TRUE(
      Contains(ckpt.open_error(),
               {"model.safetensors.index.json.weight_map[\"" + kNorm +
                "\"] is string \"../x\", expected a plain file name inside the model directory"}));
}

TEST(MalformedCheckpoint, IndexShardPathThroughTheParentIsRefusedEvenIfItExists) {
  TinyCheckpoint ckpt;
  const std::string home = ckpt.shard_of(kNorm);
  const std::string sneaky = "../" + ckpt.dir().filename().string() + "/" + home;
  ASSERT_TRUE(fs::is_regular_file(ckpt.dir() / sneaky));
  OrderedJson index = ckpt.index();
  for (auto& [tensor, file] : index["weight_map"].items()) {
    if (file == home) file = sneaky;
  }
  ckpt.set_index(index);
  EXPECT_TRUE(Contains(ckpt.open_error(), {"is string \"../" + ckpt.dir().filename().string(),
                                           ", expected a plain file name"}));
}

TEST(MalformedCheckpoint, IndexAbsolutePath) {
  TinyCheckpoint ckpt;
  OrderedJson index = ckpt.index();
  index["weight_map"][kNorm] = ckpt.path(ckpt.shard_of(kNorm)).string();
  ckpt.set_index(index);
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"expected a plain file name inside the model directory"}));
}

TEST(MalformedCheckpoint, IndexNotJson) {
  TinyCheckpoint ckpt;
  const std::string text = test::read_file(ckpt.path("model.safetensors.index.json"));
  test::write_file(ckpt.path("model.safetensors.index.json"), text.substr(0, text.size() / 2));
  EXPECT_TRUE(Contains(ckpt.open_error(), {"model.safetensors.index.json: not valid JSON"}));
}

TEST(MalformedCheckpoint, IndexWithoutWeightMap) {
  TinyCheckpoint ckpt;
  ckpt.set_index(OrderedJson{{"metadata", {{"total_size", 1}}}});
  EXPECT_TRUE(Contains(ckpt.open_error(), {"model.safetensors.index.json.weight_map is missing"}));
}

TEST(MalformedCheckpoint, IndexLargerThanTheCap) {
  TinyCheckpoint ckpt;
  const fs::path index = ckpt.path("model.safetensors.index.json");
  test::write_file(index, "{}");
  fs::resize_file(index, kMaxIndexBytes + 1);  // sparse: costs no disk
  EXPECT_TRUE(Contains(ckpt.open_error(), {"model.safetensors.index.json: file is 67108865 bytes, "
                                           "expected at most 67108864"}));
}

TEST(MalformedCheckpoint, IndexIsAFifo) {
  TinyCheckpoint ckpt;
  const fs::path index = ckpt.path("model.safetensors.index.json");
  fs::remove(index);
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"cannot map " + index.string() + ": not a regular file"}));
}

TEST(MalformedCheckpoint, RouterStoredAsFourBit) {
  TinyCheckpoint ckpt;
  const std::string codes = kRouter + ".weight";
  ckpt.edit_shard_of(codes, [&](ShardFile& shard) {
    shard.set_tensor(codes, "U32", {32, 32}, test::zero_bytes(32 * 32 * 4));
  });
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {"tensor " + codes + " ", "4-bit storage; expected 8-bit", "[32, 64]"}));
}

TEST(MalformedCheckpoint, ExpertsStoredAsEightBit) {
  TinyCheckpoint ckpt;
  const std::string codes = kExpertsUp + ".weight";
  ckpt.edit_shard_of(codes, [&](ShardFile& shard) {
    shard.set_tensor(codes, "U32", {32, 128, 64}, test::zero_bytes(32 * 128 * 64 * 4));
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + codes + " ", "8-bit storage; expected 4-bit",
                                           "[32, 128, 32]"}));
}

TEST(MalformedCheckpoint, CodesWidthOfNeitherFourNorEightBits) {
  TinyCheckpoint ckpt;
  const std::string codes = kInProjA + ".weight";
  ckpt.edit_shard_of(codes, [&](ShardFile& shard) {
    shard.set_tensor(codes, "U32", {4, 48}, test::zero_bytes(4 * 48 * 4));
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor " + codes +
                                           " has shape [4, 48]: cannot infer a 4- or 8-bit width "
                                           "for 256 input features (expected [4, 32])"}));
}

TEST(MalformedCheckpoint, CodesWithZeroWidth) {
  TinyCheckpoint ckpt;
  const std::string codes = kInProjA + ".weight";
  ckpt.edit_shard_of(codes, [&](ShardFile& shard) { shard.set_tensor(codes, "U32", {4, 0}, ""); });
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"tensor " + codes + " has shape [4, 0], expected [4, 32]"}));
}

TEST(MalformedCheckpoint, CodesMissingTheExpertDimension) {
  TinyCheckpoint ckpt;
  const std::string codes = kExpertsUp + ".weight";
  ckpt.edit_shard_of(codes, [&](ShardFile& shard) {
    shard.entry(codes)["shape"] = {32 * 128, 32};
  });
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {"tensor " + codes + " has shape [4096, 32], expected [32, 128, 32]"}));
}

// ---- directory layout ----

TEST(MalformedCheckpoint, DirectoryWithoutAnySafetensors) {
  TinyCheckpoint ckpt;
  for (const std::string& file : ckpt.shard_files()) fs::remove(ckpt.path(file));
  fs::remove(ckpt.path("model.safetensors.index.json"));
  EXPECT_TRUE(Contains(ckpt.open_error(), {"no model.safetensors.index.json or model.safetensors "
                                           "in " +
                                           ckpt.dir().string()}));
}

TEST(MalformedCheckpoint, ShardsWithoutTheIndexAreNotGuessed) {
  TinyCheckpoint ckpt;
  fs::remove(ckpt.path("model.safetensors.index.json"));
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"no model.safetensors.index.json or model.safetensors"}));
}

TEST(MalformedCheckpoint, EmptyDirectory) {
  test::TempDir dir;
  EXPECT_TRUE(Contains(test::open_error(dir.path()),
                       {"cannot open " + (dir.path() / "config.json").string()}));
}

TEST(MalformedCheckpoint, MissingDirectory) {
  test::TempDir dir;
  const fs::path missing = dir.path() / "nope";
  EXPECT_TRUE(Contains(test::open_error(missing), {"model directory " + missing.string() +
                                                   " does not exist or is not a directory"}));
}

TEST(MalformedCheckpoint, DirectoryIsASymlinkLoop) {
  test::TempDir dir;
  const fs::path loop = dir.path() / "loop";
  fs::create_symlink("loop", loop);
  EXPECT_TRUE(Contains(test::open_error(loop),
                       {"model directory " + loop.string() +
                        " does not exist or is not a directory (Too many levels of symbolic "
                        "links)"}));
}

TEST(MalformedCheckpoint, DirectoryNameTooLong) {
  const std::string name = "/tmp/" + std::string(5000, 'a');
  EXPECT_TRUE(Contains(test::open_error(name),
                       {" does not exist or is not a directory (File name too long)"}));
}

TEST(MalformedCheckpoint, IndexIsASymlinkLoop) {
  TinyCheckpoint ckpt;
  const fs::path index = ckpt.path("model.safetensors.index.json");
  fs::remove(index);
  fs::create_symlink("model.safetensors.index.json", index);
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {"cannot open " + index.string() + ": Too many levels of symbolic links"}));
}

TEST(MalformedCheckpoint, IndexIsADanglingSymlink) {
  TinyCheckpoint ckpt;
  const fs::path index = ckpt.path("model.safetensors.index.json");
  fs::remove(index);
  fs::create_symlink("nowhere.json", index);
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {"cannot open " + index.string() + ": No such file or directory"}));
}

TEST(MalformedCheckpoint, ShardIsASymlinkLoop) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_of(kNorm);
  fs::remove(ckpt.path(file));
  fs::create_symlink(file, ckpt.path(file));
  EXPECT_TRUE(Contains(ckpt.open_error(), {"names shard " + file + ", which does not exist in "}));
}

TEST(MalformedCheckpoint, DirectoryIsAFile) {
  TinyCheckpoint ckpt;
  EXPECT_TRUE(Contains(test::open_error(ckpt.path("config.json")),
                       {"does not exist or is not a directory"}));
}

// One model.safetensors holding every tensor: valid without an index; then a defect in it.
void merge_into_single_file(const TinyCheckpoint& ckpt) {
  ShardFile merged;
  merged.header = OrderedJson::object();
  merged.header["__metadata__"] = {{"format", "mlx"}};
  for (const std::string& file : ckpt.shard_files()) {
    const ShardFile shard = ckpt.shard(file);
    for (const std::string& name : shard.tensor_names()) {
      OrderedJson entry = shard.header.at(name);
      const uint64_t begin = merged.data.size();
      merged.data += shard.tensor_bytes(name);
      entry["data_offsets"] = {begin, static_cast<uint64_t>(merged.data.size())};
      merged.header[name] = entry;
    }
    fs::remove(ckpt.path(file));
  }
  fs::remove(ckpt.path("model.safetensors.index.json"));
  ckpt.put_shard("model.safetensors", merged);
}

TEST(MalformedCheckpoint, SingleFileCheckpointWithoutIndexIsAccepted) {
  TinyCheckpoint ckpt;
  merge_into_single_file(ckpt);
  const auto checkpoint = open_checkpoint(ckpt.dir().string());
  EXPECT_EQ(checkpoint->store.shard_files(), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(checkpoint->stats.stored_tensors, 357u);
}

TEST(MalformedCheckpoint, SingleFileCheckpointTruncated) {
  TinyCheckpoint ckpt;
  merge_into_single_file(ckpt);
  const std::string bytes = test::read_file(ckpt.path("model.safetensors"));
  test::write_file(ckpt.path("model.safetensors"), bytes.substr(0, bytes.size() - 1));
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {"model.safetensors: tensor ", "run past the data section"}));
}

TEST(MalformedCheckpoint, ShardIsAFifoNamedByTheIndex) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_of(kNorm);
  fs::remove(ckpt.path(file));
  ASSERT_EQ(::mkfifo(ckpt.path(file).c_str(), 0600), 0);
  EXPECT_TRUE(Contains(ckpt.open_error(), {"names shard " + file + ", which does not exist in "}));
}

}  // namespace
}  // namespace lily

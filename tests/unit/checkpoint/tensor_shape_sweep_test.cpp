// One tensor per role with a changed shape: open_checkpoint's error names that tensor.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "checkpoint_fixtures.h"

namespace lily {
namespace {

using test::Contains;
using test::OrderedJson;
using test::ShardFile;
using test::TinyCheckpoint;

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Stored names (after "language_model.model." unless they start with "language_model.").
const std::vector<std::string> kSample = {
    "embed_tokens.weight",                          // embed codes
    "embed_tokens.scales",                          // embed scales
    "language_model.lm_head.weight",                // lm_head codes
    "norm.weight",                                  // final norm
    "layers.0.input_layernorm.weight",              // norm
    "layers.6.post_attention_layernorm.weight",     // norm
    "layers.1.mlp.gate.weight",                     // router codes (Q8)
    "layers.1.mlp.gate.biases",                     // router biases
    "layers.2.mlp.switch_mlp.gate_proj.weight",     // stacked expert codes
    "layers.3.mlp.switch_mlp.down_proj.scales",     // stacked expert scales
    "layers.4.mlp.shared_expert.up_proj.scales",    // scales
    "layers.5.mlp.shared_expert.down_proj.biases",  // biases
    "layers.6.mlp.shared_expert_gate.weight",       // shared-expert gate codes (Q8)
    "layers.0.linear_attn.conv1d.weight",           // conv1d
    "layers.1.linear_attn.A_log",                   // A_log
    "layers.2.linear_attn.dt_bias",                 // dt_bias
    "layers.4.linear_attn.norm.weight",             // gated norm (plain gain)
    "layers.5.linear_attn.in_proj_qkv.weight",      // GDN projection codes
    "layers.7.self_attn.q_proj.weight",             // attention codes
    "layers.3.self_attn.k_norm.weight",             // q/k norm
    "layers.7.self_attn.o_proj.scales",             // attention scales
};

std::string full_name(const std::string& name) {
  return name.rfind("language_model.", 0) == 0 ? name : std::string(test::kP) + name;
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string out;
  for (char c : info.param) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

class TensorShapeSweep : public ::testing::TestWithParam<std::string> {
 protected:
  std::string name() const { return full_name(GetParam()); }
  std::vector<uint64_t> shape_in(const ShardFile& shard) const {
    return shard.header.at(name()).at("shape").get<std::vector<uint64_t>>();
  }
};

// First dimension one smaller, data trimmed to match: the header stays valid.
TEST_P(TensorShapeSweep, ShrunkFirstDimension) {
  TinyCheckpoint ckpt;
  std::vector<uint64_t> shape;
  ckpt.edit_shard_of(name(), [&](ShardFile& shard) {
    shape = shape_in(shard);
    const std::string bytes = shard.tensor_bytes(name());
    const uint64_t keep = bytes.size() / shape[0] * (shape[0] - 1);
    shape[0] -= 1;
    const std::string dtype = shard.header.at(name()).at("dtype").get<std::string>();
    shard.set_tensor(name(), dtype, shape, bytes.substr(0, static_cast<size_t>(keep)));
  });
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {"tensor " + name() + " has shape " + shape_string(shape) + ", expected "}));
}

// An extra trailing dimension of 1: same bytes, wrong rank.
TEST_P(TensorShapeSweep, ExtraUnitDimension) {
  TinyCheckpoint ckpt;
  std::vector<uint64_t> shape;
  ckpt.edit_shard_of(name(), [&](ShardFile& shard) {
    shape = shape_in(shard);
    shape.push_back(1);
    shard.entry(name())["shape"] = shape;
  });
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {"tensor " + name() + " has shape " + shape_string(shape) + ", expected "}));
}

// Only the header's shape changes: the byte span no longer matches.
TEST_P(TensorShapeSweep, HeaderShapeDisagreesWithTheByteSpan) {
  TinyCheckpoint ckpt;
  const std::string file = ckpt.shard_of(name());
  std::vector<uint64_t> shape;
  std::string dtype;
  uint64_t span = 0;
  ckpt.edit_shard_of(name(), [&](ShardFile& shard) {
    shape = shape_in(shard);
    shape[0] += 1;
    dtype = shard.header.at(name()).at("dtype").get<std::string>();
    span = shard.tensor_bytes(name()).size();
    shard.entry(name())["shape"] = shape;
  });
  EXPECT_TRUE(Contains(ckpt.open_error(), {file + ": tensor " + name() + " spans " +
                                               std::to_string(span) + " bytes, expected ",
                                           " for " + dtype + " " + shape_string(shape)}));
}

INSTANTIATE_TEST_SUITE_P(Tiny, TensorShapeSweep, ::testing::ValuesIn(kSample), test_name);

}  // namespace
}  // namespace lily

// config.json checks through open_checkpoint: each defect, and every field changed alone.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <ostream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "synth/make_checkpoint.h"

namespace lily {
namespace {

using test::Contains;
using test::OrderedJson;
using test::TinyCheckpoint;
namespace fs = std::filesystem;

// Applies `edit` to config.json and returns open_checkpoint's error.
template <typename Edit>
std::string config_error(Edit edit) {
  TinyCheckpoint ckpt;
  OrderedJson config = ckpt.config();
  edit(config);
  ckpt.set_config(config);
  return ckpt.open_error();
}

std::string config_text_error(const std::string& text) {
  TinyCheckpoint ckpt;
  test::write_file(ckpt.path("config.json"), text);
  return ckpt.open_error();
}

TEST(ConfigCheck, ModelTypeWrong) {
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["model_type"] = "qwen3_moe"; }),
                       {"config.json: model_type is \"qwen3_moe\", expected \"qwen3_5_moe\""}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["model_type"] = 35; }),
                       {"config.json.model_type is number 35, expected a string"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c.erase("model_type"); }),
                       {"config.json.model_type is missing"}));
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) { c["text_config"]["model_type"] = "qwen3_next"; }),
               {"config.json: text_config.model_type is string \"qwen3_next\", expected "
                "\"qwen3_5_moe_text\""}));
}

TEST(ConfigCheck, DuplicateKey) {
  TinyCheckpoint ckpt;
  std::string text = test::read_file(ckpt.path("config.json"));
  text.insert(text.find('{') + 1, "\"model_type\": \"qwen3_5_moe\",");
  test::write_file(ckpt.path("config.json"), text);
  EXPECT_TRUE(Contains(ckpt.open_error(), {"config.json: duplicate key \"model_type\""}));
}

TEST(ConfigCheck, DuplicateKeyInsideTextConfig) {
  TinyCheckpoint ckpt;
  std::string text = test::read_file(ckpt.path("config.json"));
  const size_t at = text.find("\"hidden_size\"");
  ASSERT_NE(at, std::string::npos);
  text.insert(at, "\"hidden_size\": 256, ");
  test::write_file(ckpt.path("config.json"), text);
  EXPECT_TRUE(Contains(ckpt.open_error(), {"config.json: duplicate key \"hidden_size\""}));
}

TEST(ConfigCheck, EmptyFile) {
  EXPECT_TRUE(Contains(config_text_error(""), {"config.json: not valid JSON"}));
}

TEST(ConfigCheck, NotJson) {
  EXPECT_TRUE(
      Contains(config_text_error("{\"model_type\": qwen}"), {"config.json: not valid JSON"}));
  EXPECT_TRUE(Contains(config_text_error("{} {}"), {"config.json: not valid JSON"}));
}

TEST(ConfigCheck, NulByteEndsNothing) {
  EXPECT_TRUE(Contains(config_text_error(std::string("{}\0{\"x\": 1}", 11)),
                       {"config.json: not valid JSON: NUL byte at offset 2"}));
}

TEST(ConfigCheck, NotAnObject) {
  EXPECT_TRUE(Contains(config_text_error("[1]"), {"config.json is array [1], expected an object"}));
}

TEST(ConfigCheck, NestedTooDeep) {
  EXPECT_TRUE(Contains(
      config_text_error("{\"a\":" + std::string(50000, '[') + std::string(50000, ']') + "}"),
      {"config.json: JSON nesting deeper than 8 levels"}));
}

TEST(ConfigCheck, LargerThanTheCap) {
  TinyCheckpoint ckpt;
  const fs::path path = ckpt.path("config.json");
  fs::resize_file(path, (4u << 20) + 1);  // sparse tail of zero bytes
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {path.string() + ": file is 4194305 bytes, expected at most 4194304"}));
}

TEST(ConfigCheck, ConfigIsADirectory) {
  TinyCheckpoint ckpt;
  fs::remove(ckpt.path("config.json"));
  fs::create_directory(ckpt.path("config.json"));
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {ckpt.path("config.json").string() + ": not a regular file"}));
}

TEST(ConfigCheck, ConfigIsAFifo) {
  TinyCheckpoint ckpt;
  fs::remove(ckpt.path("config.json"));
  ASSERT_EQ(::mkfifo(ckpt.path("config.json").c_str(), 0600), 0);
  EXPECT_TRUE(
      Contains(ckpt.open_error(), {ckpt.path("config.json").string() + ": not a regular file"}));
}

TEST(ConfigCheck, ConfigIsASymlinkLoop) {
  TinyCheckpoint ckpt;
  const fs::path path = ckpt.path("config.json");
  fs::remove(path);
  fs::create_symlink("config.json", path);
  EXPECT_TRUE(Contains(ckpt.open_error(), {"cannot open " + path.string()}));
}

TEST(ConfigCheck, TextConfigMissingOrNotAnObject) {
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c.erase("text_config"); }),
                       {"config.json.text_config is missing"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["text_config"] = "x"; }),
                       {"config.json: text_config is string \"x\", expected an object"}));
}

TEST(ConfigCheck, QuantizationGroupSize32) {
  EXPECT_TRUE(Contains(
      config_error([](OrderedJson& c) { c["quantization"]["group_size"] = 32; }),
      {"config.json: quantization is mode=affine, bits=4, group_size=32; expected MLX affine "
       "4-bit with group_size=64"}));
}

TEST(ConfigCheck, QuantizationModeNotAffine) {
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["quantization"]["mode"] = "mxfp4"; }),
                       {"config.json: quantization is mode=mxfp4, bits=4, group_size=64"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["quantization"]["mode"] = 1; }),
                       {"config.json: quantization.mode is number 1, expected \"affine\""}));
}

TEST(ConfigCheck, QuantizationMissingOrNotAnObject) {
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c.erase("quantization"); }),
                       {"config.json: quantization is missing; lily needs the MLX affine 4-bit "
                        "checkpoint"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["quantization"] = 4; }),
                       {"config.json: quantization is number 4, expected an object"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["quantization"].erase("bits"); }),
                       {"config.json: quantization.bits is missing"}));
}

TEST(ConfigCheck, MissingEightBitOverrideForOneRouter) {
  const std::string key = quant_override_key(5, "mlp.gate");
  EXPECT_TRUE(Contains(config_error([&](OrderedJson& c) { c["quantization"].erase(key); }),
                       {"config.json: quantization lacks the 8-bit override \"" + key + "\""}));
}

TEST(ConfigCheck, MissingEightBitOverrideForOneSharedExpertGate) {
  const std::string key = quant_override_key(7, "mlp.shared_expert_gate");
  EXPECT_TRUE(Contains(config_error([&](OrderedJson& c) { c["quantization"].erase(key); }),
                       {"quantization lacks the 8-bit override \"" + key + "\""}));
}

TEST(ConfigCheck, OverrideWithFourBits) {
  const std::string key = quant_override_key(2, "mlp.shared_expert_gate");
  EXPECT_TRUE(Contains(config_error([&](OrderedJson& c) { c["quantization"][key]["bits"] = 4; }),
                       {"config.json: quantization[\"" + key +
                        "\"] is mode=affine, bits=4, group_size=64; expected MLX affine 8-bit"}));
}

TEST(ConfigCheck, UnexpectedOverride) {
  const std::string key = quant_override_key(0, "mlp.switch_mlp.up_proj");
  EXPECT_TRUE(Contains(
      config_error([&](OrderedJson& c) {
        c["quantization"][key] = {{"group_size", 64}, {"bits", 8}};
      }),
      {"config.json: quantization has an unexpected per-tensor override \"" + key + "\""}));
}

TEST(ConfigCheck, VisionTowerOverridesAndFalseMarkersAreIgnored) {
  TinyCheckpoint ckpt;
  OrderedJson config = ckpt.config();
  for (const char* block : {"quantization", "quantization_config"}) {
    config[block]["vision_tower.blocks.0.attn.qkv"] = {{"group_size", 32}, {"bits", 2}};
    config[block]["vision_tower.patch_embed"] = false;
  }
  ckpt.set_config(config);
  EXPECT_EQ(open_checkpoint(ckpt.dir().string())->config.profile, Profile::tiny);
}

TEST(ConfigCheck, QuantizationConfigDisagreesWithQuantization) {
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) { c["quantization_config"]["mode"] = "mxfp4"; }),
               {"config.json: quantization_config differs from quantization"}));
}

TEST(ConfigCheck, QuantizationConfigAloneIsNotEnough) {
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c.erase("quantization"); }),
                       {"config.json: quantization is missing"}));
}

TEST(ConfigCheck, OtherModelsStrings) {
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) { c["architectures"] = {"Qwen3MoeForCausalLM"}; }),
               {"config.json: architectures is array [\"Qwen3MoeForCausalLM\"], expected "
                "[\"Qwen3_5MoeForConditionalGeneration\"]"}));
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) {
                 c["text_config"]["rope_parameters"]["rope_type"] = "yarn";
               }),
               {"config.json: text_config.rope_parameters.rope_type is string \"yarn\", expected "
                "\"default\""}));
  EXPECT_TRUE(Contains(
      config_error([](OrderedJson& c) { c["text_config"]["mamba_ssm_dtype"] = "bfloat16"; }),
      {"config.json: text_config.mamba_ssm_dtype is string \"bfloat16\", expected "
       "\"float32\""}));
}

TEST(ConfigCheck, WrongLayerPattern) {
  EXPECT_TRUE(Contains(
      config_error([](OrderedJson& c) { c["text_config"]["layer_types"][2] = "full_attention"; }),
      {"config.json: text_config.layer_types[2] is string \"full_attention\", expected "
       "\"linear_attention\" (full attention exactly at layers with i % 4 == 3)"}));
  EXPECT_TRUE(Contains(
      config_error([](OrderedJson& c) { c["text_config"]["layer_types"][7] = "linear_attention"; }),
      {"text_config.layer_types[7] is string \"linear_attention\", expected \"full_attention\""}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["text_config"]["layer_types"][0] = 0; }),
                       {"text_config.layer_types[0] is number 0, expected \"linear_attention\""}));
}

TEST(ConfigCheck, LayerTypesOfTheWrongLength) {
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) { c["text_config"]["layer_types"].erase(7); }),
               {"config.json: text_config.layer_types has 7 entries for 8 layers"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) {
                         c["text_config"]["layer_types"].push_back("linear_attention");
                       }),
                       {"text_config.layer_types has 9 entries for 8 layers"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["text_config"]["layer_types"] = "x"; }),
                       {"text_config.layer_types is string \"x\", expected a list"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["text_config"].erase("layer_types"); }),
                       {"config.json: text_config.layer_types is missing"}));
}

TEST(ConfigCheck, WrongHiddenSize) {
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["text_config"]["hidden_size"] = 512; }),
                       {"config.json: text_config.hidden_size is 512, expected 256 for the tiny "
                        "test profile"}));
}

TEST(ConfigCheck, TinyShapeWithoutTheMarker) {
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c.erase("lily_test_profile"); }),
                       {"config.json: text_config.hidden_size is 256, expected 2048 for the "
                        "production Qwen3.6-35B-A3B shape (this is the tiny test shape, which "
                        "needs the top-level marker \"lily_test_profile\": \"tiny\")"}));
}

TEST(ConfigCheck, MarkerOnTheProductionShape) {
  // Only config.json changes: the config check runs before any shard is read.
  TinyCheckpoint ckpt;
  OrderedJson config =
      OrderedJson::parse(synthetic_config_json(Profile::production, 248044, 248046));
  config["lily_test_profile"] = "tiny";
  ckpt.set_config(config);
  EXPECT_TRUE(Contains(ckpt.open_error(),
                       {"config.json: text_config.hidden_size is 2048, expected 256 for the tiny "
                        "test profile (the \"lily_test_profile\": \"tiny\" marker is on the "
                        "production shape)"}));
}

TEST(ConfigCheck, ProductionConfigOverTinyWeightsFailsAtTheWeights) {
  TinyCheckpoint ckpt;
  ckpt.set_config(OrderedJson::parse(synthetic_config_json(Profile::production, 248044, 248046)));
  EXPECT_TRUE(Contains(ckpt.open_error(), {"tensor language_model.model.embed_tokens.weight has "
                                           "shape [4096, 32], expected [248320, 256]"}));
}

TEST(ConfigCheck, UnknownTestProfile) {
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["lily_test_profile"] = "small"; }),
                       {"config.json: lily_test_profile is string \"small\", expected \"tiny\""}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["lily_test_profile"] = true; }),
                       {"config.json: lily_test_profile is boolean true, expected \"tiny\""}));
}

TEST(ConfigCheck, FieldsOfTheWrongType) {
  auto text_field = [](const char* key, OrderedJson value) {
    return config_error([&](OrderedJson& c) { c["text_config"][key] = value; });
  };
  EXPECT_TRUE(Contains(text_field("hidden_size", "256"),
                       {"config.json: text_config.hidden_size is string \"256\", expected a "
                        "non-negative integer"}));
  EXPECT_TRUE(
      Contains(text_field("hidden_size", -256),
               {"text_config.hidden_size is number -256, expected a non-negative integer"}));
  EXPECT_TRUE(Contains(text_field("hidden_size", 256.0),
                       {"text_config.hidden_size is number 256.0, expected a non-negative "
                        "integer"}));
  EXPECT_TRUE(Contains(text_field("attn_output_gate", 1),
                       {"text_config.attn_output_gate is number 1, expected true or false"}));
  EXPECT_TRUE(Contains(text_field("rms_norm_eps", "1e-6"),
                       {"text_config.rms_norm_eps is string \"1e-6\", expected a number"}));
  EXPECT_TRUE(Contains(text_field("rope_parameters", 1),
                       {"config.json: text_config.rope_parameters is number 1, expected an "
                        "object"}));
}

TEST(ConfigCheck, RequiredFieldsMissing) {
  for (const char* key : {"hidden_size", "num_experts", "rms_norm_eps", "tie_word_embeddings",
                          "linear_conv_kernel_dim", "rope_parameters"}) {
    EXPECT_TRUE(Contains(config_error([&](OrderedJson& c) { c["text_config"].erase(key); }),
                         {"config.json: text_config." + std::string(key) + " is missing"}));
  }
  EXPECT_TRUE(Contains(
      config_error([](OrderedJson& c) { c["text_config"]["rope_parameters"].erase("rope_theta"); }),
      {"config.json: text_config.rope_parameters.rope_theta is missing"}));
}

TEST(ConfigCheck, OptionalValuesMustBeThisModels) {
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) { c["text_config"]["hidden_act"] = "gelu"; }),
               {"config.json: text_config.hidden_act is string \"gelu\", expected "
                "\"silu\""}));
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) { c["text_config"]["norm_topk_prob"] = false; }),
               {"text_config.norm_topk_prob is boolean false, expected true"}));
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) { c["text_config"]["mlp_only_layers"] = {1}; }),
               {"text_config.mlp_only_layers is array [1], expected []"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["tie_word_embeddings"] = true; }),
                       {"config.json.tie_word_embeddings is boolean true, expected false"}));
}

TEST(ConfigCheck, EosTokenIds) {
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) { c["eos_token_id"] = {4096}; }),
                       {"config.json: eos_token_id[0] is 4096, expected a token id below 4096"}));
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) { c["eos_token_id"] = OrderedJson::array(); }),
               {"config.json: eos_token_id is an empty list, expected token ids"}));
  EXPECT_TRUE(
      Contains(config_error([](OrderedJson& c) { c["eos_token_id"] = -1; }),
               {"config.json: eos_token_id is number -1, expected a non-negative integer"}));
  EXPECT_TRUE(Contains(config_error([](OrderedJson& c) {
                         c.erase("eos_token_id");
                         c["text_config"]["eos_token_id"] = 5000;
                       }),
                       {"config.json: text_config.eos_token_id is 5000, expected a token id "
                        "below 4096"}));
}

TEST(ConfigCheck, EosFromTextConfigWhenTheTopLevelHasNone) {
  TinyCheckpoint ckpt;
  OrderedJson config = ckpt.config();
  config.erase("eos_token_id");
  config["text_config"]["eos_token_id"] = 17;
  ckpt.set_config(config);
  EXPECT_EQ(open_checkpoint(ckpt.dir().string())->config.eos_token_ids, std::vector<uint32_t>{17});
}

// ---- every numeric/bool field of text_config and the quantization block, alone ----

enum class FieldKind { text, quant, quant_copy, ignored };

struct ConfigField {
  std::string pointer;  // JSON pointer into config.json
  std::string name;     // how messages spell the field (text) or its block (quant)
  std::string key;      // last path component
  FieldKind kind = FieldKind::text;
};

void PrintTo(const ConfigField& field, std::ostream* out) {
  *out << field.pointer;
}

// The one field read by nobody: text_config's eos_token_id, which the top-level
// eos_token_id replaces (docs/checkpoint.md, *config.json*).
bool ignored_by_design(const std::string& pointer) {
  return pointer == "/text_config/eos_token_id";
}

// `dotted` is how messages name the value: an array element is reported as its array.
void collect(const OrderedJson& value, const std::string& pointer, const std::string& dotted,
             std::vector<ConfigField>* out) {
  if (value.is_object() || value.is_array()) {
    // config.json keys hold no '/' or '~', so they need no JSON-pointer escaping.
    for (const auto& [key, item] : value.items()) {
      collect(item, pointer + "/" + key, value.is_array() ? dotted : dotted + "." + key, out);
    }
    return;
  }
  if (!value.is_number() && !value.is_boolean()) return;
  ConfigField field;
  field.pointer = pointer;
  field.name = dotted.substr(1);  // drop the leading "."
  field.key = pointer.substr(pointer.rfind('/') + 1);
  field.kind = ignored_by_design(pointer) ? FieldKind::ignored : FieldKind::text;
  out->push_back(field);
}

std::vector<ConfigField> config_fields() {
  const OrderedJson config = OrderedJson::parse(synthetic_config_json(Profile::tiny, 4063, 4065));
  std::vector<ConfigField> fields;
  collect(config.at("text_config"), "/text_config", ".text_config", &fields);
  // Per-tensor overrides of the first and last layer only (the check is one loop), and
  // only the top level of quantization_config (compared as a whole with quantization).
  const std::vector<std::string> sampled_overrides = {
      quant_override_key(0, "mlp.gate"), quant_override_key(0, "mlp.shared_expert_gate"),
      quant_override_key(7, "mlp.gate"), quant_override_key(7, "mlp.shared_expert_gate")};
  for (const std::string block_name : {"quantization", "quantization_config"}) {
    for (const auto& [key, block] : config.at(block_name).items()) {
      const bool top = !block.is_object();
      const bool sampled = std::find(sampled_overrides.begin(), sampled_overrides.end(), key) !=
                           sampled_overrides.end();
      if (!top && (block_name != "quantization" || !sampled)) continue;
      for (const char* param : {"group_size", "bits"}) {
        if (!top && !block.contains(param)) continue;
        if (top && key != param) continue;
        ConfigField field;
        field.pointer = "/" + block_name + "/" + key + (top ? "" : "/" + std::string(param));
        field.name = top ? block_name : block_name + "[\"" + key + "\"]";
        field.key = param;
        field.kind = block_name == "quantization" ? FieldKind::quant : FieldKind::quant_copy;
        fields.push_back(field);
      }
    }
  }
  return fields;
}

std::string test_name(const ::testing::TestParamInfo<ConfigField>& info) {
  std::string name;
  for (char c : info.param.pointer.substr(1))
    name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

class ConfigFieldSweep : public ::testing::TestWithParam<ConfigField> {};

TEST(ConfigFieldSweepList, CoversTheShapeAndQuantizationFields) {
  const std::vector<ConfigField> fields = config_fields();
  size_t text = 0;
  size_t quant = 0;
  size_t copy = 0;
  for (const ConfigField& f : fields) {
    text += f.kind == FieldKind::text ? 1u : 0u;
    quant += f.kind == FieldKind::quant ? 1u : 0u;
    copy += f.kind == FieldKind::quant_copy ? 1u : 0u;
  }
  EXPECT_GE(text, 28u);
  EXPECT_EQ(quant, 2u + 2u * 4u);  // top-level pair + a pair per sampled override
  EXPECT_EQ(copy, 2u);
}

// The value changed (+1, x2, flipped): named in the message, or accepted if ignored.
TEST_P(ConfigFieldSweep, ChangedValueIsNamed) {
  const ConfigField& field = GetParam();
  TinyCheckpoint ckpt;
  OrderedJson config = ckpt.config();
  const OrderedJson::json_pointer pointer(field.pointer);
  ASSERT_TRUE(config.contains(pointer)) << field.pointer;
  OrderedJson& value = config[pointer];
  std::string shown;
  if (value.is_boolean()) {
    value = !value.get<bool>();
  } else if (value.is_number_integer()) {
    value = value.get<uint64_t>() + 1;
    shown = value.dump();
  } else {
    value = value.get<double>() * 2;
  }
  ckpt.set_config(config);
  switch (field.kind) {
    case FieldKind::ignored:
      EXPECT_NO_THROW(open_checkpoint(ckpt.dir().string())) << field.pointer;
      break;
    case FieldKind::text:
      EXPECT_TRUE(Contains(ckpt.open_error(), {"config.json: " + field.name + " is "}));
      break;
    case FieldKind::quant:
      EXPECT_TRUE(Contains(ckpt.open_error(),
                           {"config.json: " + field.name + " is mode=", field.key + "=" + shown}));
      break;
    case FieldKind::quant_copy:
      EXPECT_TRUE(Contains(ckpt.open_error(),
                           {"config.json: quantization_config differs from quantization"}));
      break;
  }
}

// The value replaced by a string: named in the message, or accepted if ignored.
TEST_P(ConfigFieldSweep, WrongTypeIsNamed) {
  const ConfigField& field = GetParam();
  TinyCheckpoint ckpt;
  OrderedJson config = ckpt.config();
  config[OrderedJson::json_pointer(field.pointer)] = "x";
  ckpt.set_config(config);
  switch (field.kind) {
    case FieldKind::ignored:
      EXPECT_NO_THROW(open_checkpoint(ckpt.dir().string())) << field.pointer;
      break;
    case FieldKind::text:
      EXPECT_TRUE(Contains(ckpt.open_error(),
                           {"config.json: " + field.name + " is ", "\"x\"", ", expected "}));
      break;
    case FieldKind::quant:
      EXPECT_TRUE(Contains(ckpt.open_error(), {"config.json: " + field.name + "." + field.key +
                                               " is string \"x\", expected a non-negative "
                                               "integer"}));
      break;
    case FieldKind::quant_copy:
      EXPECT_TRUE(Contains(ckpt.open_error(),
                           {"config.json: quantization_config differs from quantization"}));
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, ConfigFieldSweep, ::testing::ValuesIn(config_fields()), test_name);

}  // namespace
}  // namespace lily

// Sampling resolution: greedy unless a field asks, server defaults, neutral values, seeds; generation_config.json; flags.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "server/openai_types.h"
#include "server/sampling_config.h"

namespace lily {
namespace {

TEST(ResolveSampling, NoFieldAndNoDefaultsIsTheArgmax) {
  SamplingFields none;
  EXPECT_FALSE(resolve_sampling(none, SamplingDefaults{}, 5).has_value());
  SamplingFields seed_only;
  seed_only.seed = 9;  // a seed alone does not switch sampling on
  EXPECT_FALSE(resolve_sampling(seed_only, SamplingDefaults{}, 5).has_value());
}

TEST(ResolveSampling, TemperatureZeroWithoutProcessingIsTheArgmax) {
  SamplingFields f;
  f.temperature = 0.0;
  f.top_p = 0.5;
  EXPECT_FALSE(resolve_sampling(f, SamplingDefaults{}, 5).has_value());
  f.presence_penalty = 0.5;  // processed logits: the sampler op's argmax
  const auto p = resolve_sampling(f, SamplingDefaults{}, 5);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->temperature, 0.0f);
  EXPECT_FLOAT_EQ(p->presence_penalty, 0.5f);
}

TEST(ResolveSampling, RequestOverDefaultsOverNeutral) {
  SamplingDefaults d;
  d.temperature = 0.7;
  d.top_k = 20;
  d.top_p = 0.8;
  SamplingFields f;
  f.top_p = 0.95;
  f.seed = (uint64_t{3} << 32) | 7;
  f.logit_bias = {{5, -100.0f}, {9, 2.5f}};
  const auto p = resolve_sampling(f, d, 123);
  ASSERT_TRUE(p.has_value());
  EXPECT_FLOAT_EQ(p->temperature, 0.7f);  // default
  EXPECT_FLOAT_EQ(p->top_p, 0.95f);       // request
  EXPECT_EQ(p->top_k, 20);                // default
  EXPECT_FLOAT_EQ(p->min_p, 0.0f);        // neutral
  EXPECT_FLOAT_EQ(p->repetition_penalty, 1.0f);
  EXPECT_EQ(p->seed_lo, 7u);
  EXPECT_EQ(p->seed_hi, 3u);
  ASSERT_EQ(p->bias_count, 2);
  EXPECT_EQ(p->bias_ids[1], 9);
  EXPECT_FLOAT_EQ(p->bias_values[0], -100.0f);
}

TEST(ResolveSampling, DefaultsAloneSampleAndTheFallbackSeedIsUsed) {
  SamplingDefaults d;
  d.temperature = 1.0;
  const auto p = resolve_sampling(SamplingFields{}, d, (uint64_t{1} << 40) + 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_FLOAT_EQ(p->temperature, 1.0f);
  EXPECT_FLOAT_EQ(p->top_p, 1.0f);
  EXPECT_EQ(p->top_k, 0);
  EXPECT_EQ(p->seed_lo, 2u);
  EXPECT_EQ(p->seed_hi, 256u);
}

TEST(ResolveSampling, OnlyATopPMeansOpenAiTemperatureOne) {
  SamplingFields f;
  f.top_p = 0.9;
  const auto p = resolve_sampling(f, SamplingDefaults{}, 1);
  ASSERT_TRUE(p.has_value());
  EXPECT_FLOAT_EQ(p->temperature, 1.0f);
}

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()));
  std::ofstream(path) << text;
  return path.string();
}

TEST(GenerationConfig, ReadsTheSamplingKeysPresent) {
  const std::string path = write_temp(
      "gen_ok", R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [1, 2]})");
  const SamplingDefaults d = read_generation_config(path);
  EXPECT_DOUBLE_EQ(*d.temperature, 0.6);
  EXPECT_EQ(*d.top_k, 20);
  EXPECT_DOUBLE_EQ(*d.top_p, 0.95);
  EXPECT_FALSE(d.min_p.has_value());
  EXPECT_FALSE(d.repetition_penalty.has_value());
  EXPECT_EQ(d.describe(), "temperature=0.6 top_p=0.95 top_k=20");
  std::filesystem::remove(path);
}

TEST(GenerationConfig, DoSampleFalseStaysGreedy) {
  const std::string path = write_temp("gen_greedy", R"({"do_sample": false, "temperature": 0.6})");
  EXPECT_FALSE(read_generation_config(path).any());
  EXPECT_EQ(read_generation_config(path).describe(), "greedy");
  std::filesystem::remove(path);
}

TEST(GenerationConfig, BadValuesNameTheFileAndField) {
  struct Case {
    const char* json;
    const char* expect;
  };
  for (const Case& c : {Case{R"({"temperature": "hot"})", "temperature must be a number"},
                        Case{R"({"temperature": 3})", "temperature must be in"},
                        Case{R"({"top_k": -1})", "top_k must be a non-negative integer"},
                        Case{R"({"do_sample": 1})", "do_sample must be true or false"},
                        Case{R"([1])", "expected a JSON object"}}) {
    const std::string path = write_temp("gen_bad", c.json);
    try {
      read_generation_config(path);
      ADD_FAILURE() << "accepted " << c.json;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    std::filesystem::remove(path);
  }
  EXPECT_THROW(read_generation_config("/nonexistent/generation_config.json"), InputError);
}

TEST(SamplingFlag, ParsesNumbersInRangeOnly) {
  EXPECT_DOUBLE_EQ(parse_sampling_flag("--temperature", "0.7", 0, 2), 0.7);
  EXPECT_THROW(parse_sampling_flag("--temperature", "2.5", 0, 2), InputError);
  EXPECT_THROW(parse_sampling_flag("--temperature", "0.7x", 0, 2), InputError);
  EXPECT_THROW(parse_sampling_flag("--temperature", "nan", 0, 2), InputError);
  EXPECT_THROW(parse_sampling_flag("--top-p", "", 0, 1), InputError);
}

}  // namespace
}  // namespace lily

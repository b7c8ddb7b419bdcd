// The CPU model against goldens from transformers' Qwen3_5MoeForCausalLM (float64).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "engine/generator.h"
#include "model/qwen36_model.h"
#include "tiny_model_fixture.h"

namespace lily {
namespace {

// Tolerances (docs/precision.md): greedy tokens must agree wherever the golden's top-2
// margin exceeds kMarginTolerance; top-16 logits agree within kLogitTolerance relative.
constexpr double kMarginTolerance = 1e-3;
constexpr double kLogitTolerance = 1e-3;

std::vector<std::filesystem::path> golden_files() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(LILY_SOURCE_DIR) + "/tests/goldens/model")) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

class GoldenTest : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(GoldenTest, GreedyTokensAndTopLogitsMatchTransformers) {
  std::ifstream in(GetParam());
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_EQ(golden["versions"]["transformers"], "5.17.0");
  const auto seed = golden["checkpoint"]["seed"].get<uint64_t>();
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const auto expected = golden["tokens"].get<std::vector<int32_t>>();
  const auto margins = golden["top2_margins"].get<std::vector<double>>();

  const Checkpoint& checkpoint = testing::tiny_checkpoint(seed);
  std::unique_ptr<Backend> backend = make_cpu_backend(0);
  Qwen36Model model(checkpoint, *backend);
  DecodeState state(*backend, checkpoint.config.shape,
                    static_cast<int64_t>(prompt.size() + expected.size() + 1));
  GenerationOptions options;
  options.max_tokens = static_cast<int64_t>(expected.size());
  options.top_logits = 16;  // no stop tokens: the golden decodes a fixed number of steps
  const GenerationResult result = generate_greedy(model, state, prompt, options);
  ASSERT_EQ(result.tokens.size(), expected.size());

  size_t compared = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    // Logits of step i: every golden top-16 id clearly inside the top 16 must be in ours,
    // with its logit within tolerance.
    std::map<int32_t, double> ours;
    for (const auto& [id, logit] : result.steps[i]) ours[id] = logit;
    const auto& steps = golden["steps"][i];
    const double cutoff = steps[15][1].get<double>() + kLogitTolerance * 10;
    for (const auto& pair : steps) {
      const auto id = pair[0].get<int32_t>();
      const double logit = pair[1].get<double>();
      auto it = ours.find(id);
      if (it == ours.end()) {
        EXPECT_LT(logit, cutoff) << "step " << i << ": golden id " << id << " missing";
        continue;
      }
      EXPECT_NEAR(it->second, logit, kLogitTolerance * std::max(1.0, std::abs(logit)))
          << "step " << i << ", id " << id;
    }
    ++compared;
    if (result.tokens[i] != expected[i]) {
      // Only a near tie may flip the greedy choice; after it the contexts differ.
      EXPECT_LE(margins[i], kMarginTolerance) << "step " << i << " token differs";
      break;
    }
  }
  EXPECT_GE(compared, 1u);
  std::printf("%s: %zu of %zu steps compared\n", GetParam().filename().c_str(), compared,
              expected.size());
}

INSTANTIATE_TEST_SUITE_P(Tiny, GoldenTest, ::testing::ValuesIn(golden_files()),
                         [](const auto& param_info) {
                           std::string name = param_info.param.stem().string();
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace lily

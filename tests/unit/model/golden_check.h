// Test helper: one transformers golden (tokens + top-16 logits per step) checked on a backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <span>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "model/qwen36_model.h"
#include "tiny_model_fixture.h"

namespace lily::testing {

// The golden files of tests/goldens/model, sorted.
inline std::vector<std::filesystem::path> golden_files() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(LILY_SOURCE_DIR) + "/tests/goldens/model")) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A test name from a golden file name.
inline std::string golden_test_name(const std::filesystem::path& path) {
  std::string name = path.stem().string();
  for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

// The CPU backend, recording the smallest gap between the k-th and (k+1)-th router logit of
// any token: where it is tiny, another backend's rounding may pick the other expert, which
// moves that token's output by a visible amount (a discontinuity of top-k routing, not an
// error of either backend).
class RouterGapProbe : public CpuBackend {
 public:
  RouterGapProbe() : CpuBackend(2) {}
  double min_gap = INFINITY;
  void moe_route(const float* logits, int64_t n, int64_t experts, int64_t k, int32_t* ids,
                 float* weights) override {
    CpuBackend::moe_route(logits, n, experts, k, ids, weights);
    std::vector<float> row(static_cast<size_t>(experts));
    for (int64_t t = 0; t < n; ++t) {
      std::copy(logits + t * experts, logits + (t + 1) * experts, row.begin());
      std::nth_element(row.begin(), row.begin() + k, row.end(), std::greater<float>());
      const float kth = *std::min_element(row.begin(), row.begin() + k);
      min_gap = std::min(min_gap, static_cast<double>(kth) - static_cast<double>(row[static_cast<size_t>(k)]));
    }
  }
};

// The smallest top-k router gap over the prompt's prefill on the CPU.
inline double min_router_gap(const Checkpoint& checkpoint, std::span<const int32_t> prompt) {
  RouterGapProbe probe;
  Qwen36Model model(checkpoint, probe, 4096);
  DecodeState state(probe, checkpoint.config.shape, static_cast<int64_t>(prompt.size() + 1));
  model.forward(state, prompt);
  return probe.min_gap;
}

// Tolerances of one backend against the goldens.
struct GoldenTolerances {
  double logit = 1e-3;   // relative, of max(1, |logit|)
  double margin = 1e-3;  // a greedy flip is allowed only below this top-2 margin
  // When a prompt token's router has a top-k gap below `router_tie` (0: never), that token
  // may be routed differently, and the logits are held to `router_flip_logit` instead.
  double router_tie = 0;
  double router_flip_logit = 0;
  // And the greedy-flip margin there (0: `margin` still).
  double router_flip_margin = 0;
};

// Greedy tokens must agree wherever the golden's top-2 margin exceeds `margin_tolerance`
// (after the first allowed flip the contexts differ, so the comparison stops there); each
// golden top-16 logit clearly inside our top 16 must be within `logit_tolerance` relative
// (of max(1, |logit|)). Tolerances per backend: docs/precision.md. `kv_cache`: the state's KV
// cache dtype (f32, the exact reference path, unless a test asks for bf16 on CUDA).
inline void check_golden(const std::filesystem::path& file, Backend& backend, int64_t chunk,
                         const GoldenTolerances& tolerances, KvDtype kv_cache = KvDtype::f32) {
  std::ifstream in(file);
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_EQ(golden["versions"]["transformers"], "5.17.0");
  const auto seed = golden["checkpoint"]["seed"].get<uint64_t>();
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const auto expected = golden["tokens"].get<std::vector<int32_t>>();
  const auto margins = golden["top2_margins"].get<std::vector<double>>();

  const Checkpoint& checkpoint = tiny_checkpoint(seed);
  double margin_tolerance = tolerances.margin;
  double logit_tolerance = tolerances.logit;
  if (tolerances.router_tie > 0) {
    const double gap = min_router_gap(checkpoint, prompt);
    if (gap < tolerances.router_tie) {
      logit_tolerance = tolerances.router_flip_logit;
      if (tolerances.router_flip_margin > 0) margin_tolerance = tolerances.router_flip_margin;
      std::printf("%s: a router top-k gap of %.3g in the prompt (below %.3g): logits held to %.3g, "
                  "flips to a margin of %.3g\n",
                  file.filename().c_str(), gap, tolerances.router_tie, logit_tolerance, margin_tolerance);
    }
  }
  Qwen36Model model(checkpoint, backend, chunk);
  DecodeState state(backend, checkpoint.config.shape,
                    static_cast<int64_t>(prompt.size() + expected.size() + 1), kv_cache);
  GenerationOptions options;
  options.max_tokens = static_cast<int64_t>(expected.size());
  options.top_logits = 16;  // no stop tokens: the golden decodes a fixed number of steps
  const GenerationResult result = generate(model, state, prompt, options);
  ASSERT_EQ(result.tokens.size(), expected.size());

  size_t compared = 0;
  double worst = 0;
  std::string flip = "no greedy flip";
  for (size_t i = 0; i < expected.size(); ++i) {
    std::map<int32_t, double> ours;
    for (const auto& [id, logit] : result.steps[i]) ours[id] = static_cast<double>(logit);
    const auto& steps = golden["steps"][i];
    const double cutoff = steps[15][1].get<double>() + logit_tolerance * 10;
    for (const auto& pair : steps) {
      const auto id = pair[0].get<int32_t>();
      const double logit = pair[1].get<double>();
      auto it = ours.find(id);
      if (it == ours.end()) {
        EXPECT_LT(logit, cutoff) << "step " << i << ": golden id " << id << " missing";
        continue;
      }
      worst = std::max(worst, std::abs(it->second - logit) / std::max(1.0, std::abs(logit)));
      EXPECT_NEAR(it->second, logit, logit_tolerance * std::max(1.0, std::abs(logit)))
          << "step " << i << ", id " << id;
    }
    ++compared;
    if (result.tokens[i] != expected[i]) {
      // Only a near tie may flip the greedy choice; after it the contexts differ.
      EXPECT_LE(margins[i], margin_tolerance) << "step " << i << " token differs";
      flip = "a greedy flip at step " + std::to_string(i) + " (golden top-2 margin " +
             std::to_string(margins[i]) + ")";
      break;
    }
  }
  EXPECT_GE(compared, 1u);
  std::printf(
      "%s on %s (KV cache %s): %zu of %zu steps compared, worst relative logit error %.3g, %s\n",
      file.filename().c_str(), backend.name().c_str(), kv_dtype_name(kv_cache), compared,
      expected.size(), worst, flip.c_str());
}

}  // namespace lily::testing

// Device time of the CUDA sampler ops on the production vocabulary, from graph replays (not a test).
//
// Each parameter set: 200 sample ops (or token_logprobs) captured into one graph, launched back
// to back as in a decode graph (programmatic dependent launch included), replayed 20 times
// after a warm-up; the time per op is the wall time of the replays / 4000. Prints one line per
// set. Usage: cuda_sampler_bench [set index...] (needs a GPU; no index: every set).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_options.h"
#include "backend_test_support.h"

namespace {

using lily::Backend;
using lily::SamplerBuffers;
using lily::SamplerParams;

constexpr int64_t kVocab = 248'320;
constexpr int kOpsPerGraph = 200;
constexpr int kReplays = 20;

// LLM-like logits (as tests/unit/backend/sampler_bench.cpp): a normal bulk (sigma 2.5) and a
// head of 40 ids 8-14 above it.
std::vector<float> bench_logits() {
  lily::testing::Rng rng(99);
  std::vector<float> l(kVocab);
  for (float& v : l) {
    const double u1 = static_cast<double>(rng.uniform(1e-7f, 1.0f));
    const double u2 = static_cast<double>(rng.uniform(0.0f, 1.0f));
    v = 2.5f * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  for (int i = 0; i < 40; ++i) l[static_cast<size_t>(rng.below(kVocab))] = rng.uniform(8.0f, 14.0f);
  return l;
}

SamplerParams with(float t, int32_t k, float top_p, float min_p) {
  SamplerParams p;
  p.temperature = t;
  p.top_k = k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.top_logprobs = 20;
  return p;
}

double time_graph(Backend& be, int graph) {
  be.replay(graph);  // warm-up
  be.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < kReplays; ++r) be.replay(graph);
  be.synchronize();
  const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
  return took.count() / (kReplays * kOpsPerGraph);
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (!lily::cuda_available(&why)) {
    std::printf("SKIPPED: no usable CUDA device: %s\n", why.c_str());
    return 0;
  }
  std::unique_ptr<Backend> be = lily::make_cuda_backend(0, lily::CudaOptions{});
  const std::vector<float> host_logits = bench_logits();
  float* logits = be->alloc(static_cast<size_t>(kVocab));
  be->copy_from_host(host_logits.data(), host_logits.size(), logits);
  SamplerBuffers buf;
  buf.params = be->alloc_i32(static_cast<size_t>(lily::kSamplerParamWords));
  buf.counts = be->alloc_i32(static_cast<size_t>(kVocab));
  buf.prompt_seen = be->alloc_i32(static_cast<size_t>(kVocab));
  buf.step = be->alloc_i32(1);
  int32_t* token = be->alloc_i32(1);
  int32_t* record = be->alloc_i32(lily::TokenRecordLayout::kWords);
  std::printf("device: %s; vocab %lld; %d ops per graph, %d replays\n", be->device_name().c_str(),
              static_cast<long long>(kVocab), kOpsPerGraph, kReplays);

  struct Set {
    const char* name;
    SamplerParams params;
  };
  SamplerParams all = with(0.8f, 40, 0.9f, 0.02f);
  all.repetition_penalty = 1.1f;
  all.frequency_penalty = 0.3f;
  all.presence_penalty = 0.2f;
  all.bias_count = 64;
  for (int i = 0; i < 64; ++i) {
    all.bias_ids[static_cast<size_t>(i)] = i * 3001;
    all.bias_values[static_cast<size_t>(i)] = static_cast<float>(i % 9) - 4.0f;
  }
  const Set sets[] = {
      {"greedy (T=0)", with(0.0f, 0, 1.0f, 0.0f)},
      {"T=1", with(1.0f, 0, 1.0f, 0.0f)},
      {"T=1 top_k=20 top_p=0.95", with(1.0f, 20, 0.95f, 0.0f)},
      {"T=0.7 top_k=20 top_p=0.8", with(0.7f, 20, 0.8f, 0.0f)},
      {"T=1 top_p=0.95", with(1.0f, 0, 0.95f, 0.0f)},
      {"T=0.7 top_p=0.9", with(0.7f, 0, 0.9f, 0.0f)},
      {"T=1 min_p=0.05", with(1.0f, 0, 1.0f, 0.05f)},
      {"T=1 top_k=5000", with(1.0f, 5000, 1.0f, 0.0f)},
      {"T=1 top_k=5000 top_p=0.95", with(1.0f, 5000, 0.95f, 0.0f)},
      {"all stages (T=0.8 k=40 p=0.9 min_p=0.02 penalties, 64 biases)", all},
  };
  std::vector<bool> wanted(std::size(sets), argc <= 1);
  for (int i = 1; i < argc; ++i) {
    const auto at = static_cast<size_t>(std::atoi(argv[i]));
    if (at < wanted.size()) wanted[at] = true;
  }
  for (size_t at = 0; at < std::size(sets); ++at) {
    if (!wanted[at]) continue;
    const Set& set = sets[at];
    std::vector<int32_t> words(static_cast<size_t>(lily::kSamplerParamWords));
    std::memcpy(words.data(), static_cast<const void*>(&set.params), sizeof set.params);
    be->copy_from_host(words.data(), words.size(), buf.params);
    be->sample(logits, kVocab, buf, token);  // eager: sizes the scratch
    be->synchronize();
    be->begin_capture();
    for (int i = 0; i < kOpsPerGraph; ++i) be->sample(logits, kVocab, buf, token);
    const int graph = be->end_capture();
    std::printf("sample %-62s %7.2f us\n", set.name, time_graph(*be, graph));
  }
  if (argc > 1) return 0;
  be->token_logprobs(logits, kVocab, token, buf, record);
  be->begin_capture();
  for (int i = 0; i < kOpsPerGraph; ++i) be->token_logprobs(logits, kVocab, token, buf, record);
  const int graph = be->end_capture();
  std::printf("token_logprobs top_logprobs=20 %47s %7.2f us\n", "", time_graph(*be, graph));
  be->argmax(logits, 1, kVocab, token);  // eager: sizes its workspace
  be->synchronize();
  be->begin_capture();
  for (int i = 0; i < kOpsPerGraph; ++i) be->argmax(logits, 1, kVocab, token);
  const int argmax_graph = be->end_capture();
  std::printf("argmax (for comparison) %54s %7.2f us\n", "", time_graph(*be, argmax_graph));
  return 0;
}

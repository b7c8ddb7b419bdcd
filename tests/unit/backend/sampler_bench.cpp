// Google Benchmark of the CPU sampler ops on the production vocabulary (248,320 ids; not a test);
// the argument is the thread count.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/thread_pool.h"
#include "backend_test_support.h"

namespace lily::testing {
namespace {

constexpr int64_t kVocab = 248'320;

// LLM-like logits: a normal bulk (sigma 2.5) and a head of a few ids 8-14 above it.
std::vector<float> bench_logits() {
  Rng rng(99);
  std::vector<float> l(kVocab);
  for (float& v : l) {
    const double u1 = static_cast<double>(rng.uniform(1e-7f, 1.0f));
    const double u2 = static_cast<double>(rng.uniform(0.0f, 1.0f));
    v = 2.5f * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  for (int i = 0; i < 40; ++i) l[static_cast<size_t>(rng.below(kVocab))] = rng.uniform(8.0f, 14.0f);
  return l;
}

void run(benchmark::State& state, SamplerParams params) {
  const std::vector<float> logits = bench_logits();
  std::vector<int32_t> counts(kVocab, 0);
  std::vector<int32_t> seen(kVocab, 0);
  for (int i = 0; i < 300; ++i) {
    counts[static_cast<size_t>(i * 811 % kVocab)] = 1 + i % 3;
    seen[static_cast<size_t>(i * 613 % kVocab)] = 1;
  }
  cpu::SamplerWork work;
  ThreadPool pool(static_cast<int>(state.range(0)));
  uint32_t step = 0;
  for (auto _ : state) {
    params.seed_lo = step;
    benchmark::DoNotOptimize(cpu::sample_row(logits.data(), kVocab, params, counts.data(),
                                             seen.data(), step++, work, nullptr,
                                             cpu::SamplerPath::automatic, &pool));
  }
}

SamplerParams with(float t, int32_t k, float top_p, float min_p) {
  SamplerParams p;
  p.temperature = t;
  p.top_k = k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

void BM_SampleGreedy(benchmark::State& s) { run(s, with(0.0f, 0, 1.0f, 0.0f)); }
void BM_SampleT1(benchmark::State& s) { run(s, with(1.0f, 0, 1.0f, 0.0f)); }
void BM_SampleT1TopK20TopP095(benchmark::State& s) { run(s, with(1.0f, 20, 0.95f, 0.0f)); }
void BM_SampleTopP095(benchmark::State& s) { run(s, with(1.0f, 0, 0.95f, 0.0f)); }
void BM_SampleMinP005(benchmark::State& s) { run(s, with(1.0f, 0, 1.0f, 0.05f)); }
void BM_SampleTopK5000(benchmark::State& s) { run(s, with(1.0f, 5000, 1.0f, 0.0f)); }
void BM_SampleAllStages(benchmark::State& s) {
  SamplerParams p = with(0.8f, 40, 0.9f, 0.02f);
  p.repetition_penalty = 1.1f;
  p.frequency_penalty = 0.3f;
  p.presence_penalty = 0.2f;
  p.bias_count = 64;
  for (int i = 0; i < 64; ++i) {
    p.bias_ids[static_cast<size_t>(i)] = i * 3001;
    p.bias_values[static_cast<size_t>(i)] = static_cast<float>(i % 9) - 4.0f;
  }
  run(s, p);
}

void BM_TokenLogprobs20(benchmark::State& state) {
  const std::vector<float> logits = bench_logits();
  cpu::SamplerWork work;
  ThreadPool pool(static_cast<int>(state.range(0)));
  int32_t record[TokenRecordLayout::kWords];
  for (auto _ : state) {
    cpu::token_logprobs_row(logits.data(), kVocab, 7, 20, work, record, &pool);
    benchmark::DoNotOptimize(record[1]);
  }
}

BENCHMARK(BM_SampleGreedy)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);  // threads
BENCHMARK(BM_SampleT1)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);  // threads
BENCHMARK(BM_SampleT1TopK20TopP095)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);  // threads
BENCHMARK(BM_SampleTopP095)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);  // threads
BENCHMARK(BM_SampleMinP005)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);  // threads
BENCHMARK(BM_SampleTopK5000)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);  // threads
BENCHMARK(BM_SampleAllStages)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);  // threads
BENCHMARK(BM_TokenLogprobs20)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);  // threads

}  // namespace
}  // namespace lily::testing

BENCHMARK_MAIN();

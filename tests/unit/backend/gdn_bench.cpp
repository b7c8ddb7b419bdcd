// Google Benchmark of the CPU Gated DeltaNet ops at the model's shape (not a test): the conv of
// one token (decode's own loop) against the general loop's cost per token (two-token calls),
// and the one-token delta rule; the argument is the thread count.
#include <benchmark/benchmark.h>

#include <vector>

#include "backend_test_support.h"

namespace lily::testing {
namespace {

// The model's Gated DeltaNet layers: 16 key heads, 32 value heads, 128 x 128, conv kernel 4
// (8,192 conv channels).
const GatedDeltaNetDims kDims{16, 32, 128, 128, 4};

void run_conv(benchmark::State& state, int64_t n) {
  Rng rng(5);
  auto be = cpu(static_cast<int>(state.range(0)));
  const int64_t C = kDims.channels();
  const DenseTensor weight(DType::BF16,
                           {static_cast<uint64_t>(C), static_cast<uint64_t>(kDims.conv_kernel), 1},
                           rng.uniform_vector(static_cast<size_t>(C * kDims.conv_kernel), -0.6f, 0.6f),
                           "conv1d");
  std::vector<float> window = rng.uniform_vector(static_cast<size_t>((kDims.conv_kernel - 1) * C), -2.0f, 2.0f);
  const std::vector<float> mixed = rng.uniform_vector(static_cast<size_t>(n * C), -2.0f, 2.0f);
  std::vector<float> out(mixed.size());
  for (auto _ : state) {
    be->conv1d_silu(mixed.data(), window.data(), weight.view(), kDims, n, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);  // tokens: compare items/s across n
}

void BM_ConvOneToken(benchmark::State& s) { run_conv(s, 1); }
void BM_ConvTwoTokens(benchmark::State& s) { run_conv(s, 2); }

void BM_DeltaRuleOneToken(benchmark::State& state) {
  Rng rng(6);
  auto be = cpu(static_cast<int>(state.range(0)));
  const int64_t Hv = kDims.value_heads;
  const std::vector<float> conv = rng.uniform_vector(static_cast<size_t>(kDims.channels()), -0.28f, 2.0f);
  const std::vector<float> a = rng.uniform_vector(static_cast<size_t>(Hv), -3.0f, 3.0f);
  const std::vector<float> b = rng.uniform_vector(static_cast<size_t>(Hv), -4.0f, 4.0f);
  const DenseTensor a_log(DType::F32, {static_cast<uint64_t>(Hv)}, rng.uniform_vector(static_cast<size_t>(Hv), -1.0f, 1.0f), "A_log");
  const DenseTensor dt_bias(DType::F32, {static_cast<uint64_t>(Hv)}, rng.uniform_vector(static_cast<size_t>(Hv), -1.0f, 1.0f), "dt_bias");
  std::vector<float> state_buf = rng.uniform_vector(static_cast<size_t>(Hv * kDims.key_dim * kDims.value_dim), -0.1f, 0.1f);
  std::vector<float> out(static_cast<size_t>(Hv * kDims.value_dim));
  for (auto _ : state) {
    be->gated_delta_rule(conv.data(), a.data(), b.data(), a_log.view(), dt_bias.view(), state_buf.data(),
                         kDims, 1, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_ConvOneToken)->Arg(1)->Arg(2);
BENCHMARK(BM_ConvTwoTokens)->Arg(1)->Arg(2);
BENCHMARK(BM_DeltaRuleOneToken)->Arg(1)->Arg(2);

}  // namespace
}  // namespace lily::testing

BENCHMARK_MAIN();

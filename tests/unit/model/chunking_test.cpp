// Chunked prefill == one-shot prefill == token-by-token decode; continuing a state == prefilling
// the concatenation; fed-token accounting of the generator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/bf16.h"
#include "engine/generator.h"
#include "model/qwen36_model.h"
#include "tiny_model_fixture.h"

namespace lily {
namespace {

std::vector<int32_t> prompt_of(size_t n) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 2654435761u) % 4063u);
  return ids;
}

struct ModelRun {
  std::vector<float> logits;
  std::vector<std::vector<float>> state;  // every state buffer, host copy
};

ModelRun run_model(const std::vector<int32_t>& ids, int64_t chunk, const std::vector<size_t>& splits,
                   CpuPrecision precision = CpuPrecision::exact, KvDtype kv = KvDtype::f32) {
  const Checkpoint& checkpoint = testing::tiny_checkpoint(5);
  std::unique_ptr<Backend> backend = make_cpu_backend(0, precision);
  Qwen36Model model(checkpoint, *backend, chunk);
  DecodeState state(*backend, checkpoint.config.shape, 256, kv);
  size_t begin = 0;
  for (size_t end : splits) {
    model.forward(state, std::span<const int32_t>(ids.data() + begin, end - begin));
    begin = end;
  }
  ModelRun result;
  model.logits_to_host(result.logits);
  for (size_t b = 0; b < state.buffers.size(); ++b) {
    std::vector<float> host(state.sizes[b]);
    backend->copy_to_host(state.buffers[b], host.size(), host.data());
    result.state.push_back(std::move(host));
  }
  for (size_t i = 0; i < state.attention.size(); ++i) {
    if (state.kinds[i] != LayerKind::full_attention) continue;
    for (const KvCacheView& cache : {state.attention[i].keys, state.attention[i].values}) {
      std::vector<float> host(state.kv_elements);
      if (cache.dtype == KvDtype::bf16) {
        std::vector<uint16_t> bits(state.kv_elements);
        backend->copy_kv_to_host(cache, bits.size(), bits.data());
        for (size_t e = 0; e < bits.size(); ++e) host[e] = bf16_to_f32(bits[e]);
      } else {
        backend->copy_kv_to_host(cache, host.size(), host.data());
      }
      result.state.push_back(std::move(host));
    }
  }
  return result;
}

// Max |a - b| / max(1, |b|) over the logits and every state buffer.
double max_difference(const ModelRun& a, const ModelRun& b) {
  double worst = 0;
  auto compare = [&](const std::vector<float>& x, const std::vector<float>& y) {
    EXPECT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(x[i]) - static_cast<double>(y[i])) /
                                  std::max(1.0, std::abs(static_cast<double>(y[i]))));
    }
  };
  compare(a.logits, b.logits);
  for (size_t i = 0; i < a.state.size(); ++i) compare(a.state[i], b.state[i]);
  return worst;
}

TEST(Chunking, ChunkedAndTokenByTokenEqualOneShotPrefill) {
  const std::vector<int32_t> ids = prompt_of(70);
  const ModelRun one_shot = run_model(ids, 256, {70});
  const ModelRun chunked = run_model(ids, 16, {70});  // 16 + 16 + 16 + 16 + 6: crosses chunk boundaries
  std::vector<size_t> every(70);
  std::iota(every.begin(), every.end(), 1);
  const ModelRun token_by_token = run_model(ids, 256, every);
  EXPECT_LT(max_difference(chunked, one_shot), 1e-4);
  EXPECT_LT(max_difference(token_by_token, one_shot), 1e-4);
  // And the comparison can fail: a different prompt gives clearly different logits.
  std::vector<int32_t> other = ids;
  other[3] += 1;
  EXPECT_GT(max_difference(run_model(other, 256, {70}), one_shot), 1e-2);
}

// --cpu-precision fast: the prefill's products run on the same int8 dots as decode's (bit for
// bit per op), so prefilling and decoding the prompt agree as in the exact path. Before the
// int8 prefill they differed by the fast path's own error, which this also bounds from below.
// --cpu-precision q8 (one activation plane) the same, and its runs differ from fast's.
void int8_prefill_equals_token_by_token(CpuPrecision precision) {
  const std::vector<int32_t> ids = prompt_of(70);
  const ModelRun one_shot = run_model(ids, 256, {70}, precision);
  const ModelRun chunked = run_model(ids, 16, {70}, precision);
  std::vector<size_t> every(70);
  std::iota(every.begin(), every.end(), 1);
  const ModelRun token_by_token = run_model(ids, 256, every, precision);
  EXPECT_LT(max_difference(chunked, one_shot), 1e-4);
  EXPECT_LT(max_difference(token_by_token, one_shot), 1e-4);
  // The run is quantised: it differs from the exact one.
  EXPECT_GT(max_difference(one_shot, run_model(ids, 256, {70})), 1e-4);
  if (precision == CpuPrecision::q8) {  // and one plane is not two
    EXPECT_GT(max_difference(one_shot, run_model(ids, 256, {70}, CpuPrecision::fast)), 1e-3);
  }
}

TEST(Chunking, FastPrefillEqualsFastTokenByToken) {
  int8_prefill_equals_token_by_token(CpuPrecision::fast);
}

TEST(Chunking, Q8PrefillEqualsQ8TokenByToken) {
  int8_prefill_equals_token_by_token(CpuPrecision::q8);
}

// --kv-cache bf16: chunked and token-by-token prefill agree with one shot as closely as the
// f32 cache's runs do, except where a key or value lands near the midpoint of two bf16 values
// and the runs' ~1e-7 differences round it to neighbours 2^-8 apart (relative): the logits are
// held to 1e-3 (they move by 1e-4 or less, docs/precision.md), the caches themselves not
// compared. And the bf16 run differs from the f32 one (its cache holds rounded values).
double max_logit_difference(const ModelRun& a, const ModelRun& b) {
  ModelRun x{a.logits, {}};
  ModelRun y{b.logits, {}};
  return max_difference(x, y);
}

TEST(Chunking, Bf16CacheChunkedAndTokenByTokenAgreeWithOneShot) {
  const std::vector<int32_t> ids = prompt_of(70);
  const ModelRun one_shot = run_model(ids, 256, {70}, CpuPrecision::exact, KvDtype::bf16);
  const ModelRun chunked = run_model(ids, 16, {70}, CpuPrecision::exact, KvDtype::bf16);
  std::vector<size_t> every(70);
  std::iota(every.begin(), every.end(), 1);
  const ModelRun token_by_token = run_model(ids, 256, every, CpuPrecision::exact, KvDtype::bf16);
  const double chunked_diff = max_logit_difference(chunked, one_shot);
  const double token_diff = max_logit_difference(token_by_token, one_shot);
  const double vs_f32 = max_logit_difference(one_shot, run_model(ids, 256, {70}));
  std::printf("[bf16 kv] 70-token prompt, logits: chunked vs one shot %.3g, token by token vs one "
              "shot %.3g, bf16 vs f32 cache %.3g\n",
              chunked_diff, token_diff, vs_f32);
  EXPECT_LT(chunked_diff, 1e-3);
  EXPECT_LT(token_diff, 1e-3);
  EXPECT_GT(vs_f32, 1e-6);
}

TEST(Chunking, ContinuingAStateEqualsPrefillingTheConcatenation) {
  const std::vector<int32_t> ids = prompt_of(50);
  const ModelRun whole = run_model(ids, 256, {50});
  const ModelRun continued = run_model(ids, 256, {17, 33, 50});
  EXPECT_LT(max_difference(continued, whole), 1e-4);
}

TEST(Generation, FedTokenAccountingFollowsLily) {
  const Checkpoint& checkpoint = testing::tiny_checkpoint(5);
  std::unique_ptr<Backend> backend = make_cpu_backend(0);
  Qwen36Model model(checkpoint, *backend);
  const std::vector<int32_t> prompt = prompt_of(12);

  // Length limit: the last token is not fed.
  DecodeState state(*backend, checkpoint.config.shape, 64);
  GenerationOptions options;
  options.max_tokens = 5;
  GenerationResult result = generate(model, state, prompt, options);
  EXPECT_EQ(result.finish_reason, "length");
  EXPECT_EQ(result.tokens.size(), 5u);
  EXPECT_EQ(result.fed, 4);
  EXPECT_EQ(state.position, 12 + 4);

  // Stop on token i >= 1: tokens 0..i are all fed.
  state.reset(*backend);
  options.max_tokens = 20;
  options.stop_tokens = {result.tokens[2]};
  GenerationResult stopped = generate(model, state, prompt, options);
  ASSERT_EQ(stopped.finish_reason, "stop");
  const auto first_stop = static_cast<int64_t>(stopped.tokens.size());
  EXPECT_EQ(stopped.fed, first_stop);
  EXPECT_EQ(state.position, 12 + first_stop);

  // Stop on token 0: nothing generated is fed.
  state.reset(*backend);
  options.stop_tokens = {result.tokens[0]};
  GenerationResult immediate = generate(model, state, prompt, options);
  EXPECT_EQ(immediate.tokens.size(), 1u);
  EXPECT_EQ(immediate.fed, 0);
  EXPECT_EQ(state.position, 12);
}

}  // namespace
}  // namespace lily

namespace lily {
namespace {

// The memory check of --device cuda (cli/backend_choice.cpp) sizes states with
// DecodeState::bytes: it must count exactly what the constructor allocates.
TEST(DecodeStateBytes, CountsEveryBufferTheConstructorAllocates) {
  const Checkpoint& checkpoint = testing::tiny_checkpoint(1);
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const ModelShape& shape = checkpoint.config.shape;
  for (int64_t capacity : {1, 37, 4096}) {
    DecodeState state(*backend, shape, capacity);
    EXPECT_EQ(state.kv_dtype, KvDtype::f32);
    EXPECT_EQ(state.kv_elements,
              static_cast<size_t>(capacity) * shape.num_key_value_heads * shape.head_dim);
    uint64_t floats = 0;
    for (size_t size : state.sizes) floats += size;
    uint64_t kv_buffers = 0;
    for (LayerKind kind : state.kinds) kv_buffers += kind == LayerKind::full_attention ? 2 : 0;
    const uint64_t kv_elements = kv_buffers * state.kv_elements;
    EXPECT_EQ(DecodeState::bytes(shape, capacity, KvDtype::f32),
              floats * sizeof(float) + kv_elements * 4 + sizeof(int32_t))
        << "capacity " << capacity;
    // A bf16 cache holds the same elements in 2 bytes each; the rest is unchanged.
    EXPECT_EQ(DecodeState::bytes(shape, capacity, KvDtype::bf16),
              floats * sizeof(float) + kv_elements * 2 + sizeof(int32_t))
        << "capacity " << capacity;
    EXPECT_EQ(DecodeState::kv_bytes_per_token(shape, KvDtype::bf16) * 2,
              DecodeState::kv_bytes_per_token(shape, KvDtype::f32));
    EXPECT_EQ(DecodeState::kv_bytes_per_token(shape, KvDtype::f32) * static_cast<uint64_t>(capacity),
              kv_elements * 4);
  }
  // Production shape: 10 attention layers x K and V x 2 heads x 256 dims = 40 KiB per token
  // in f32, 20 KiB in bf16 (docs/cuda.md).
  EXPECT_EQ(DecodeState::kv_bytes_per_token(ModelShape::production(), KvDtype::f32), 40960u);
  EXPECT_EQ(DecodeState::kv_bytes_per_token(ModelShape::production(), KvDtype::bf16), 20480u);
  // int8: 1 byte a value plus an f32 scale per (token, kv head) row of 256: 10 x 2 x 2 x (256 + 4).
  EXPECT_EQ(DecodeState::kv_bytes_per_token(ModelShape::production(), KvDtype::int8), 10400u);
}

// The CPU backend serves both dtypes: a bf16 state's caches are bf16, and the backend holds
// exactly DecodeState::bytes for it, 2 bytes per KV element; an int8 state's caches are int8,
// 1 byte per element plus a 4-byte scale per row of head_dim.
TEST(DecodeStateBytes, TheCpuBackendAllocatesABf16CacheAtTwoBytesAnElement) {
  const Checkpoint& checkpoint = testing::tiny_checkpoint(1);
  const ModelShape& shape = checkpoint.config.shape;
  for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16, KvDtype::int8}) {
    std::unique_ptr<Backend> backend = make_cpu_backend(1);
    EXPECT_TRUE(backend->serves_kv_cache(dtype));
    const uint64_t before = backend->allocated_bytes();
    DecodeState state(*backend, shape, 37, dtype);
    EXPECT_EQ(state.kv_dtype, dtype);
    EXPECT_EQ(backend->allocated_bytes() - before, DecodeState::bytes(shape, 37, dtype))
        << kv_dtype_name(dtype);
    for (size_t i = 0; i < state.attention.size(); ++i) {
      if (state.kinds[i] != LayerKind::full_attention) continue;
      EXPECT_EQ(state.attention[i].keys.dtype, dtype);
      EXPECT_EQ(state.attention[i].values.dtype, dtype);
    }
  }
}

// A backend that does not serve a dtype: the state is refused, naming the backend and the dtype.
class F32OnlyCpu : public CpuBackend {
 public:
  F32OnlyCpu() : CpuBackend(1) {}
  bool serves_kv_cache(KvDtype dtype) const override { return dtype == KvDtype::f32; }
};

TEST(DecodeStateBytes, ABackendThatDoesNotServeTheDtypeRefusesTheState) {
  const Checkpoint& checkpoint = testing::tiny_checkpoint(1);
  F32OnlyCpu backend;
  try {
    DecodeState state(backend, checkpoint.config.shape, 16, KvDtype::bf16);
    ADD_FAILURE() << "a bf16 KV cache was accepted by a backend that does not serve it";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the cpu backend does not serve a bf16 KV cache"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lily

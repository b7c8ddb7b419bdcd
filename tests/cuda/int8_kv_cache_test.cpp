// The int8 KV cache on CUDA: the stored codes and scales against the CPU's quantiser, attention against a float64 reference over the stored rows and against the f32 cache, the tensor-core decode path, and the model with it.
//
// Tolerances (docs/precision.md, *The int8 KV cache*):
//  * stored rows: bit for bit quantize_kv_row's (backend.h), the same f32 operations;
//  * against the float64 reference computed from the stored codes and scales: kTol = 1e-5
//    normalised for the prefill and the CUDA-core decode (code * scale widened in f32, then the
//    f32 path); kTensorCoreTol = 5e-5 for the tensor-core decode of the model's shape, whose
//    scores take q in two int8 planes (about 2^-15 of each head's max |q|) and whose value sum
//    takes each weight times its row's scale as bf16 hi + lo;
//  * against the f32 cache on the same inputs: below kInt8VsF32 = 3e-2 (each value moves by up
//    to max |x| / 254 of its row) and above kInt8Floor = 1e-5 (a cache that silently keeps f32
//    fails).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "bench/workload.h"
#include "cuda_test_support.h"
#include "engine/generator.h"
#include "model/decode_state.h"
#include "model/qwen36_model.h"
#include "ref/reference_ops.h"
#include "tiny_model_fixture.h"

namespace lily::testing {
namespace {

constexpr double kTol = 1e-5;
constexpr double kTensorCoreTol = 5e-5;
constexpr double kInt8VsF32 = 3e-2;
constexpr double kInt8Floor = 1e-5;

std::string dims_label(const AttentionDims& d) {
  return "Hq=" + std::to_string(d.q_heads) + " Hkv=" + std::to_string(d.kv_heads) +
         " D=" + std::to_string(d.head_dim);
}

bool same_float_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

// Random rows, each of its own magnitude (so each has its own scale).
std::vector<float> random_rows(Rng& rng, size_t rows, int64_t head_dim, float range) {
  std::vector<float> x = rng.uniform_vector(rows * static_cast<size_t>(head_dim), -range, range);
  for (size_t r = 0; r < rows; ++r) {
    const float m = 0.25f + static_cast<float>(r % 7) * 0.5f;
    for (int64_t i = 0; i < head_dim; ++i) x[r * static_cast<size_t>(head_dim) + static_cast<size_t>(i)] *= m;
  }
  return x;
}

// CUDA attention over an int8 cache and over an f32 cache on the same inputs, and the float64
// reference over the stored rows. Checks both outputs, the stored rows and which path ran.
class Int8AttentionRunner {
 public:
  Int8AttentionRunner(const AttentionDims& dims, int64_t capacity, Backend& cuda)
      : dims_(dims), capacity_(capacity), cuda_(cuda),
        elements_(static_cast<size_t>(capacity * dims.kv_heads * dims.head_dim)) {
    k8_ = cuda_.alloc_kv_cache(elements_, KvDtype::int8, dims.head_dim);
    v8_ = cuda_.alloc_kv_cache(elements_, KvDtype::int8, dims.head_dim);
    EXPECT_EQ(k8_.dtype, KvDtype::int8);
    // Scales NaN: a row read before it is written reaches the output.
    const Int8KvImage poison{std::vector<int8_t>(elements_, 0),
                           std::vector<float>(rows_total(), std::numeric_limits<float>::quiet_NaN())};
    write_int8_kv(cuda_, k8_, poison);
    write_int8_kv(cuda_, v8_, poison);
    k32_ = cuda_.alloc(elements_);
    v32_ = cuda_.alloc(elements_);
    pos_ = to_device(cuda_, std::vector<int32_t>{0});
    ref_k_.assign(elements_, 0.0);
    ref_v_.assign(elements_, 0.0);
  }

  size_t row() const { return static_cast<size_t>(dims_.kv_heads * dims_.head_dim); }
  size_t rows_total() const { return elements_ / static_cast<size_t>(dims_.head_dim); }

  // Rows 0..rows-1 quantised on the host and written straight into the caches.
  void fill(Rng& rng, int64_t rows) {
    const int64_t D = dims_.head_dim;
    const size_t heads_rows = static_cast<size_t>(rows * dims_.kv_heads);
    const std::vector<float> k = random_rows(rng, heads_rows, D, 1.0f);
    const std::vector<float> v = random_rows(rng, heads_rows, D, 2.0f);
    Int8KvImage ki{std::vector<int8_t>(elements_, 0), std::vector<float>(rows_total(), NAN)};
    Int8KvImage vi = ki;
    for (size_t r = 0; r < heads_rows; ++r) {
      const size_t at = r * static_cast<size_t>(D);
      ki.scales[r] = quantize_kv_row(k.data() + at, D, ki.codes.data() + at);
      vi.scales[r] = quantize_kv_row(v.data() + at, D, vi.codes.data() + at);
      for (int64_t i = 0; i < D; ++i) {
        ref_k_[at + static_cast<size_t>(i)] = static_cast<double>(ki.codes[at + static_cast<size_t>(i)]) * static_cast<double>(ki.scales[r]);
        ref_v_[at + static_cast<size_t>(i)] = static_cast<double>(vi.codes[at + static_cast<size_t>(i)]) * static_cast<double>(vi.scales[r]);
      }
    }
    write_int8_kv(cuda_, k8_, ki);
    write_int8_kv(cuda_, v8_, vi);
    cuda_.copy_from_host(k.data(), k.size(), k32_);
    cuda_.copy_from_host(v.data(), v.size(), v32_);
  }

  void step(Rng& rng, int64_t start_pos, int64_t n, const std::string& what, bool device_pos) {
    const int64_t D = dims_.head_dim;
    const std::vector<float> qg =
        rng.uniform_vector(static_cast<size_t>(n * dims_.q_heads * 2 * D), -1.0f, 1.0f);
    const std::vector<float> k = random_rows(rng, static_cast<size_t>(n * dims_.kv_heads), D, 1.0f);
    const std::vector<float> v = random_rows(rng, static_cast<size_t>(n * dims_.kv_heads), D, 2.0f);
    float* dqg = to_device(cuda_, qg);
    float* dk = to_device(cuda_, k);
    float* dv = to_device(cuda_, v);
    const auto out_size = static_cast<size_t>(n * dims_.q_heads * D);
    float* out8 = to_device(cuda_, std::vector<float>(out_size, 1e30f));
    float* out32 = to_device(cuda_, std::vector<float>(out_size, 1e30f));
    SeqPos pos(start_pos);
    if (device_pos) {
      const auto p = static_cast<int32_t>(start_pos);
      cuda_.copy_from_host(&p, 1, pos_);
      pos = SeqPos(0, pos_);  // the host hint is ignored by contract
    }
    const uint64_t tc_before = path_counts(cuda_).int8_tensor_core_decode_attention;
    cuda_.attention(dqg, dk, dv, k8_, v8_, capacity_, dims_, pos, n, out8);
    // The model's shape decodes on tensor cores (int8 MMAs) on every supported device.
    const bool model_shape = D == 256 && dims_.q_heads == 8 * dims_.kv_heads;
    const bool tensor_cores = n == 1 && model_shape;
    EXPECT_EQ(path_counts(cuda_).int8_tensor_core_decode_attention - tc_before, tensor_cores ? 1u : 0u)
        << dims_label(dims_) << " n=" << n;
    cuda_.attention(dqg, dk, dv, k32_, v32_, capacity_, dims_, pos, n, out32);
    const std::vector<float> got = to_host(cuda_, out8, out_size);
    const std::vector<float> f32 = to_host(cuda_, out32, out_size);
    const std::string label = dims_label(dims_) + " cap=" + std::to_string(capacity_) + " " + what +
                              (device_pos ? " (device pos)" : "");

    // The new rows: quantize_kv_row's codes and scale, bit for bit; later rows untouched.
    const Int8KvImage kh = read_int8_kv(cuda_, k8_, elements_, D);
    const Int8KvImage vh = read_int8_kv(cuda_, v8_, elements_, D);
    std::vector<double> k_stored(k.size()), v_stored(v.size());
    std::vector<int8_t> want(static_cast<size_t>(D));
    for (size_t r = 0; r < k.size() / static_cast<size_t>(D); ++r) {
      const size_t at = static_cast<size_t>(start_pos * dims_.kv_heads) + r;
      const size_t e = at * static_cast<size_t>(D);
      const float ks = quantize_kv_row(k.data() + r * static_cast<size_t>(D), D, want.data());
      ASSERT_TRUE(same_float_bits(kh.scales[at], ks)) << label << " k scale of row " << at;
      ASSERT_TRUE(std::equal(want.begin(), want.end(), kh.codes.begin() + static_cast<long>(e))) << label << " k row " << at;
      const float vs = quantize_kv_row(v.data() + r * static_cast<size_t>(D), D, want.data());
      ASSERT_TRUE(same_float_bits(vh.scales[at], vs)) << label << " v scale of row " << at;
      ASSERT_TRUE(std::equal(want.begin(), want.end(), vh.codes.begin() + static_cast<long>(e))) << label << " v row " << at;
      for (int64_t i = 0; i < D; ++i) {
        const size_t j = r * static_cast<size_t>(D) + static_cast<size_t>(i);
        k_stored[j] = static_cast<double>(kh.codes[e + static_cast<size_t>(i)]) * static_cast<double>(kh.scales[at]);
        v_stored[j] = static_cast<double>(vh.codes[e + static_cast<size_t>(i)]) * static_cast<double>(vh.scales[at]);
      }
    }
    for (size_t r = static_cast<size_t>((start_pos + n) * dims_.kv_heads); r < rows_total(); ++r) {
      ASSERT_TRUE(std::isnan(kh.scales[r]) && std::isnan(vh.scales[r])) << label << " row " << r << " written";
    }
    const std::vector<double> wanted = ref::attention(ref::widen(qg), k_stored, v_stored, ref_k_, ref_v_,
                                                      capacity_, dims_, start_pos, n);
    const ErrorFigures f = report("cuda attention int8 cache", label + " vs f64 ref over the stored rows", got, wanted);
    EXPECT_LT(f.normalised, tensor_cores ? kTensorCoreTol : kTol) << label;
    const ErrorFigures fc = report("cuda attention int8 cache", label + " vs f32 cache", got, ref::widen(f32));
    EXPECT_LT(fc.normalised, kInt8VsF32) << label;
    EXPECT_GT(fc.normalised, kInt8Floor) << label << ": the int8 cache reads like an f32 one";
    worst_ref_ = std::max(worst_ref_, f.normalised);
    worst_vs_f32_ = std::max(worst_vs_f32_, fc.normalised);
  }

  double worst_ref() const { return worst_ref_; }
  double worst_vs_f32() const { return worst_vs_f32_; }

 private:
  AttentionDims dims_;
  int64_t capacity_;
  Backend& cuda_;
  size_t elements_;
  KvCacheView k8_, v8_;
  float* k32_ = nullptr;
  float* v32_ = nullptr;
  int32_t* pos_ = nullptr;
  std::vector<double> ref_k_, ref_v_;
  double worst_ref_ = 0;
  double worst_vs_f32_ = 0;
};

TEST(CudaInt8KvCache, DecodeAndPrefillMatchTheReferenceOverTheStoredRows) {
  // Head dims 64/128/256 (int8 loads of 2, 4 and 8 codes), query groups of 2, 8 and 3, and the
  // model's shape (the tensor-core decode); decode with device and host positions across split
  // and tile boundaries, prefill chunks from 0 and after others.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(191);
  for (const AttentionDims& d :
       {AttentionDims{4, 2, 64, 16, 1e7}, AttentionDims{4, 2, 256, 64, 1e7},
        AttentionDims{8, 1, 64, 16, 1e7}, AttentionDims{6, 2, 128, 32, 1e7},
        AttentionDims{16, 2, 256, 64, 1e7}}) {
    Int8AttentionRunner r(d, 2048, *be);
    r.step(rng, 0, 1, "decode pos=0", true);  // one key
    r.step(rng, 1, 1, "decode pos=1", true);
    r.step(rng, 2, 253, "prefill n=253 pos=2", false);
    r.step(rng, 255, 1, "decode pos=255", true);
    r.step(rng, 256, 1, "decode pos=256 (host pos)", false);
    r.step(rng, 257, 17, "prefill n=17 pos=257", false);
    r.step(rng, 274, 1, "decode pos=274", true);
    r.step(rng, 275, 300, "prefill n=300 pos=275", false);
    r.step(rng, 575, 1, "decode pos=575", true);
    std::printf("[cuda] int8 cache %s: worst %.3g vs the float64 reference, worst %.3g from the f32 cache\n",
                dims_label(d).c_str(), r.worst_ref(), r.worst_vs_f32());
  }
}

TEST(CudaInt8KvCache, LongHistory) {
  // Histories written straight into the caches; decode and a prefill at the far end, where the
  // split-K grid (sized from the capacity) is fully used; the model's shape at 131,072.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(192);
  {
    Int8AttentionRunner r(AttentionDims{4, 2, 64, 16, 1e7}, 100010, *be);
    r.fill(rng, 100000);
    r.step(rng, 100000, 1, "decode pos=100000", true);
    r.step(rng, 100001, 8, "prefill n=8 pos=100001", false);
  }
  {
    Int8AttentionRunner r(AttentionDims{16, 2, 256, 64, 1e7}, 131080, *be);
    r.fill(rng, 131072);
    r.step(rng, 131072, 1, "decode pos=131072", true);
    r.step(rng, 131073, 1, "decode pos=131073 (host pos)", false);
  }
}

TEST(CudaInt8KvCache, SpecialRowsAreStoredAsTheCpuStoresThem) {
  // An all-zero row (scale 0), rows with a NaN, +inf or -inf (scale NaN, codes 0), a huge and
  // a tiny row, and values exactly at code halves: the stored bits are the CPU quantiser's.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  for (const int64_t D : {64, 128, 256}) {
    const AttentionDims d{4, 2, D, 16, 1e7};
    const int64_t n = 4;
    const size_t rows = static_cast<size_t>(n * d.kv_heads);
    Rng rng(193);
    std::vector<float> k = random_rows(rng, rows, D, 1.0f);
    std::fill(k.begin(), k.begin() + D, 0.0f);                                  // row 0: zeros
    k[static_cast<size_t>(D) + 3] = std::numeric_limits<float>::quiet_NaN();   // row 1
    k[2 * static_cast<size_t>(D) + 5] = std::numeric_limits<float>::infinity();  // row 2
    for (int64_t i = 0; i < D; ++i) k[3 * static_cast<size_t>(D) + static_cast<size_t>(i)] *= 1e30f;  // row 3
    for (int64_t i = 0; i < D; ++i) k[4 * static_cast<size_t>(D) + static_cast<size_t>(i)] *= 1e-30f;  // row 4
    for (int64_t i = 0; i < D; ++i) {  // row 5: max 127, the others at halves of a code
      k[5 * static_cast<size_t>(D) + static_cast<size_t>(i)] = i == 0 ? 127.0f : static_cast<float>(i % 50) + 0.5f;
    }
    k[6 * static_cast<size_t>(D)] = -std::numeric_limits<float>::infinity();  // row 6
    const std::vector<float> v = k;
    const size_t elements = 8 * static_cast<size_t>(d.kv_heads * D);
    const KvCacheView kc = be->alloc_kv_cache(elements, KvDtype::int8, D);
    const KvCacheView vc = be->alloc_kv_cache(elements, KvDtype::int8, D);
    float* dqg = to_device(*be, std::vector<float>(static_cast<size_t>(n * d.q_heads * 2 * D), 0.01f));
    float* dout = be->alloc(static_cast<size_t>(n * d.q_heads * D));
    be->attention(dqg, to_device(*be, k), to_device(*be, v), kc, vc, 8, d, 0, n, dout);
    const Int8KvImage got = read_int8_kv(*be, kc, elements, D);
    std::vector<int8_t> want(static_cast<size_t>(D));
    for (size_t r = 0; r < rows; ++r) {
      const float s = quantize_kv_row(k.data() + r * static_cast<size_t>(D), D, want.data());
      EXPECT_TRUE(same_float_bits(got.scales[r], s)) << "D=" << D << " row " << r << ": " << got.scales[r] << " vs " << s;
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.codes.begin() + static_cast<long>(r * static_cast<size_t>(D))))
          << "D=" << D << " row " << r;
    }
    EXPECT_EQ(got.scales[0], 0.0f);
    EXPECT_TRUE(std::isnan(got.scales[1]) && std::isnan(got.scales[2]) && std::isnan(got.scales[6]));
  }
}

// ---- the model with an int8 cache (tiny checkpoint) ----------------------------------------

std::vector<int32_t> prompt_of(size_t n) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 2654435761u) % 4063u);
  return ids;
}

std::vector<float> logits_after(Backend& be, const std::vector<int32_t>& ids, int64_t chunk,
                                const std::vector<size_t>& splits, KvDtype kv) {
  const Checkpoint& checkpoint = tiny_checkpoint(5);
  Qwen36Model model(checkpoint, be, chunk);
  DecodeState state(be, checkpoint.config.shape, 256, kv);
  EXPECT_EQ(state.kv_dtype, kv);
  size_t begin = 0;
  for (size_t end : splits) {
    model.forward(state, std::span<const int32_t>(ids.data() + begin, end - begin));
    begin = end;
  }
  std::vector<float> logits;
  model.logits_to_host(logits);
  return logits;
}

TEST(CudaInt8KvCache, ModelChunkedPrefillAndDecodeAgreeWithOneShotAndTheCpu) {
  // One prefill of 70 tokens, chunks of 16 and 70 single tokens (graph-replayed decode steps)
  // through CUDA with an int8 cache, against one shot, against the CPU's int8 cache, and
  // against the f32 cache. The kernels differ, so k and v differ in their last f32 bits before
  // quantising and a value near a code half may land one code apart: the runs agree to 1e-2
  // normalised over the logits, not bit for bit.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  const std::vector<int32_t> ids = prompt_of(70);
  const std::vector<float> one_shot = logits_after(*be, ids, 4096, {70}, KvDtype::int8);
  const std::vector<float> chunked = logits_after(*be, ids, 16, {70}, KvDtype::int8);
  std::vector<size_t> every(70);
  for (size_t i = 0; i < every.size(); ++i) every[i] = i + 1;
  const std::vector<float> token_by_token = logits_after(*be, ids, 4096, every, KvDtype::int8);
  auto host = cpu(2);
  const std::vector<float> on_cpu = logits_after(*host, ids, 256, {70}, KvDtype::int8);
  const std::vector<float> f32 = logits_after(*be, ids, 4096, {70}, KvDtype::f32);
  const double chunked_diff = compare_f32(chunked, one_shot).normalised;
  const double token_diff = compare_f32(token_by_token, one_shot).normalised;
  const double cpu_diff = compare_f32(one_shot, on_cpu).normalised;
  const double f32_diff = compare_f32(one_shot, f32).normalised;
  std::printf("[cuda] int8 cache, tiny model logits: chunked vs one-shot %.3g, token by token vs one-shot %.3g, "
              "CUDA vs CPU %.3g, int8 vs f32 cache %.3g\n",
              chunked_diff, token_diff, cpu_diff, f32_diff);
  EXPECT_LT(chunked_diff, 1e-2);
  EXPECT_LT(token_diff, 1e-2);
  EXPECT_LT(cpu_diff, 1e-2);
  EXPECT_GT(f32_diff, 1e-5) << "the int8 cache gives the f32 cache's logits";
}

TEST(CudaInt8KvCache, StateTakesAQuarterOfTheKvBytesPlusScales) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  const Checkpoint& checkpoint = tiny_checkpoint(5);
  const ModelShape& shape = checkpoint.config.shape;
  const uint64_t before = be->allocated_bytes();
  DecodeState f32(*be, shape, 4096, KvDtype::f32);
  const uint64_t f32_bytes = be->allocated_bytes() - before;
  DecodeState int8(*be, shape, 4096, KvDtype::int8);
  const uint64_t int8_bytes = be->allocated_bytes() - before - f32_bytes;
  const uint64_t kv_f32 = DecodeState::kv_bytes_per_token(shape, KvDtype::f32) * 4096;
  const uint64_t kv_int8 = DecodeState::kv_bytes_per_token(shape, KvDtype::int8) * 4096;
  EXPECT_EQ(kv_int8, kv_f32 / 4 + kv_f32 / 4 / shape.head_dim * 4);  // codes + one f32 per row
  EXPECT_GE(int8_bytes, DecodeState::bytes(shape, 4096, KvDtype::int8));
  EXPECT_LT(int8_bytes, DecodeState::bytes(shape, 4096, KvDtype::int8) + 256 * (int8.buffers.size() + 64));
  EXPECT_EQ(f32_bytes - int8_bytes, kv_f32 - kv_int8);
}

// The figures of docs/precision.md's int8 rows, on the full synthetic checkpoint
// (LILY_FULL_CHECKPOINT=dir): at contexts 256 and 4,096, the first-step logits with the int8
// cache against the f32 cache, and how many of 64 greedy tokens agree. Printed for the table;
// asserted: int8 did change the logits (above 1e-4) and by less than 1 normalised.
TEST(CudaInt8KvCache, FullCheckpointAgainstTheF32Cache) {
  const char* dir = std::getenv("LILY_FULL_CHECKPOINT");
  if (dir == nullptr || !std::filesystem::exists(std::string(dir) + "/config.json")) {
    GTEST_SKIP() << "set LILY_FULL_CHECKPOINT to a `lily make-checkpoint --profile full` directory";
  }
  LILY_CUDA_BACKEND_OR_SKIP(be);
  const std::unique_ptr<Checkpoint> checkpoint = open_checkpoint(dir);
  const ModelShape& shape = checkpoint->config.shape;
  Qwen36Model model(*checkpoint, *be, 4096);
  for (int64_t context : {256, 4096}) {
    const std::vector<int32_t> prompt = synthetic_prompt(context, shape.vocab_size);
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<int32_t>> tokens;
    for (KvDtype kv : {KvDtype::f32, KvDtype::int8}) {  // (bf16's arm: Bf16CacheFullCheckpointAgainstTheF32Cache)
      DecodeState state(*be, shape, context + 66, kv);
      model.forward(state, prompt);
      logits.emplace_back();
      model.logits_to_host(logits.back());
      state.reset(*be);
      GenerationOptions options;
      options.max_tokens = 64;
      tokens.push_back(generate(model, state, prompt, options).tokens);
    }
    const ErrorFigures f = compare_f32(logits[1], logits[0]);
    size_t equal = 0;
    for (size_t i = 0; i < tokens[0].size() && i < tokens[1].size(); ++i) equal += tokens[0][i] == tokens[1][i] ? 1u : 0u;
    std::printf("[cuda] full checkpoint, context %lld, int8 vs f32 KV cache: max |logit diff| %.4g, normalised %.3g; "
                "greedy tokens equal %zu of 64\n",
                static_cast<long long>(context), f.max_abs, f.normalised, equal);
    EXPECT_EQ(tokens[0].size(), 64u);
    EXPECT_GT(f.normalised, 1e-4) << "context " << context;
    EXPECT_LT(f.normalised, 1.0) << "context " << context;
  }
}

}  // namespace
}  // namespace lily::testing

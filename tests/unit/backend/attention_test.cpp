// CPU backend vs the float64 reference: attention_prepare (q/k norm + partial RoPE) and cached causal attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backend_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

// f32 vs f64, with sums of at most a few hundred terms per output (see dense_ops_test.cpp).
constexpr double kTol = 1e-5;
// attention_prepare is tighter: per element one f32 norm over head_dim squares and one
// rotation (observed <= 2e-7). 1e-6 is also what makes the RoPE angle checkable: a backend
// that formed the angle in double instead of f32 is 4e-5..4e-4 off at positions >= 1e5.
constexpr double kPrepareTol = 1e-6;
constexpr float kEps = 1e-6f;

std::vector<double> widen(const std::vector<float>& v) { return ref::widen(v); }

AttentionDims small_dims() { return {4, 2, 64, 16, 1e7}; }   // 2 query heads per kv head
AttentionDims model_dims() { return {16, 2, 256, 64, 1e7}; }  // the real model

std::string dims_label(const AttentionDims& d) {
  return "Hq=" + std::to_string(d.q_heads) + " Hkv=" + std::to_string(d.kv_heads) +
         " D=" + std::to_string(d.head_dim) + " rot=" + std::to_string(d.rotary_dim);
}

struct PrepareCase {
  AttentionDims dims;
  int64_t start_pos;
  int64_t n;
};

TEST(BackendAttentionPrepare, NormAndRopeAtSmallAndLargePositions) {
  Rng rng(51);
  auto be = cpu();
  for (const PrepareCase& c : {PrepareCase{small_dims(), 0, 3}, PrepareCase{small_dims(), 100000, 2},
                               PrepareCase{model_dims(), 0, 2}, PrepareCase{model_dims(), 100000, 2},
                               PrepareCase{model_dims(), 262143, 1}}) {
    const AttentionDims& d = c.dims;
    const auto D = static_cast<uint64_t>(d.head_dim);
    const DenseTensor q_norm(DType::BF16, {D}, rng.uniform_vector(D, 0.7f, 1.6f), "q_norm");
    const DenseTensor k_norm(DType::BF16, {D}, rng.uniform_vector(D, 0.7f, 1.6f), "k_norm");
    const auto qg_size = static_cast<size_t>(c.n * d.q_heads * 2 * d.head_dim);
    const auto k_size = static_cast<size_t>(c.n * d.kv_heads * d.head_dim);
    const std::vector<float> qg_in = rng.uniform_vector(qg_size, -3.0f, 3.0f);
    const std::vector<float> k_in = rng.uniform_vector(k_size, -3.0f, 3.0f);
    std::vector<float> qg = qg_in;
    std::vector<float> k = k_in;
    be->attention_prepare(qg.data(), k.data(), q_norm.view(), k_norm.view(), d, c.start_pos, c.n, kEps);
    std::vector<double> ref_qg = widen(qg_in);
    std::vector<double> ref_k = widen(k_in);
    ref::attention_prepare(ref_qg, ref_k, q_norm.view(), k_norm.view(), d, c.start_pos, c.n,
                           static_cast<double>(kEps));
    const std::string label = dims_label(d) + " pos=" + std::to_string(c.start_pos) + " n=" + std::to_string(c.n);
    const ErrorFigures fq = report("attention_prepare", label + " q", qg, ref_qg);
    const ErrorFigures fk = report("attention_prepare", label + " k", k, ref_k);
    EXPECT_LT(fq.normalised, kPrepareTol) << label;
    EXPECT_LT(fk.normalised, kPrepareTol) << label;
    // The gate half of each q_proj head is left exactly as it was.
    for (int64_t t = 0; t < c.n; ++t) {
      for (int64_t h = 0; h < d.q_heads; ++h) {
        for (int64_t i = 0; i < d.head_dim; ++i) {
          const auto at = static_cast<size_t>(((t * d.q_heads + h) * 2 + 1) * d.head_dim + i);
          ASSERT_EQ(qg[at], qg_in[at]) << label << " gate changed at t=" << t << " h=" << h;
        }
      }
    }
    if (c.start_pos >= 100000) {
      // Sensitivity: a reference forming the angle in double disagrees visibly at this
      // position, so agreement above really checks the f32 angle.
      std::vector<double> exact_qg = widen(qg_in);
      std::vector<double> exact_k = widen(k_in);
      ref::attention_prepare(exact_qg, exact_k, q_norm.view(), k_norm.view(), d, c.start_pos,
                             c.n, static_cast<double>(kEps), ref::RopeAngle::exact);
      const ErrorFigures fe = report("attention_prepare", label + " q vs f64-angle ref", qg, exact_qg);
      EXPECT_GT(fe.normalised, 10 * kPrepareTol) << label;
    }
  }
}

// Runs CPU attention and the reference on the same inputs, each with its own cache, and
// checks the output and the cache rows.
class AttentionRunner {
 public:
  static constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

  AttentionRunner(const AttentionDims& dims, int64_t capacity, Backend& be)
      : dims_(dims), capacity_(capacity), be_(be),
        k_cache_(static_cast<size_t>(capacity * dims.kv_heads * dims.head_dim), kPoison),
        v_cache_(k_cache_.size(), kPoison) {}

  // Random q/gate, k, v for n tokens at start_pos (q and k scaled by `magnitude`).
  void step(Rng& rng, int64_t start_pos, int64_t n, float magnitude, const std::string& what) {
    const auto row = static_cast<size_t>(dims_.kv_heads * dims_.head_dim);
    std::vector<float> qg = rng.uniform_vector(static_cast<size_t>(n * dims_.q_heads * 2 * dims_.head_dim), -1.0f, 1.0f);
    std::vector<float> k = rng.uniform_vector(static_cast<size_t>(n) * row, -1.0f, 1.0f);
    const std::vector<float> v = rng.uniform_vector(k.size(), -2.0f, 2.0f);
    for (float& x : qg) x *= magnitude;
    for (float& x : k) x *= magnitude;
    run(qg, k, v, start_pos, n, what);
  }

  void run(const std::vector<float>& qg, const std::vector<float>& k, const std::vector<float>& v,
           int64_t start_pos, int64_t n, const std::string& what) {
    const auto row = static_cast<size_t>(dims_.kv_heads * dims_.head_dim);
    std::vector<float> out(static_cast<size_t>(n * dims_.q_heads * dims_.head_dim), 1e30f);
    be_.attention(qg.data(), k.data(), v.data(), k_cache_.data(), v_cache_.data(), capacity_,
                  dims_, start_pos, n, out.data());
    const std::vector<double> want = ref::attention(widen(qg), widen(k), widen(v), ref_k_, ref_v_,
                                                    capacity_, dims_, start_pos, n);
    const std::string label = dims_label(dims_) + " " + what;
    const ErrorFigures f = report("attention", label, out, want);
    EXPECT_LT(f.normalised, kTol) << label;
    // The new rows are stored exactly; rows past the end stay untouched (and were never
    // read: they hold NaN, which would have reached the output).
    for (size_t i = 0; i < static_cast<size_t>(n) * row; ++i) {
      ASSERT_EQ(k_cache_[static_cast<size_t>(start_pos) * row + i], k[i]) << label;
      ASSERT_EQ(v_cache_[static_cast<size_t>(start_pos) * row + i], v[i]) << label;
    }
    for (size_t i = static_cast<size_t>(start_pos + n) * row; i < k_cache_.size(); ++i) {
      ASSERT_TRUE(std::isnan(k_cache_[i])) << label;
      ASSERT_TRUE(std::isnan(v_cache_[i])) << label;
    }
  }

 private:
  AttentionDims dims_;
  int64_t capacity_;
  Backend& be_;
  std::vector<float> k_cache_, v_cache_;
  std::vector<double> ref_k_, ref_v_;
};

TEST(BackendAttention, DecodeFromStartThenLater) {
  Rng rng(52);
  auto be = cpu();
  AttentionRunner r(small_dims(), 16, *be);
  r.step(rng, 0, 1, 1.0f, "decode start_pos=0");  // one key: output = v * sigmoid(gate)
  for (int64_t pos = 1; pos < 10; ++pos) r.step(rng, pos, 1, 1.0f, "decode start_pos=" + std::to_string(pos));
}

TEST(BackendAttention, PrefillThenContinuationThenDecode) {
  Rng rng(53);
  auto be = cpu(3);
  for (const AttentionDims& d : {small_dims(), model_dims(), AttentionDims{8, 1, 64, 16, 1e7}}) {
    AttentionRunner r(d, 20, *be);
    r.step(rng, 0, 7, 1.0f, "prefill n=7 start_pos=0");
    r.step(rng, 7, 5, 1.0f, "prefill n=5 start_pos=7");
    r.step(rng, 12, 1, 1.0f, "decode start_pos=12");
    r.step(rng, 13, 7, 1.0f, "prefill n=7 start_pos=13 (fills capacity)");
  }
}

TEST(BackendAttention, LargeMagnitudeScores) {
  // q and k scaled by 40: scores of several hundred, softmax nearly one-hot. The max
  // subtraction must keep exp finite; the one-hot result is well conditioned.
  Rng rng(54);
  auto be = cpu();
  AttentionRunner r(small_dims(), 12, *be);
  r.step(rng, 0, 6, 40.0f, "scores ~1e2..1e3 prefill n=6");
  r.step(rng, 6, 1, 40.0f, "scores ~1e2..1e3 decode");
  // Identical huge keys: every score equal (~1e4) -> uniform average of the values.
  const AttentionDims d = small_dims();
  AttentionRunner u(d, 4, *be);
  const auto row = static_cast<size_t>(d.kv_heads * d.head_dim);
  std::vector<float> qg(static_cast<size_t>(4 * d.q_heads * 2 * d.head_dim), 30.0f);
  std::vector<float> k(4 * row, 30.0f);
  const std::vector<float> v = rng.uniform_vector(4 * row, -1.0f, 1.0f);
  u.run(qg, k, v, 0, 4, "equal scores of 7200");
}

TEST(BackendAttention, NegativeInfinityScoreGetsZeroWeight) {
  // Cache row 2 holds a key with -inf in dimension 0 and every query has q[0] > 0, so its
  // score is -inf; its value (1e30) must get weight exactly 0.
  Rng rng(55);
  auto be = cpu();
  const AttentionDims d = small_dims();
  const auto D = static_cast<size_t>(d.head_dim);
  const auto row = static_cast<size_t>(d.kv_heads) * D;
  AttentionRunner r(d, 8, *be);
  r.step(rng, 0, 2, 1.0f, "prefill n=2 before -inf key");
  std::vector<float> qg = rng.uniform_vector(static_cast<size_t>(d.q_heads) * 2 * D, -1.0f, 1.0f);
  for (size_t h = 0; h < static_cast<size_t>(d.q_heads); ++h) qg[h * 2 * D] = 0.5f + rng.uniform(0.0f, 1.0f);
  std::vector<float> k = rng.uniform_vector(row, -1.0f, 1.0f);
  std::vector<float> v = rng.uniform_vector(row, -1.0f, 1.0f);
  k[0] = -std::numeric_limits<float>::infinity();  // kv head 0
  k[D] = -std::numeric_limits<float>::infinity();  // kv head 1
  v[0] = 1e30f;
  v[D + 3] = -1e30f;
  // Its own query sees it too: keys 0, 1 finite, key 2 = -inf.
  r.run(qg, k, v, 2, 1, "decode over a -inf key (start_pos=2)");
  qg = rng.uniform_vector(qg.size(), -1.0f, 1.0f);
  for (size_t h = 0; h < static_cast<size_t>(d.q_heads); ++h) qg[h * 2 * D] = 0.25f;
  r.run(qg, rng.uniform_vector(row, -1.0f, 1.0f), rng.uniform_vector(row, -1.0f, 1.0f), 3, 1,
        "decode after a -inf key (start_pos=3)");
}

// A prefill chunk gives each token the bits of that token's own decode step, whatever the
// cache dtype and thread count: the prefill's items take up to 8 tokens and share 64-key blocks
// among them (attention.cpp), which must not change a token's sums. 75 then 21 tokens cross
// block boundaries (64, 128 keys) and leave a short last group; a near one-hot softmax (scale
// 30) is included.
TEST(BackendAttention, PrefillEqualsOneTokenStepsBitForBit) {
  for (const AttentionDims& d : {small_dims(), model_dims()}) {
    for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16, KvDtype::int8}) {
      for (int threads : {1, 3}) {
        Rng rng(57);
        auto be = cpu(threads);
        constexpr int64_t kCapacity = 96;
        const auto row = static_cast<size_t>(d.kv_heads * d.head_dim);
        const auto q_row = static_cast<size_t>(d.q_heads * 2 * d.head_dim);
        const auto out_row = static_cast<size_t>(d.q_heads * d.head_dim);
        const auto elements = static_cast<size_t>(kCapacity) * row;
        std::vector<float> qg =
            rng.uniform_vector(static_cast<size_t>(kCapacity) * q_row, -1.0f, 1.0f);
        const std::vector<float> k =
            rng.uniform_vector(static_cast<size_t>(kCapacity) * row, -1.0f, 1.0f);
        const std::vector<float> v = rng.uniform_vector(k.size(), -2.0f, 2.0f);
        for (size_t i = 80 * q_row; i < 90 * q_row; ++i) qg[i] *= 30.0f;
        const KvCacheView pk = be->alloc_kv_cache(elements, dtype, d.head_dim);
        const KvCacheView pv = be->alloc_kv_cache(elements, dtype, d.head_dim);
        const KvCacheView sk = be->alloc_kv_cache(elements, dtype, d.head_dim);
        const KvCacheView sv = be->alloc_kv_cache(elements, dtype, d.head_dim);
        std::vector<float> chunked(static_cast<size_t>(kCapacity) * out_row, 1e30f);
        std::vector<float> stepped(chunked.size(), -1e30f);
        for (const auto& [start, n] : {std::pair<int64_t, int64_t>{0, 75}, {75, 21}}) {
          const auto s = static_cast<size_t>(start);
          be->attention(qg.data() + s * q_row, k.data() + s * row, v.data() + s * row, pk, pv,
                        kCapacity, d, start, n, chunked.data() + s * out_row);
        }
        for (int64_t t = 0; t < kCapacity; ++t) {
          const auto s = static_cast<size_t>(t);
          be->attention(qg.data() + s * q_row, k.data() + s * row, v.data() + s * row, sk, sv,
                        kCapacity, d, t, 1, stepped.data() + s * out_row);
        }
        const std::string label =
            dims_label(d) + " " + kv_dtype_name(dtype) + " threads=" + std::to_string(threads);
        for (size_t i = 0; i < chunked.size(); ++i) {
          ASSERT_EQ(std::memcmp(&chunked[i], &stepped[i], sizeof(float)), 0)
              << label << ": token " << i / out_row << " element " << i % out_row << ": "
              << chunked[i] << " against one step's " << stepped[i];
        }
      }
    }
  }
}

}  // namespace
}  // namespace lily::testing

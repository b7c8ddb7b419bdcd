// The CPU's int8 KV cache: the row quantiser against a float64 derivation, attention against a float64 reference over the stored codes and scales and against the f32 cache, its copies and rejections.
//
// Tolerances (docs/precision.md, *The int8 KV cache*):
//  * a quantised value: |x - code * scale| <= scale / 2 (plus an f32 rounding of the product),
//    scale = max |x| / 127 of its (token, kv head) row, and the code is the float64 nearest of
//    x * 127 / max |x| or next to it (the f32 product may cross a half);
//  * against the float64 reference computed from the stored codes and scales: kTol = 1e-5
//    normalised, the f32 cache's own bound: the CPU widens each row to code * scale in f32
//    (one rounding) and then runs the f32 path's dot/axpy calls;
//  * against the f32 cache on the same inputs: at most kInt8VsF32 = 3e-2 normalised (each value
//    moves by up to max |x| / 254 of its row, about 2.3e-3 of it RMS for uniform rows, which the
//    value sum passes on and the scores turn into weight errors of the same order) and at least
//    kInt8Floor = 1e-5, so that a cache that silently keeps f32 fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

constexpr double kTol = 1e-5;
constexpr double kInt8VsF32 = 3e-2;
constexpr double kInt8Floor = 1e-5;

AttentionDims small_dims() { return {4, 2, 64, 16, 1e7}; }   // 2 query heads per kv head
AttentionDims model_dims() { return {16, 2, 256, 64, 1e7}; }  // the real model: groups of 8
AttentionDims tiny_dims() { return {8, 1, 64, 16, 1e7}; }     // one kv head for 8 query heads

std::string dims_label(const AttentionDims& d) {
  return "Hq=" + std::to_string(d.q_heads) + " Hkv=" + std::to_string(d.kv_heads) +
         " D=" + std::to_string(d.head_dim);
}

// The row quantiser against float64: the scale, each code within one of the float64 nearest,
// the reconstruction error, the extremes at +-127, and the zero and non-finite rows.
TEST(Int8KvRow, QuantisesEachRowToItsMaximumOver127) {
  Rng rng(81);
  for (int64_t width : {16, 64, 256}) {
    for (float magnitude : {1e-20f, 1e-3f, 1.0f, 3e4f, 1e30f}) {
      std::vector<float> x = rng.uniform_vector(static_cast<size_t>(width), -1.0f, 1.0f);
      for (float& v : x) v *= magnitude;
      x[static_cast<size_t>(width) / 3] = 0.0f;
      std::vector<int8_t> codes(static_cast<size_t>(width), 99);
      const float scale = quantize_kv_row(x.data(), width, codes.data());
      double absmax = 0;
      size_t at_max = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (std::fabs(static_cast<double>(x[i])) > absmax) {
          absmax = std::fabs(static_cast<double>(x[i]));
          at_max = i;
        }
      }
      const std::string label = "width " + std::to_string(width) + " magnitude " + std::to_string(magnitude);
      EXPECT_NEAR(static_cast<double>(scale), absmax / 127.0, absmax / 127.0 * 1e-6) << label;
      EXPECT_EQ(std::abs(static_cast<int>(codes[at_max])), 127) << label;
      EXPECT_EQ(codes[static_cast<size_t>(width) / 3], 0) << label;
      for (size_t i = 0; i < x.size(); ++i) {
        const double exact = static_cast<double>(x[i]) * 127.0 / absmax;
        EXPECT_LE(std::fabs(static_cast<double>(codes[i]) - std::nearbyint(exact)), 1.0) << label << " at " << i;
        EXPECT_LE(std::fabs(static_cast<double>(codes[i]) - exact), 0.5 + 1e-5) << label << " at " << i;
        const double back = static_cast<double>(codes[i]) * static_cast<double>(scale);
        EXPECT_LE(std::fabs(back - static_cast<double>(x[i])), 0.5 * static_cast<double>(scale) * (1 + 1e-5))
            << label << " at " << i;
      }
    }
  }
  std::vector<int8_t> codes(8, 5);
  const std::vector<float> zeros(8, 0.0f);
  EXPECT_EQ(quantize_kv_row(zeros.data(), 8, codes.data()), 0.0f);
  for (int8_t c : codes) EXPECT_EQ(c, 0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(8, 0.5f);
    x[3] = bad;
    std::fill(codes.begin(), codes.end(), int8_t{5});
    EXPECT_TRUE(std::isnan(quantize_kv_row(x.data(), 8, codes.data()))) << bad;
    for (int8_t c : codes) EXPECT_EQ(c, 0) << bad;
  }
}

// One step's inputs: q|gate, k, v for n tokens.
struct StepInput {
  std::vector<float> qg, k, v;
};

StepInput random_step(Rng& rng, const AttentionDims& d, int64_t n) {
  const auto row = static_cast<size_t>(d.kv_heads * d.head_dim);
  StepInput in;
  in.qg = rng.uniform_vector(static_cast<size_t>(n * d.q_heads * 2 * d.head_dim), -1.0f, 1.0f);
  in.k = rng.uniform_vector(static_cast<size_t>(n) * row, -1.0f, 1.0f);
  in.v = rng.uniform_vector(in.k.size(), -2.0f, 2.0f);
  // Rows of different magnitudes: each row has its own scale.
  for (size_t r = 0; r < in.k.size() / static_cast<size_t>(d.head_dim); ++r) {
    const float m = 0.25f + static_cast<float>(r % 5);
    for (int64_t i = 0; i < d.head_dim; ++i) in.k[r * static_cast<size_t>(d.head_dim) + static_cast<size_t>(i)] *= m;
  }
  return in;
}

// Every scale NaN: a row attention reads without having written it would reach the output.
void poison_int8(Backend& be, const KvCacheView& cache, size_t count, int64_t head_dim) {
  write_int8_kv(be, cache, {std::vector<int8_t>(count, 0),
                            std::vector<float>(count / static_cast<size_t>(head_dim), std::numeric_limits<float>::quiet_NaN())});
}

struct Step {
  int64_t start_pos;
  int64_t n;
};
const std::vector<Step>& schedule() {
  static const std::vector<Step> steps = {{0, 7}, {7, 5}, {12, 1}, {13, 1}, {14, 3}, {17, 150},
                                          {167, 1}, {168, 1}, {169, 2}};
  return steps;
}
constexpr int64_t kCapacity = 171;

// int8 cache vs the float64 reference over the stored codes and scales (prefill n > 1 and
// decode n == 1), the stored rows against quantize_kv_row, untouched rows, and the distance to
// the f32 cache on the same inputs.
TEST(CpuInt8KvCache, AttentionMatchesTheFloat64ReferenceOverTheStoredRows) {
  Rng rng(73);
  for (int threads : {1, 3}) {
    auto be = cpu(threads);
    for (const AttentionDims& d : {small_dims(), model_dims(), tiny_dims()}) {
      const int64_t D = d.head_dim;
      const auto row = static_cast<size_t>(d.kv_heads * D);
      const size_t elements = static_cast<size_t>(kCapacity) * row;
      const KvCacheView k8 = be->alloc_kv_cache(elements, KvDtype::int8, D);
      const KvCacheView v8 = be->alloc_kv_cache(elements, KvDtype::int8, D);
      ASSERT_EQ(k8.dtype, KvDtype::int8);
      poison_int8(*be, k8, elements, D);
      poison_int8(*be, v8, elements, D);
      float* k32 = be->alloc(elements);
      float* v32 = be->alloc(elements);
      std::vector<double> ref_k, ref_v;
      double worst = 0;
      double closest_to_f32 = INFINITY;
      for (const Step& s : schedule()) {
        const StepInput in = random_step(rng, d, s.n);
        const std::string label = dims_label(d) + " threads=" + std::to_string(threads) +
                                  " start_pos=" + std::to_string(s.start_pos) + " n=" + std::to_string(s.n);
        std::vector<float> got(static_cast<size_t>(s.n * d.q_heads * D), 1e30f);
        be->attention(in.qg.data(), in.k.data(), in.v.data(), k8, v8, kCapacity, d, s.start_pos, s.n, got.data());
        // The stored rows: quantize_kv_row of each (token, kv head) row; later rows untouched.
        const Int8KvImage kh = read_int8_kv(*be, k8, elements, D);
        const Int8KvImage vh = read_int8_kv(*be, v8, elements, D);
        std::vector<double> k_stored(in.k.size()), v_stored(in.v.size());
        for (size_t r = 0; r < in.k.size() / static_cast<size_t>(D); ++r) {
          const size_t at = static_cast<size_t>(s.start_pos * d.kv_heads) + r;
          std::vector<int8_t> want(static_cast<size_t>(D));
          ASSERT_EQ(kh.scales[at], quantize_kv_row(in.k.data() + r * static_cast<size_t>(D), D, want.data())) << label;
          for (int64_t i = 0; i < D; ++i) ASSERT_EQ(kh.codes[at * static_cast<size_t>(D) + static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << label;
          ASSERT_EQ(vh.scales[at], quantize_kv_row(in.v.data() + r * static_cast<size_t>(D), D, want.data())) << label;
          for (int64_t i = 0; i < D; ++i) ASSERT_EQ(vh.codes[at * static_cast<size_t>(D) + static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << label;
          for (int64_t i = 0; i < D; ++i) {
            const size_t e = at * static_cast<size_t>(D) + static_cast<size_t>(i);
            k_stored[r * static_cast<size_t>(D) + static_cast<size_t>(i)] =
                static_cast<double>(kh.codes[e]) * static_cast<double>(kh.scales[at]);
            v_stored[r * static_cast<size_t>(D) + static_cast<size_t>(i)] =
                static_cast<double>(vh.codes[e]) * static_cast<double>(vh.scales[at]);
          }
        }
        for (size_t r = static_cast<size_t>((s.start_pos + s.n) * d.kv_heads); r < kh.scales.size(); ++r) {
          ASSERT_TRUE(std::isnan(kh.scales[r]) && std::isnan(vh.scales[r])) << label << " row " << r;
        }
        const std::vector<double> want = ref::attention(ref::widen(in.qg), k_stored, v_stored, ref_k, ref_v,
                                                        kCapacity, d, s.start_pos, s.n);
        const ErrorFigures f = report("attention int8 cache", label, got, want);
        EXPECT_LT(f.normalised, kTol) << label;
        worst = std::max(worst, f.normalised);
        std::vector<float> exact(got.size(), 1e30f);
        be->attention(in.qg.data(), in.k.data(), in.v.data(), k32, v32, kCapacity, d, s.start_pos, s.n, exact.data());
        const ErrorFigures g = compare(got, ref::widen(exact));
        EXPECT_LT(g.normalised, kInt8VsF32) << label;
        closest_to_f32 = std::min(closest_to_f32, g.normalised);
      }
      std::printf("[int8 kv] %s threads=%d: worst %.3g normalised vs float64 over the stored rows, "
                  "closest %.3g to the f32 cache\n",
                  dims_label(d).c_str(), threads, worst, closest_to_f32);
      EXPECT_GT(closest_to_f32, kInt8Floor) << dims_label(d) << ": the int8 cache looks like f32";
    }
  }
}

// Sizes and host copies: count bytes of codes plus a 4-byte scale per row, the documented host
// image (codes, then scales), zero_kv_cache clearing both, and the views' typed pointers.
TEST(CpuInt8KvCache, AllocZeroAndHostCopiesCarryCodesAndScales) {
  auto be = cpu();
  EXPECT_TRUE(be->serves_kv_cache(KvDtype::int8));
  EXPECT_EQ(kv_cache_bytes(KvDtype::int8, 64, 16), 64u + 4u * 4u);  // the host image's size
  EXPECT_EQ(kv_cache_bytes(KvDtype::bf16, 64, 16), 128u);
  const uint64_t before = be->allocated_bytes();
  const KvCacheView c = be->alloc_kv_cache(64, KvDtype::int8, 16);
  EXPECT_EQ(be->allocated_bytes() - before, 64u + 16u);
  ASSERT_EQ(c.dtype, KvDtype::int8);
  EXPECT_EQ(c.scale_group, 16);
  EXPECT_THROW((void)c.f32(), std::logic_error);
  EXPECT_THROW((void)c.bf16_bits(), std::logic_error);
  EXPECT_THROW((void)KvCacheView(be->alloc(4)).int8_codes(), std::logic_error);
  EXPECT_THROW((void)be->alloc_kv_cache(60, KvDtype::int8, 16), std::invalid_argument);  // not whole rows
  std::vector<char> image(64 + 16 + 1, 0x5a);
  be->copy_kv_to_host(c, 64, image.data());
  for (size_t i = 0; i < 80; ++i) ASSERT_EQ(image[i], 0) << i;
  EXPECT_EQ(image[80], 0x5a);  // not a byte further
  for (size_t i = 0; i < 64; ++i) image[i] = static_cast<char>(static_cast<int>(i) - 32);
  const float scales[4] = {0.5f, 2.0f, -0.0f, 1e-3f};
  std::memcpy(image.data() + 64, scales, sizeof scales);
  be->copy_kv_from_host(image.data(), 64, c);
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(c.int8_codes()[i], static_cast<int8_t>(static_cast<int>(i) - 32));
  for (size_t r = 0; r < 4; ++r) ASSERT_EQ(std::memcmp(&c.int8_scales()[r], &scales[r], 4), 0);
  be->zero_kv_cache(c, 64);
  const Int8KvImage zeroed = read_int8_kv(*be, c, 64, 16);
  for (int8_t code : zeroed.codes) ASSERT_EQ(code, 0);
  for (float s : zeroed.scales) ASSERT_EQ(s, 0.0f);
}

// An int8 view whose scales are missing or grouped other than by head_dim is refused with a
// message naming what was wrong, before anything is written.
TEST(CpuInt8KvCache, AttentionRefusesViewsWithoutMatchingScales) {
  auto be = cpu();
  const AttentionDims d = small_dims();
  const size_t elements = 4 * static_cast<size_t>(d.kv_heads * d.head_dim);
  const KvCacheView good = be->alloc_kv_cache(elements, KvDtype::int8, d.head_dim);
  const std::vector<float> qg(static_cast<size_t>(d.q_heads * 2 * d.head_dim), 0.1f);
  const std::vector<float> kv(static_cast<size_t>(d.kv_heads * d.head_dim), 0.1f);
  std::vector<float> out(static_cast<size_t>(d.q_heads * d.head_dim));
  const auto message = [&](const KvCacheView& k, const KvCacheView& v) -> std::string {
    try {
      be->attention(qg.data(), kv.data(), kv.data(), k, v, 4, d, 0, 1, out.data());
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  const KvCacheView no_scales = KvCacheView::int8(good.int8_codes(), nullptr, d.head_dim);
  EXPECT_NE(message(no_scales, good).find("k_cache scales"), std::string::npos) << message(no_scales, good);
  const KvCacheView wrong_group = KvCacheView::int8(good.int8_codes(), good.int8_scales(), 32);
  EXPECT_NE(message(good, wrong_group).find("v_cache scale_group"), std::string::npos) << message(good, wrong_group);
  EXPECT_EQ(message(good, good), "");
}

}  // namespace
}  // namespace lily::testing

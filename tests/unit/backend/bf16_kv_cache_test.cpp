// The CPU's bf16 KV cache: attention against a float64 reference over the bf16-rounded rows, bit for bit the f32 cache on bf16 values, and its copies.
//
// Tolerances (docs/precision.md, *The bf16 KV cache*):
//  * against the float64 reference computed from the bf16-rounded keys and values: kTol = 1e-5
//    normalised, the f32 cache's own bound (attention_test.cpp). The CPU computes in f32 either
//    way and only the stored values differ; the reference sees exactly those (widening bf16 is
//    exact), so nothing but the f32 path's rounding separates the two;
//  * against the f32 cache on bf16-representable inputs: equal, bit for bit. The bf16 path widens
//    each tile of rows into f32 and runs the very same dot/axpy calls in the same order;
//  * against the f32 cache on arbitrary inputs: at most kBf16VsF32 = 1e-2 normalised (each
//    stored value moves by at most 2^-9 relative, about 1.1e-3 RMS, which the value sum passes
//    on and the scores turn into weight errors of the same order) and at least kBf16Floor =
//    1e-5, so that a cache that silently keeps f32 fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "core/bf16.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

constexpr double kTol = 1e-5;
constexpr double kBf16VsF32 = 1e-2;
constexpr double kBf16Floor = 1e-5;
constexpr uint16_t kPoisonBits = 0x7fc0;  // a bf16 quiet NaN: rows never written stay NaN

AttentionDims small_dims() { return {4, 2, 64, 16, 1e7}; }   // 2 query heads per kv head
AttentionDims model_dims() { return {16, 2, 256, 64, 1e7}; }  // the real model: groups of 8
AttentionDims tiny_dims() { return {8, 1, 64, 16, 1e7}; }     // one kv head for 8 query heads

std::string dims_label(const AttentionDims& d) {
  return "Hq=" + std::to_string(d.q_heads) + " Hkv=" + std::to_string(d.kv_heads) +
         " D=" + std::to_string(d.head_dim);
}

std::vector<double> rounded_wide(const std::vector<float>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(round_to_bf16(v[i]));
  return out;
}

std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = round_to_bf16(v[i]);
  return out;
}

// One step's inputs: q|gate, k, v for n tokens.
struct StepInput {
  std::vector<float> qg, k, v;
};

StepInput random_step(Rng& rng, const AttentionDims& d, int64_t n, float magnitude) {
  const auto row = static_cast<size_t>(d.kv_heads * d.head_dim);
  StepInput in;
  in.qg = rng.uniform_vector(static_cast<size_t>(n * d.q_heads * 2 * d.head_dim), -1.0f, 1.0f);
  in.k = rng.uniform_vector(static_cast<size_t>(n) * row, -1.0f, 1.0f);
  in.v = rng.uniform_vector(in.k.size(), -2.0f, 2.0f);
  for (float& x : in.qg) x *= magnitude;
  for (float& x : in.k) x *= magnitude;
  return in;
}

// A pair of KV caches of one dtype in CPU memory, every element poisoned (NaN) at the start.
struct Caches {
  Caches(Backend& be, KvDtype dtype, size_t count, int64_t head_dim) : elements(count) {
    keys = be.alloc_kv_cache(elements, dtype, head_dim);
    values = be.alloc_kv_cache(elements, dtype, head_dim);
    EXPECT_EQ(keys.dtype, dtype);
    if (dtype == KvDtype::bf16) {
      const std::vector<uint16_t> poison(elements, kPoisonBits);
      be.copy_kv_from_host(poison.data(), elements, keys);
      be.copy_kv_from_host(poison.data(), elements, values);
    } else {
      const std::vector<float> poison(elements, std::numeric_limits<float>::quiet_NaN());
      be.copy_kv_from_host(poison.data(), elements, keys);
      be.copy_kv_from_host(poison.data(), elements, values);
    }
  }
  size_t elements;
  KvCacheView keys, values;
};

std::vector<float> attend(Backend& be, const Caches& c, const StepInput& in, const AttentionDims& d,
                          int64_t capacity, int64_t start_pos, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n * d.q_heads * d.head_dim), 1e30f);
  be.attention(in.qg.data(), in.k.data(), in.v.data(), c.keys, c.values, capacity, d, start_pos, n,
               out.data());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Step {
  int64_t start_pos;
  int64_t n;
};

// Prefill, a continuation, decode steps, a long prefill crossing many key tiles (a multiple of
// none of the tile sizes one might pick), decode at the end of the capacity.
const std::vector<Step>& schedule() {
  static const std::vector<Step> steps = {{0, 7}, {7, 5}, {12, 1}, {13, 1}, {14, 3}, {17, 150},
                                          {167, 1}, {168, 1}, {169, 2}};
  return steps;
}
constexpr int64_t kCapacity = 171;

// bf16 cache vs the float64 reference over the rounded rows (prefill n > 1 and decode n == 1),
// the stored bits, untouched rows, and how far the result is from the f32 cache's.
TEST(CpuBf16KvCache, AttentionMatchesTheFloat64ReferenceOverTheRoundedRows) {
  Rng rng(71);
  for (int threads : {1, 2, 3}) {
    auto be = cpu(threads);
    for (const AttentionDims& d : {small_dims(), model_dims(), tiny_dims()}) {
      const auto row = static_cast<size_t>(d.kv_heads * d.head_dim);
      const size_t elements = static_cast<size_t>(kCapacity) * row;
      Caches bf16(*be, KvDtype::bf16, elements, d.head_dim);
      Caches f32(*be, KvDtype::f32, elements, d.head_dim);
      std::vector<double> ref_k, ref_v;
      double worst = 0;
      double closest_to_f32 = INFINITY;
      for (const Step& s : schedule()) {
        const StepInput in = random_step(rng, d, s.n, 1.0f);
        const std::string label = dims_label(d) + " threads=" + std::to_string(threads) +
                                  " start_pos=" + std::to_string(s.start_pos) + " n=" + std::to_string(s.n);
        const std::vector<float> got = attend(*be, bf16, in, d, kCapacity, s.start_pos, s.n);
        const std::vector<double> want =
            ref::attention(ref::widen(in.qg), rounded_wide(in.k), rounded_wide(in.v), ref_k, ref_v,
                           kCapacity, d, s.start_pos, s.n);
        const ErrorFigures f = report("attention bf16 cache", label, got, want);
        EXPECT_LT(f.normalised, kTol) << label;
        worst = std::max(worst, f.normalised);
        // Against the f32 cache on the same (unrounded) inputs.
        const std::vector<float> exact = attend(*be, f32, in, d, kCapacity, s.start_pos, s.n);
        const ErrorFigures g = compare(got, ref::widen(exact));
        EXPECT_LT(g.normalised, kBf16VsF32) << label;
        closest_to_f32 = std::min(closest_to_f32, g.normalised);
        // The stored rows are the nearest-even bf16 of k and v; the rows after them stay
        // poisoned (and were never read: a NaN would have reached the output).
        std::vector<uint16_t> kh(elements), vh(elements);
        be->copy_kv_to_host(bf16.keys, elements, kh.data());
        be->copy_kv_to_host(bf16.values, elements, vh.data());
        for (size_t i = 0; i < static_cast<size_t>(s.n) * row; ++i) {
          ASSERT_EQ(kh[static_cast<size_t>(s.start_pos) * row + i], f32_to_bf16(in.k[i])) << label;
          ASSERT_EQ(vh[static_cast<size_t>(s.start_pos) * row + i], f32_to_bf16(in.v[i])) << label;
        }
        for (size_t i = static_cast<size_t>(s.start_pos + s.n) * row; i < elements; ++i) {
          ASSERT_EQ(kh[i], kPoisonBits) << label;
          ASSERT_EQ(vh[i], kPoisonBits) << label;
        }
      }
      std::printf("[bf16 kv] %s threads=%d: worst %.3g normalised vs float64 over rounded rows, "
                  "closest %.3g to the f32 cache\n",
                  dims_label(d).c_str(), threads, worst, closest_to_f32);
      EXPECT_GT(closest_to_f32, kBf16Floor) << dims_label(d) << ": the bf16 cache looks like f32";
    }
  }
}

// On keys and values that bf16 represents exactly, the bf16 cache's output is the f32 cache's,
// bit for bit, for every thread count (which changes how query heads are grouped per item) and
// with large scores (a softmax near one-hot) as well as ordinary ones.
TEST(CpuBf16KvCache, BitIdenticalToTheF32CacheOnBf16Values) {
  for (const AttentionDims& d : {small_dims(), model_dims(), tiny_dims()}) {
    const auto row = static_cast<size_t>(d.kv_heads * d.head_dim);
    const size_t elements = static_cast<size_t>(kCapacity) * row;
    std::vector<std::vector<float>> first_outputs;  // threads=1's, per step
    for (int threads : {1, 2, 3, 5}) {
      Rng rng(72);
      auto be = cpu(threads);
      Caches bf16(*be, KvDtype::bf16, elements, d.head_dim);
      Caches f32(*be, KvDtype::f32, elements, d.head_dim);
      size_t index = 0;
      for (const Step& s : schedule()) {
        StepInput in = random_step(rng, d, s.n, s.n == 2 ? 30.0f : 1.0f);
        in.k = rounded(in.k);
        in.v = rounded(in.v);
        const std::string label = dims_label(d) + " threads=" + std::to_string(threads) +
                                  " start_pos=" + std::to_string(s.start_pos) + " n=" + std::to_string(s.n);
        const std::vector<float> a = attend(*be, bf16, in, d, kCapacity, s.start_pos, s.n);
        const std::vector<float> b = attend(*be, f32, in, d, kCapacity, s.start_pos, s.n);
        EXPECT_TRUE(same_bits(a, b)) << label << ": bf16 and f32 caches differ";
        for (float x : a) ASSERT_TRUE(std::isfinite(x)) << label;
        if (threads == 1) {
          first_outputs.push_back(a);
        } else {
          EXPECT_TRUE(same_bits(a, first_outputs[index])) << label << ": differs from 1 thread";
        }
        ++index;
      }
    }
  }
}

// The caches' element size everywhere: alloc gives zeros of the dtype, zero_kv_cache clears
// exactly `count` elements, the host copies move 2 bytes per bf16 element, allocated_bytes
// counts them.
TEST(CpuBf16KvCache, AllocZeroAndHostCopiesUseTheElementSize) {
  auto be = cpu();
  EXPECT_TRUE(be->serves_kv_cache(KvDtype::f32));
  EXPECT_TRUE(be->serves_kv_cache(KvDtype::bf16));
  const uint64_t before = be->allocated_bytes();
  const KvCacheView c = be->alloc_kv_cache(40, KvDtype::bf16, 8);
  EXPECT_EQ(be->allocated_bytes() - before, 80u);
  ASSERT_EQ(c.dtype, KvDtype::bf16);
  ASSERT_NE(c.bf16_bits(), nullptr);
  EXPECT_THROW((void)c.f32(), std::logic_error);
  std::vector<uint16_t> host(41, 0xabcd);
  be->copy_kv_to_host(c, 40, host.data());
  for (size_t i = 0; i < 40; ++i) ASSERT_EQ(host[i], 0u) << i;
  EXPECT_EQ(host[40], 0xabcd);  // not a byte further
  std::vector<uint16_t> bits(40);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16(static_cast<float>(i) - 17.25f);
  be->copy_kv_from_host(bits.data(), 40, c);
  be->copy_kv_to_host(c, 40, host.data());
  for (size_t i = 0; i < 40; ++i) ASSERT_EQ(host[i], bits[i]) << i;
  be->zero_kv_cache(KvCacheView::bf16(c.bf16_bits() + 10), 20);  // elements 10..29
  be->copy_kv_to_host(c, 40, host.data());
  for (size_t i = 0; i < 40; ++i) {
    ASSERT_EQ(host[i], i >= 10 && i < 30 ? 0u : bits[i]) << i;
  }
  // f32 caches keep 4 bytes an element.
  const uint64_t mid = be->allocated_bytes();
  const KvCacheView f = be->alloc_kv_cache(40, KvDtype::f32, 8);
  EXPECT_EQ(be->allocated_bytes() - mid, 160u);
  std::vector<float> fh(40, 1.0f);
  be->copy_kv_from_host(fh.data(), 40, f);
  be->zero_kv_cache(f, 40);
  be->copy_kv_to_host(f, 40, fh.data());
  for (float x : fh) ASSERT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace lily::testing

// --cpu-precision fast and q8 at n > 1 (matmul, expert_swiglu, expert_down_combine): bit for bit
// the n == 1 results per token.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

// A case's label (a stream: GCC 12 flags chains of std::string + with a false -Wrestrict).
template <class... Parts>
std::string label_of(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// The two int8 precisions: activations in two planes (fast) and in one (q8).
constexpr CpuPrecision kInt8Precisions[] = {CpuPrecision::fast, CpuPrecision::q8};

// got and want bit for bit; label names the case.
void expect_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << label << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

// The int8 path must show its quantisation against the exact one (else it did not run), and
// stay within the int8 kernel's measured error (docs/precision.md: 2e-5 to 1.3e-4 per dot with
// two planes, about 100 times that with one).
// one_plane: q8 on 4-bit weights (q8 gives 8-bit weights two planes).
void expect_quantised(bool one_plane, const std::vector<float>& int8_out,
                      const std::vector<float>& exact_out, const std::string& label) {
  const ErrorFigures f = report("int8 vs exact", label, int8_out, ref::widen(exact_out));
  EXPECT_GT(f.normalised, one_plane ? 1e-4 : 1e-7)
      << label << ": quantisation of this plane count did not show";
  EXPECT_LT(f.normalised, one_plane ? 5e-2 : 1e-3) << label;
}

TEST(FastPrefill, MatmulEqualsOneTokenCallsBitForBit) {
  Rng rng(91);
  for (CpuPrecision precision : kInt8Precisions) {
    for (int bits : {4, 8}) {
      for (int threads : {1, 2, 3}) {
        auto be = make_cpu_backend(threads, precision);
        auto exact = cpu(threads);
        const int64_t in = 576, out = 45, row_begin = 6, rows = 39;  // 9 groups; the last rows
        const QuantWeight w(rng, bits, 1, out, in, 1);
        for (int64_t n : {2, 17, 40}) {
          const std::string label =
              label_of(cpu_precision_name(precision), " q", bits, " threads=", threads, " n=", n);
          const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n * in), -2.0f, 2.0f);
          std::vector<float> y(static_cast<size_t>(n * rows), 1e30f), one(y.size(), 1e30f),
              ex(y.size());
          be->matmul(w.view(), row_begin, rows, x.data(), n, y.data());
          for (int64_t t = 0; t < n; ++t) {
            be->matmul(w.view(), row_begin, rows, x.data() + t * in, 1, one.data() + t * rows);
          }
          expect_bits(y, one, label);
          exact->matmul(w.view(), row_begin, rows, x.data(), n, ex.data());
          expect_quantised(precision == CpuPrecision::q8 && bits == 4, y, ex, label);
        }
      }
    }
  }
}

// q8 quantises the input of an 8-bit weight (the router and the shared expert's gate) in two
// planes, as fast does, and that of a 4-bit weight in one: decode and prefill, alone and in a
// matmul_group.
TEST(FastPrefill, Q8KeepsTwoPlanesForEightBitWeights) {
  Rng rng(95);
  auto q8 = make_cpu_backend(2, CpuPrecision::q8);
  auto two = make_cpu_backend(2, CpuPrecision::fast);
  const int64_t in = 320, rows = 24;
  for (int bits : {8, 4}) {
    const QuantWeight w(rng, bits, 1, rows, in, 2);
    for (int64_t n : {1, 9}) {
      const std::string label = label_of("q", bits, " n=", n);
      const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n * in), -2.0f, 2.0f);
      std::vector<float> a(static_cast<size_t>(n * rows)), b(a.size()), grouped(a.size());
      q8->matmul(w.view(), 0, rows, x.data(), n, a.data());
      two->matmul(w.view(), 0, rows, x.data(), n, b.data());
      const MatmulTarget targets[] = {
          {&w.view(), 0, rows / 2, grouped.data()},
          {&w.view(), rows / 2, rows - rows / 2, grouped.data() + rows / 2}};
      if (n == 1) {
        q8->matmul_group(targets, x.data(), 1);
        expect_bits(grouped, a, label + " matmul_group");
      }
      if (bits == 8) {
        expect_bits(a, b, label);
      } else {
        const ErrorFigures f = report("q8 vs fast", label, a, ref::widen(b));
        EXPECT_GT(f.normalised, 1e-4) << label << ": a 4-bit weight took two planes";
      }
    }
  }
}

TEST(FastPrefill, MatmulNamesTheNonFiniteRow) {
  Rng rng(92);
  auto be = make_cpu_backend(2, CpuPrecision::q8);
  const QuantWeight w(rng, 4, 1, 8, 128);
  std::vector<float> x = rng.uniform_vector(5 * 128, -1.0f, 1.0f);
  x[3 * 128 + 70] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(5 * 8);
  try {
    be->matmul(w.view(), 0, 8, x.data(), 5, y.data());
    ADD_FAILURE() << "a NaN input did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("matmul: input row 3: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("element 70"), std::string::npos) << e.what();
  }
}

constexpr int64_t kExperts = 7;
constexpr int64_t kHidden = 192;       // H: 3 groups
constexpr int64_t kIntermediate = 70;  // I: output rows of gate/up (a partial last chunk)
constexpr int64_t kInner = 576;        // the down projection's input: 9 groups
constexpr int64_t kShared = 320;       // S: 5 groups

// Expert ids for n tokens, k each, over this file's kExperts.
std::vector<int32_t> random_ids(Rng& rng, int64_t n, int64_t k) {
  return random_expert_ids(rng, n, k, static_cast<int64_t>(kExperts));
}

TEST(FastPrefill, ExpertSwigluEqualsOneTokenCallsBitForBit) {
  Rng rng(93);
  const QuantWeight gate(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_gate");
  const QuantWeight up(rng, 4, kExperts, kIntermediate, kHidden, 3, "experts_up");
  for (CpuPrecision precision : kInt8Precisions) {
    for (int threads : {1, 2}) {
      auto be = make_cpu_backend(threads, precision);
      auto exact = cpu(threads);
      for (int64_t n : {2, 19, 37}) {
        for (bool null_ids : {false, true}) {
          const int64_t k = null_ids ? 1 : 3;
          const std::string label = label_of(cpu_precision_name(precision), " threads=", threads,
                                             " n=", n, null_ids ? " ids=null" : " k=3");
          const std::vector<int32_t> ids = random_ids(rng, n, k);
          const int32_t* id_ptr = null_ids ? nullptr : ids.data();
          const std::vector<float> x =
              rng.uniform_vector(static_cast<size_t>(n * kHidden), -2.0f, 2.0f);
          std::vector<float> h(static_cast<size_t>(n * k * kIntermediate), 1e30f),
              one(h.size(), 1e30f), ex(h.size());
          be->expert_swiglu(gate.view(), up.view(), x.data(), id_ptr, n, k, h.data());
          for (int64_t t = 0; t < n; ++t) {
            be->expert_swiglu(gate.view(), up.view(), x.data() + t * kHidden,
                              null_ids ? nullptr : ids.data() + t * k, 1, k,
                              one.data() + t * k * kIntermediate);
          }
          expect_bits(h, one, label);
          exact->expert_swiglu(gate.view(), up.view(), x.data(), id_ptr, n, k, ex.data());
          expect_quantised(precision == CpuPrecision::q8, h, ex, label);
        }
      }
    }
  }
}

TEST(FastPrefill, ExpertDownCombineEqualsOneTokenCallsBitForBit) {
  Rng rng(94);
  const QuantWeight down(rng, 4, kExperts, kHidden, kInner, 0, "experts_down");
  for (CpuPrecision precision : kInt8Precisions) {
    for (int shared_bits : {4, 8}) {
      const QuantWeight shared_down(rng, shared_bits, 1, kHidden, kShared, 1, "shared_down");
      for (int threads : {1, 3}) {
        auto be = make_cpu_backend(threads, precision);
        auto exact = cpu(threads);
        for (int64_t n : {2, 23}) {
          const int64_t k = 4;
          const std::string label = label_of(cpu_precision_name(precision), " shared q",
                                             shared_bits, " threads=", threads, " n=", n);
          const std::vector<int32_t> ids = random_ids(rng, n, k);
          const std::vector<float> h =
              rng.uniform_vector(static_cast<size_t>(n * k * kInner), -1.0f, 1.0f);
          const std::vector<float> sh =
              rng.uniform_vector(static_cast<size_t>(n * kShared), -1.0f, 1.0f);
          const std::vector<float> logit = rng.uniform_vector(static_cast<size_t>(n), -2.0f, 2.0f);
          const std::vector<float> weights =
              rng.uniform_vector(static_cast<size_t>(n * k), 0.1f, 0.9f);
          std::vector<float> out(static_cast<size_t>(n * kHidden), 1e30f), one(out.size(), 1e30f),
              ex(out.size());
          be->expert_down_combine(down.view(), h.data(), ids.data(), weights.data(), n, k,
                                  shared_down.view(), sh.data(), logit.data(), out.data());
          for (int64_t t = 0; t < n; ++t) {
            be->expert_down_combine(down.view(), h.data() + t * k * kInner, ids.data() + t * k,
                                    weights.data() + t * k, 1, k, shared_down.view(),
                                    sh.data() + t * kShared, logit.data() + t,
                                    one.data() + t * kHidden);
          }
          expect_bits(out, one, label);
          exact->expert_down_combine(down.view(), h.data(), ids.data(), weights.data(), n, k,
                                     shared_down.view(), sh.data(), logit.data(), ex.data());
          expect_quantised(precision == CpuPrecision::q8, out, ex,
                           label);  // the routed rows are 4-bit
        }
      }
    }
  }
}

}  // namespace
}  // namespace lily::testing

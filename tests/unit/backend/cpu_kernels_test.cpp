// The CPU attention kernels cpu::dot_heads, dot_heads_pair, axpy_rows and axpy_rows_heads against
// float64 and against the properties their callers rely on: a head's dot does not depend on how
// many heads share the key or whether keys come in pairs, and axpy_rows (per head, axpy_rows_heads)
// is exactly `rows` axpy calls.
//
// Bound: a sum of n f32 products computed in any order is within gamma_n * sum |a_i b_i| of
// the exact sum, gamma_n = n u / (1 - n u), u = 2^-24 (Higham, *Accuracy and Stability of
// Numerical Algorithms*, 3.1); with the products' own rounding, n + 1 terms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

// Declared without target_clones here: the calls go to the library's dispatching symbol (a
// clones declaration in this file would make the compiler emit its own resolver, whose clone
// symbols live only in the library's object file).
#ifndef LILY_CPU_SINGLE_TARGET
#define LILY_CPU_SINGLE_TARGET 1
#endif
#include "backend/cpu/cpu_kernels.h"
#include "backend_test_support.h"

namespace lily::testing {
namespace {

double gamma(int64_t terms) {
  const double u = std::ldexp(1.0, -24);
  return static_cast<double>(terms) * u / (1.0 - static_cast<double>(terms) * u);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every head count the attention groups use (1..16, past one block of 8), lengths around the
// 8-lane blocks and the head dims 64/128/256, a stride with poisoned gaps.
TEST(CpuKernels, DotHeadsMatchesFloat64AndDoesNotDependOnTheHeadCount) {
  Rng rng(301);
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 128, 255, 256, 257}) {
    for (int64_t heads : {1, 2, 3, 5, 8, 9, 16}) {
      const int64_t stride = n + 5;  // gaps between heads, filled with NaN: never read
      std::vector<float> q(static_cast<size_t>(heads * stride), std::numeric_limits<float>::quiet_NaN());
      for (int64_t g = 0; g < heads; ++g) {
        for (int64_t i = 0; i < n; ++i) q[static_cast<size_t>(g * stride + i)] = rng.uniform(-2.0f, 2.0f);
      }
      const std::vector<float> k = rng.uniform_vector(static_cast<size_t>(n), -3.0f, 3.0f);
      std::vector<float> out(static_cast<size_t>(heads) + 1, 1e30f);
      cpu::dot_heads(q.data(), stride, heads, k.data(), n, out.data());
      EXPECT_EQ(out[static_cast<size_t>(heads)], 1e30f) << "wrote past `heads` outputs";
      for (int64_t g = 0; g < heads; ++g) {
        const std::string label = "n=" + std::to_string(n) + " heads=" + std::to_string(heads) + " g=" + std::to_string(g);
        double exact = 0, magnitude = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double p = static_cast<double>(q[static_cast<size_t>(g * stride + i)]) * static_cast<double>(k[static_cast<size_t>(i)]);
          exact += p;
          magnitude += std::fabs(p);
        }
        const double got = static_cast<double>(out[static_cast<size_t>(g)]);
        EXPECT_LE(std::fabs(got - exact), gamma(n + 1) * magnitude) << label;
        float alone = 0.0f;  // the same head on its own
        cpu::dot_heads(q.data() + g * stride, stride, 1, k.data(), n, &alone);
        EXPECT_TRUE(same_bits(alone, out[static_cast<size_t>(g)])) << label << ": " << alone << " vs " << out[static_cast<size_t>(g)];
      }
    }
  }
}

// axpy_rows_heads for one head over `rows` rows is bit for bit `rows` axpy calls in order over whole blocks of 8
// values (the attention value sums were written that way first; head dims are multiples of 8),
// and within the float64 bound everywhere; rows = 0 leaves y alone. The last n % 8 values are
// not held to the axpy bits: there the compiler may contract a multiply-add differently in the
// two loops (this test found the last bit differing at n = 7, 9, 17, 255).
TEST(CpuKernels, AxpyRowsHeadsIsRowsAxpyCallsInOrder) {
  Rng rng(302);
  for (int64_t n : {1, 7, 8, 9, 17, 64, 255, 256}) {
    for (int64_t rows : {0, 1, 2, 7, 8, 33}) {
      const int64_t stride = n + 3;
      std::vector<float> x(static_cast<size_t>(rows * stride + 1), std::numeric_limits<float>::quiet_NaN());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(r * stride + i)] = rng.uniform(-2.0f, 2.0f);
      }
      const std::vector<float> alpha = rng.uniform_vector(static_cast<size_t>(rows) + 1, 0.0f, 1.0f);
      const std::vector<float> y0 = rng.uniform_vector(static_cast<size_t>(n), -1.0f, 1.0f);
      std::vector<float> y = y0, by_axpy = y0;
      y.push_back(1e30f);  // a guard after the n outputs
      cpu::axpy_rows_heads(alpha.data(), 0, 1, rows, x.data(), stride, y.data(), 0, n);
      for (int64_t r = 0; r < rows; ++r) {
        cpu::axpy(alpha[static_cast<size_t>(r)], x.data() + r * stride, by_axpy.data(), n);
      }
      const std::string label = "n=" + std::to_string(n) + " rows=" + std::to_string(rows);
      EXPECT_EQ(y.back(), 1e30f) << label << ": wrote past n";
      for (int64_t i = 0; i < n; ++i) {
        const auto at = static_cast<size_t>(i);
        if (i < n - n % 8) {
          EXPECT_TRUE(same_bits(y[at], by_axpy[at])) << label << " at " << i << ": " << y[at] << " vs " << by_axpy[at];
        }
        double exact = static_cast<double>(y0[at]);
        double magnitude = std::fabs(exact);
        for (int64_t r = 0; r < rows; ++r) {
          const double p = static_cast<double>(alpha[static_cast<size_t>(r)]) * static_cast<double>(x[static_cast<size_t>(r * stride + i)]);
          exact += p;
          magnitude += std::fabs(p);
        }
        EXPECT_LE(std::fabs(static_cast<double>(y[at]) - exact), gamma(2 * rows + 1) * magnitude) << label << " at " << i;
      }
    }
  }
}

// dot_heads_pair gives, per key, dot_heads's bits; axpy_rows_heads gives, per head, axpy_rows's
// bits (everywhere: both run the same per-element code, tails included), and neither writes
// past its outputs. Head counts past one block of 8, lengths around the blocks.
TEST(CpuKernels, PairedKeysAndGroupedHeadsGiveTheSingleCallsBits) {
  Rng rng(303);
  for (int64_t n : {1, 7, 8, 9, 64, 255, 256}) {
    for (int64_t heads : {1, 3, 8, 9, 16}) {
      const std::string label = "n=" + std::to_string(n) + " heads=" + std::to_string(heads);
      const int64_t stride = n + 5;
      std::vector<float> q(static_cast<size_t>(heads * stride),
                           std::numeric_limits<float>::quiet_NaN());
      for (int64_t g = 0; g < heads; ++g) {
        for (int64_t i = 0; i < n; ++i)
          q[static_cast<size_t>(g * stride + i)] = rng.uniform(-2.0f, 2.0f);
      }
      const std::vector<float> k0 = rng.uniform_vector(static_cast<size_t>(n), -3.0f, 3.0f);
      const std::vector<float> k1 = rng.uniform_vector(static_cast<size_t>(n), -3.0f, 3.0f);
      std::vector<float> p0(static_cast<size_t>(heads) + 1, 1e30f), p1(p0), s0(p0), s1(p0);
      cpu::dot_heads_pair(q.data(), stride, heads, k0.data(), k1.data(), n, p0.data(), p1.data());
      cpu::dot_heads(q.data(), stride, heads, k0.data(), n, s0.data());
      cpu::dot_heads(q.data(), stride, heads, k1.data(), n, s1.data());
      for (size_t g = 0; g <= static_cast<size_t>(heads); ++g) {  // the guard at `heads` included
        EXPECT_TRUE(same_bits(p0[g], s0[g])) << label << " key 0 head " << g;
        EXPECT_TRUE(same_bits(p1[g], s1[g])) << label << " key 1 head " << g;
      }
      for (int64_t rows : {1, 5, 8}) {
        const int64_t x_stride = n + 3, alpha_stride = 8;
        const std::vector<float> x =
            rng.uniform_vector(static_cast<size_t>(rows * x_stride), -2.0f, 2.0f);
        const std::vector<float> alpha =
            rng.uniform_vector(static_cast<size_t>(heads * alpha_stride), 0.0f, 1.0f);
        const std::vector<float> y0 =
            rng.uniform_vector(static_cast<size_t>(heads * n) + 1, -1.0f, 1.0f);
        std::vector<float> grouped = y0, single = y0;
        cpu::axpy_rows_heads(alpha.data(), alpha_stride, heads, rows, x.data(), x_stride,
                             grouped.data(), n, n);
        for (int64_t g = 0; g < heads; ++g) {
          cpu::axpy_rows_heads(alpha.data() + g * alpha_stride, 0, 1, rows, x.data(), x_stride,
                               single.data() + g * n, 0, n);
        }
        for (size_t i = 0; i < grouped.size(); ++i) {  // the last element is a guard
          ASSERT_TRUE(same_bits(grouped[i], single[i])) << label << " rows=" << rows << " at " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lily::testing

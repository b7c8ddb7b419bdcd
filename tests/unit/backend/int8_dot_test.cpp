// The int8 GEMV kernel (backend/cpu/int8_dot.h) against float64 references, and every ISA path against the scalar one.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/int8_dot.h"
#include "backend_test_support.h"
#include "checkpoint/mlx_quant.h"
#include "core/bf16.h"

namespace lily::testing {
namespace {

using cpu::Int8Isa;
using cpu::Q8Activations;

constexpr Int8Isa kVectorPaths[] = {Int8Isa::avx512_vnni, Int8Isa::avx_vnni, Int8Isa::avx2};

// A buffer whose last byte sits right before a PROT_NONE page: a kernel that reads one byte past
// the end of a weight (a 512-bit load of a lone last group, say) crashes the test.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes) : bytes_(bytes) {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    pages_ = (bytes + page - 1) / page + 1;
    void* m = mmap(nullptr, pages_ * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("mmap failed");
    base_ = static_cast<std::byte*>(m);
    if (mprotect(base_ + (pages_ - 1) * page, page, PROT_NONE) != 0) {
      throw std::runtime_error("mprotect failed");
    }
    data_ = base_ + (pages_ - 1) * page - bytes;
  }
  ~GuardedBuffer() { munmap(base_, pages_ * static_cast<size_t>(sysconf(_SC_PAGESIZE))); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  std::byte* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  size_t bytes_;
  size_t pages_ = 0;
  std::byte* base_ = nullptr;
  std::byte* data_ = nullptr;
};

// An MLX affine weight [rows, in] with chosen codes, in guarded buffers: codes U32
// [rows, in * bits / 32], scales and biases BF16 [rows, in / 64].
class TestWeight {
 public:
  // code(row, col) and scale/bias(row, group) choose the contents.
  template <class Code, class Scale, class Bias>
  TestWeight(int bits, int64_t rows, int64_t in, Code code, Scale scale, Bias bias)
      : codes_(static_cast<size_t>(rows * in * bits / 8)),
        scales_(static_cast<size_t>(rows * in / 64 * 2)),
        biases_(static_cast<size_t>(rows * in / 64 * 2)) {
    std::memset(codes_.data(), 0, codes_.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < in; ++c) {
        const auto q = static_cast<uint32_t>(code(r, c));
        const int64_t bit = (r * in + c) * bits;  // MLX: element c at bits b*(c % (32/b)) of word c/(32/b)
        uint32_t word;
        std::memcpy(&word, codes_.data() + bit / 32 * 4, 4);
        word |= q << (bit % 32);
        std::memcpy(codes_.data() + bit / 32 * 4, &word, 4);
      }
      for (int64_t g = 0; g < in / 64; ++g) {
        const uint16_t s = f32_to_bf16(scale(r, g));
        const uint16_t b = f32_to_bf16(bias(r, g));
        std::memcpy(scales_.data() + (r * in / 64 + g) * 2, &s, 2);
        std::memcpy(biases_.data() + (r * in / 64 + g) * 2, &b, 2);
      }
    }
    view_.name = "test";
    view_.bits = bits;
    view_.out = static_cast<uint64_t>(rows);
    view_.in = static_cast<uint64_t>(in);
    view_.codes = codes_.data();
    view_.scales = scales_.data();
    view_.biases = biases_.data();
  }
  const QuantView& view() const { return view_; }

 private:
  GuardedBuffer codes_, scales_, biases_;
  QuantView view_;
};

// Random MLX-like groups: codes uniform, scale 0.002-0.03 (Q8: /16), bias about -scale * max/2.
TestWeight random_weight(Rng& rng, int bits, int64_t rows, int64_t in) {
  const int levels = 1 << bits;
  std::vector<float> s(static_cast<size_t>(rows * in / 64));
  std::vector<float> b(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] = rng.uniform(0.002f, 0.03f) * (bits == 8 ? 1.0f / 16.0f : 1.0f);
    b[i] = -s[i] * static_cast<float>(levels - 1) / 2.0f * rng.uniform(0.8f, 1.2f);
  }
  std::vector<int> q(static_cast<size_t>(rows * in));
  for (int& v : q) v = rng.below(levels);
  const int64_t groups = in / 64;
  return TestWeight(
      bits, rows, in, [&](int64_t r, int64_t c) { return q[static_cast<size_t>(r * in + c)]; },
      [&](int64_t r, int64_t g) { return s[static_cast<size_t>(r * groups + g)]; },
      [&](int64_t r, int64_t g) { return b[static_cast<size_t>(r * groups + g)]; });
}

// Activations whose groups differ in magnitude by up to 1e3 (real hidden states do), a few
// groups all zero when asked.
std::vector<float> random_input(Rng& rng, int64_t in, bool zero_groups) {
  std::vector<float> x(static_cast<size_t>(in));
  for (int64_t g = 0; g < in / 64; ++g) {
    const float magnitude = std::pow(10.0f, rng.uniform(-1.5f, 1.5f));
    const bool zero = zero_groups && g % 5 == 1;
    for (int64_t i = 0; i < 64; ++i) {
      x[static_cast<size_t>(g * 64 + i)] = zero ? 0.0f : magnitude * rng.uniform(-1.0f, 1.0f);
    }
  }
  return x;
}

// The codes of one row, read with the MLX reference accessor (not the kernel's byte layout).
std::vector<uint32_t> row_codes(const QuantView& w, int64_t row) {
  const auto in = static_cast<int64_t>(w.in);
  std::vector<uint32_t> words(static_cast<size_t>(in * w.bits / 32));
  std::memcpy(words.data(), w.codes + row * in * w.bits / 8, words.size() * 4);
  std::vector<uint32_t> q(static_cast<size_t>(in));
  for (int64_t c = 0; c < in; ++c) q[static_cast<size_t>(c)] = mlx_code(words, static_cast<uint64_t>(c), w.bits);
  return q;
}

double bf16_at(const std::byte* p, int64_t i) {
  uint16_t v;
  std::memcpy(&v, p + i * 2, 2);
  return static_cast<double>(bf16_to_f32(v));
}

// Float64 figures of one row.
struct RowRef {
  double quantised = 0;  // sum_g s*xs*sum(q*xq) + b*sums[g], xq = 128 hi + lo (one plane: hi):
                         // the kernel's maths
  double terms = 0;      // sum_g |s*xs*sum(q*xq)| + |b*sums[g]|: scale of its f32 rounding
  double exact = 0;      // sum_c (s*q_c + b) x_c with the unquantised x
  // The quantisation error bound: two planes, sum_g |s| * xs * (1/2 + 1e-3) * sum_i q_i (the
  // bias term is exact); one plane, sum_g xs * (1/2 + 1e-3) * sum_i |s*q_i + b| (sums[g] sums
  // the quantised x, so each element's error meets its whole weight).
  double bound = 0;
};

RowRef reference(const QuantView& w, int64_t row, const Q8Activations& xa, const std::vector<float>& x) {
  const auto in = static_cast<int64_t>(w.in);
  const int64_t groups = in / 64;
  const std::vector<uint32_t> q = row_codes(w, row);
  RowRef r;
  for (int64_t g = 0; g < groups; ++g) {
    const double s = bf16_at(w.scales, row * groups + g);
    const double b = bf16_at(w.biases, row * groups + g);
    const auto xs = static_cast<double>(xa.scales[static_cast<size_t>(g)]);
    const auto sum = static_cast<double>(xa.sums[static_cast<size_t>(g)]);
    double isum = 0, qsum = 0, wsum = 0;
    for (int64_t i = 0; i < 64; ++i) {
      const auto c = static_cast<size_t>(g * 64 + i);
      const double code = xa.planes == 1 ? xa.natural[c] : 128.0 * xa.natural[c] + xa.natural_lo[c];
      isum += static_cast<double>(q[c]) * code;
      qsum += static_cast<double>(q[c]);
      wsum += std::fabs(s * static_cast<double>(q[c]) + b);
      r.exact += (s * static_cast<double>(q[c]) + b) * static_cast<double>(x[c]);
    }
    r.quantised += s * xs * isum + b * sum;
    r.terms += std::fabs(s * xs * isum) + std::fabs(b * sum);
    // |xq - x/xs| <= 1/2 in units of xs (s_x / 128, or s_x with one plane), plus the f32
    // rounding of x / s_x (at most 127 * 2^-24 s_x, i.e. 128 * 127 * 2^-24 < 1e-3 units).
    r.bound += xs * (0.5 + 1e-3) * (xa.planes == 1 ? wsum : std::fabs(s) * qsum);
  }
  return r;
}

std::vector<Int8Isa> supported_paths() {
  std::vector<Int8Isa> paths;
  for (Int8Isa isa : kVectorPaths) {
    if (cpu::int8_isa_supported(isa)) paths.push_back(isa);
  }
  paths.push_back(Int8Isa::scalar);
  return paths;
}

Q8Activations quantise(const std::vector<float>& x, int planes = 2) {
  Q8Activations xa;
  cpu::quantize_activations(x.data(), static_cast<int64_t>(x.size()), xa, planes);
  return xa;
}

TEST(Int8Dot, ChoosesTheBestPathThisCpuHas) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") != 0 &&
                      __builtin_cpu_supports("avx512bw") != 0 &&
                      __builtin_cpu_supports("avx512vl") != 0 &&
                      __builtin_cpu_supports("avx512vnni") != 0;
  std::printf("[int8] path chosen: %s\n", cpu::int8_dot_isa());
  const std::string chosen = cpu::int8_dot_isa();
  if (avx512) {
    EXPECT_EQ(chosen, "avx512_vnni");
  } else if (avx2) {
    EXPECT_TRUE(chosen == "avx_vnni" || chosen == "avx2") << chosen;
  } else {
    EXPECT_EQ(chosen, "scalar");
  }
  EXPECT_EQ(std::string(cpu::int8_isa_name(Int8Isa::automatic)), chosen);
  EXPECT_TRUE(cpu::int8_isa_supported(Int8Isa::scalar));
  if (avx2) {
    EXPECT_TRUE(cpu::int8_isa_supported(Int8Isa::avx2));
  }
  // Forcing a path the CPU lacks is an error naming it, never a silent fallback.
  Rng rng(1);
  const TestWeight w = random_weight(rng, 4, 1, 64);
  const Q8Activations xa = quantise(random_input(rng, 64, false));
  for (Int8Isa isa : kVectorPaths) {
    if (cpu::int8_isa_supported(isa)) continue;
    try {
      cpu::int8_row_dot(w.view(), 0, xa, isa);
      ADD_FAILURE() << "forcing " << cpu::int8_isa_name(isa) << " did not throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(cpu::int8_isa_name(isa)), std::string::npos) << e.what();
    }
  }
}

TEST(Int8Dot, QuantisesSymmetricallyPerGroupInTheDocumentedLayouts) {
  Rng rng(2);
  for (int64_t in : {64, 192, 4096}) {
    std::vector<float> x = random_input(rng, in, true);
    x[3] = -std::fabs(x[3]) * 50.0f;  // a negative maximum: must give -127, never -128
    const Q8Activations xa = quantise(x);
    ASSERT_EQ(xa.in, in);
    const int64_t groups = in / 64;
    ASSERT_EQ(static_cast<int64_t>(xa.q4_order.size()), (groups + 1) / 2 * 128);
    ASSERT_EQ(static_cast<int64_t>(xa.q4_order_lo.size()), (groups + 1) / 2 * 128);
    ASSERT_EQ(static_cast<int64_t>(xa.natural_lo.size()), in);
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0;
      double sum = 0;
      for (int64_t i = 0; i < 64; ++i) {
        amax = std::max(amax, std::fabs(x[static_cast<size_t>(g * 64 + i)]));
        sum += static_cast<double>(x[static_cast<size_t>(g * 64 + i)]);
      }
      // The hi code's step s = max|x| / 127; the stored scale is the combined code's unit s / 128.
      const float scale = amax / 127.0f;
      EXPECT_EQ(xa.scales[static_cast<size_t>(g)], scale / 128.0f) << "group " << g;
      EXPECT_EQ(xa.sums[static_cast<size_t>(g)], static_cast<float>(sum)) << "group " << g;
      int max_code = 0;
      for (int64_t i = 0; i < 64; ++i) {
        const auto c = static_cast<size_t>(g * 64 + i);
        const int q = xa.natural[c];
        const int lo = xa.natural_lo[c];
        ASSERT_GE(q, -127);
        ASSERT_LE(q, 127);
        ASSERT_GE(lo, -64);
        ASSERT_LE(lo, 64);
        max_code = std::max(max_code, std::abs(q));
        if (scale == 0) {
          ASSERT_EQ(q, 0);
          ASSERT_EQ(lo, 0);
        } else {
          const double exact = static_cast<double>(x[c]) / static_cast<double>(scale);
          ASSERT_LE(std::fabs(q - exact), 0.5 + 1e-5) << "element " << c;
          // The two planes together: within half a unit of s / 128 (plus the f32 rounding).
          ASSERT_LE(std::fabs(128.0 * q + lo - 128.0 * exact), 0.5 + 1e-3) << "element " << c;
        }
        // Q4 order: element 2j at even[j], 2j+1 at even[64 + j], pairs of groups interleaved.
        const auto pos = static_cast<size_t>((g / 2) * 128 + (g % 2) * 32 + (i % 2) * 64 + i / 2);
        ASSERT_EQ(xa.q4_order[pos], xa.natural[c]) << "element " << c;
        ASSERT_EQ(xa.q4_order_lo[pos], xa.natural_lo[c]) << "element " << c;
      }
      EXPECT_EQ(max_code, scale == 0 ? 0 : 127) << "group " << g;
    }
    if (groups % 2 == 1) {  // the missing partner of a lone last group is zeros
      for (int64_t i = 0; i < 64; ++i) {
        const int64_t half = i < 32 ? 32 + i : 64 + i;  // bytes 32-63 and 96-127 of the last pair
        ASSERT_EQ(xa.q4_order[static_cast<size_t>((groups / 2) * 128 + half)], 0);
      }
    }
    // One plane: the same hi codes in both orders, no lo plane, the scale s itself and the sum
    // of what the codes approximate, s * sum(hi).
    const Q8Activations one = quantise(x, 1);
    ASSERT_EQ(one.planes, 1);
    EXPECT_TRUE(one.natural_lo.empty() && one.q4_order_lo.empty());
    EXPECT_EQ(one.natural, xa.natural);
    EXPECT_EQ(one.q4_order, xa.q4_order);
    for (int64_t g = 0; g < groups; ++g) {
      int64_t hi_sum = 0;
      for (int64_t i = 0; i < 64; ++i) hi_sum += one.natural[static_cast<size_t>(g * 64 + i)];
      const float s = xa.scales[static_cast<size_t>(g)] * 128.0f;
      EXPECT_EQ(one.scales[static_cast<size_t>(g)], s) << "group " << g;
      EXPECT_EQ(one.sums[static_cast<size_t>(g)], s * static_cast<float>(hi_sum)) << "group " << g;
    }
  }
}

TEST(Int8Dot, RejectsBadInput) {
  Rng rng(3);
  const TestWeight w = random_weight(rng, 4, 3, 128);
  Q8Activations xa;
  std::vector<float> x = random_input(rng, 128, false);
  EXPECT_THROW(cpu::quantize_activations(x.data(), 100, xa), std::invalid_argument);
  EXPECT_THROW(cpu::quantize_activations(x.data(), 0, xa), std::invalid_argument);
  x[70] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(cpu::quantize_activations(x.data(), 128, xa), std::invalid_argument);
  x[70] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(cpu::quantize_activations(x.data(), 128, xa), std::invalid_argument);
  x[70] = 1.0f;
  EXPECT_THROW(cpu::quantize_activations(x.data(), 128, xa, 3), std::invalid_argument);
  EXPECT_THROW(cpu::quantize_activations(x.data(), 128, xa, 0), std::invalid_argument);
  cpu::quantize_activations(x.data(), 128, xa);
  float y[4];
  EXPECT_THROW(cpu::int8_row_dot(w.view(), 3, xa), std::invalid_argument);
  EXPECT_THROW(cpu::int8_row_dot(w.view(), -1, xa), std::invalid_argument);
  EXPECT_THROW(cpu::int8_rows_dot(w.view(), 1, 3, xa, y), std::invalid_argument);
  EXPECT_NO_THROW(cpu::int8_rows_dot(w.view(), 1, 2, xa, y));
  const Q8Activations small = quantise(random_input(rng, 64, false));
  try {
    cpu::int8_row_dot(w.view(), 0, small);
    ADD_FAILURE() << "a width mismatch did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("takes 128 inputs, the activations hold 64"), std::string::npos)
        << e.what();
  }
  QuantView three_bits = w.view();
  three_bits.bits = 3;
  EXPECT_THROW(cpu::int8_row_dot(three_bits, 0, xa), std::invalid_argument);
}

// The core check, for Q4 and Q8, widths with 1, 3, 9 and 64 groups (a lone group, an odd pair,
// a block of 8 plus one, full blocks), the last rows against the guard page, every path:
// (1) each path within f32 rounding of the float64 value of the same quantised activations;
// (2) every vector path bit-identical to the scalar one, the automatic path included;
// (3) the quantisation error against the unquantised x within its bound, and printed.
TEST(Int8Dot, MatchesFloat64ReferencesAndEveryPathIsBitIdentical) {
  Rng rng(4);
  const std::vector<Int8Isa> paths = supported_paths();
  for (int planes : {2, 1}) {
    for (int bits : {4, 8}) {
      for (int64_t in : {64, 192, 576, 4096}) {
        const int64_t rows = in == 4096 ? 64 : 37;
        const TestWeight w = random_weight(rng, bits, rows, in);
        const std::vector<float> x = random_input(rng, in, true);
        const Q8Activations xa = quantise(x, planes);
        std::vector<float> scalar(static_cast<size_t>(rows));
        cpu::int8_rows_dot(w.view(), 0, rows, xa, scalar.data(), Int8Isa::scalar);
        std::vector<double> want_q(scalar.size()), want_x(scalar.size());
        double worst_rounding = 0, worst_bound_ratio = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const RowRef ref = reference(w.view(), r, xa, x);
          want_q[static_cast<size_t>(r)] = ref.quantised;
          want_x[static_cast<size_t>(r)] = ref.exact;
          const double got = static_cast<double>(scalar[static_cast<size_t>(r)]);
          // (1) f32 rounding: a few roundings per group term and a sum of groups/8 + 3 levels,
          // relative to the sum of the terms' magnitudes; 1e-6 is 17 units of 2^-24.
          ASSERT_LE(std::fabs(got - ref.quantised), 1e-6 * ref.terms)
              << "bits " << bits << " in " << in << " row " << r;
          worst_rounding = std::max(worst_rounding, std::fabs(got - ref.quantised) / ref.terms);
          // (3) the quantisation error bound, with the f32 rounding on top.
          const double err = std::fabs(got - ref.exact);
          ASSERT_LE(err, ref.bound + 1e-6 * ref.terms)
              << "bits " << bits << " in " << in << " row " << r;
          worst_bound_ratio = std::max(worst_bound_ratio, err / ref.bound);
        }
        const std::string label = std::to_string(planes) + " plane(s) q" + std::to_string(bits) +
                                  " in=" + std::to_string(in);
        const ErrorFigures fq = report("int8 vs same xq", label, scalar, want_q);
        const ErrorFigures fx = report("int8 vs f64 of x", label, scalar, want_x);
        std::printf("[int8] %s: worst f32 rounding %.2e of the terms, worst error/bound %.3f\n",
                    label.c_str(), worst_rounding, worst_bound_ratio);
        EXPECT_LT(fq.normalised, 1e-6);
        // Quantisation must show: an x that slipped through unquantised would give ~1e-7. With
        // both planes it is 1.8e-5 to 1.3e-4 here; with one, about 100 times that.
        if (planes == 2) {
          EXPECT_GT(fx.normalised, 3e-6) << label;
          EXPECT_LT(fx.normalised, 5e-4) << label;
        } else {
          EXPECT_GT(fx.normalised, 3e-4) << label;
          EXPECT_LT(fx.normalised, 3e-2) << label;
        }
        // (2) every path, multi-row and single-row, bit for bit.
        for (Int8Isa isa : paths) {
          std::vector<float> y(static_cast<size_t>(rows), -1.0f);
          cpu::int8_rows_dot(w.view(), 0, rows, xa, y.data(), isa);
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_EQ(std::bit_cast<uint32_t>(y[static_cast<size_t>(r)]),
                      std::bit_cast<uint32_t>(scalar[static_cast<size_t>(r)]))
                << cpu::int8_isa_name(isa) << " " << label << " row " << r;
          }
          // The last row alone (its codes end at the guard page) and a middle range.
          EXPECT_EQ(std::bit_cast<uint32_t>(cpu::int8_row_dot(w.view(), rows - 1, xa, isa)),
                    std::bit_cast<uint32_t>(scalar.back()))
              << cpu::int8_isa_name(isa) << " " << label;
          cpu::int8_rows_dot(w.view(), 5, rows - 5, xa, y.data(), isa);
          EXPECT_EQ(std::bit_cast<uint32_t>(y[0]), std::bit_cast<uint32_t>(scalar[5]));
        }
        std::vector<float> automatic(static_cast<size_t>(rows));
        cpu::int8_rows_dot(w.view(), 0, rows, xa, automatic.data());
        EXPECT_EQ(std::memcmp(automatic.data(), scalar.data(), automatic.size() * 4), 0) << label;
      }
    }
  }
}

// Extremes: every code at its maximum (15 or 255) or 0 against activations at +-127 (Q8's
// largest integer sum, 255 * 127 * 64, and the i16 pair sums of the AVX2 Q4 path), zero
// groups, a lone group (in = 64) and a group whose maximum is negative.
TEST(Int8Dot, ExtremeCodesAndActivations) {
  const std::vector<Int8Isa> paths = supported_paths();
  for (int planes : {2, 1}) {
    for (int bits : {4, 8}) {
      const int top = (1 << bits) - 1;
      for (int64_t in : {64, 576}) {
        const int64_t rows = 4;
        // Row 0: all codes max; row 1: all 0; row 2: alternating max/0; row 3: max where x > 0.
        std::vector<float> x(static_cast<size_t>(in));
        for (int64_t c = 0; c < in; ++c) {
          const int64_t g = c / 64;
          const float sign = (g % 3 == 2) ? -1.0f : 1.0f;               // some groups all negative
          x[static_cast<size_t>(c)] = g % 4 == 3 ? 0.0f : sign * 3.5f;  // every element at +-max
        }
        const TestWeight w(
            bits, rows, in,
            [&](int64_t r, int64_t c) {
              if (r == 0) return top;
              if (r == 1) return 0;
              if (r == 2) return c % 2 == 0 ? top : 0;
              return x[static_cast<size_t>(c)] > 0 ? top : 0;
            },
            [](int64_t, int64_t g) { return 0.01f * static_cast<float>(g + 1); },
            [](int64_t, int64_t g) { return -0.05f * static_cast<float>(g % 3); });
        const Q8Activations xa = quantise(x, planes);
        for (int64_t c = 0; c < in; ++c) {
          const int expect =
              x[static_cast<size_t>(c)] == 0 ? 0 : (x[static_cast<size_t>(c)] > 0 ? 127 : -127);
          ASSERT_EQ(xa.natural[static_cast<size_t>(c)], expect) << c;
        }
        for (Int8Isa isa : paths) {
          std::vector<float> y(static_cast<size_t>(rows));
          cpu::int8_rows_dot(w.view(), 0, rows, xa, y.data(), isa);
          for (int64_t r = 0; r < rows; ++r) {
            const RowRef ref = reference(w.view(), r, xa, x);
            EXPECT_LE(std::fabs(static_cast<double>(y[static_cast<size_t>(r)]) - ref.quantised),
                      1e-6 * ref.terms)
                << cpu::int8_isa_name(isa) << " bits " << bits << " in " << in << " row " << r;
            // Every x is exactly representable here (x = +-127 * scale up to one rounding), so
            // the quantised dot is the exact dot to f32 rounding.
            EXPECT_LE(std::fabs(ref.quantised - ref.exact), 1e-6 * ref.terms);
          }
        }
      }
    }
  }
}

// An all-zero input: every term is 0 and so is every result.
TEST(Int8Dot, ZeroInputGivesZero) {
  Rng rng(5);
  for (int bits : {4, 8}) {
    const TestWeight w = random_weight(rng, bits, 9, 320);
    const std::vector<float> x(320, 0.0f);
    const Q8Activations xa = quantise(x);
    for (float s : xa.scales) ASSERT_EQ(s, 0.0f);
    for (Int8Isa isa : supported_paths()) {
      std::vector<float> y(9, -1.0f);
      cpu::int8_rows_dot(w.view(), 0, 9, xa, y.data(), isa);
      for (float v : y) EXPECT_EQ(v, 0.0f) << cpu::int8_isa_name(isa);
    }
  }
}

// The many-token kernel of prefill (int8_rows_dot_tokens) against the one-token dot, bit for bit:
// Q4 and Q8; 1, 3, 9 and 64 groups (a lone group, an odd pair, a partial last block, full
// blocks); token counts around the tile of 16 (odd ones included), gathered in a permuted order
// with repeats (as the MoE passes them); odd row counts (the last tile of one row) up to the
// matrix's last row (its codes end at the guard page); an output stride wider than the rows,
// whose gaps must stay untouched; every path, forced.
TEST(Int8Dot, ManyTokensGiveTheOneTokenDotsBitForBit) {
  Rng rng(6);
  for (int planes : {2, 1}) {
    for (int bits : {4, 8}) {
      for (int64_t in : {64, 192, 576, 4096}) {
        const int64_t rows = in == 4096 ? 21 : 37;
        const TestWeight w = random_weight(rng, bits, rows, in);
        std::vector<Q8Activations> pool;
        for (int i = 0; i < 20; ++i)
          pool.push_back(quantise(random_input(rng, in, i % 3 == 0), planes));
        for (int64_t n : {1, 3, 16, 17, 33}) {
          std::vector<const Q8Activations*> xs;
          for (int64_t t = 0; t < n; ++t)
            xs.push_back(&pool[static_cast<size_t>((t * 7 + t / 5) % 20)]);
          const int64_t row_begin = 4;
          const int64_t count = rows - row_begin;  // odd: 33 or 17, ends at the last row
          const int64_t stride = count + 3;
          std::vector<float> want(static_cast<size_t>(n * count));
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t r = 0; r < count; ++r) {
              want[static_cast<size_t>(t * count + r)] = cpu::int8_row_dot(
                  w.view(), row_begin + r, *xs[static_cast<size_t>(t)], Int8Isa::scalar);
            }
          }
          for (Int8Isa isa : {Int8Isa::automatic, Int8Isa::avx512_vnni, Int8Isa::avx_vnni,
                              Int8Isa::avx2, Int8Isa::scalar}) {
            if (!cpu::int8_isa_supported(isa)) continue;
            const std::string label = std::string(cpu::int8_isa_name(isa)) + " planes " +
                                      std::to_string(planes) + " q" + std::to_string(bits) +
                                      " in=" + std::to_string(in) + " n=" + std::to_string(n);
            std::vector<float> y(static_cast<size_t>(n * stride), -7.0f);
            cpu::int8_rows_dot_tokens(w.view(), row_begin, count, xs.data(), n, y.data(), stride,
                                      isa);
            for (int64_t t = 0; t < n; ++t) {
              for (int64_t r = 0; r < stride; ++r) {
                const float got = y[static_cast<size_t>(t * stride + r)];
                if (r >= count) {
                  ASSERT_EQ(got, -7.0f)
                      << label << ": wrote the stride gap at token " << t << " col " << r;
                  continue;
                }
                ASSERT_EQ(std::bit_cast<uint32_t>(got),
                          std::bit_cast<uint32_t>(want[static_cast<size_t>(t * count + r)]))
                    << label << " token " << t << " row " << row_begin + r;
              }
            }
          }
        }
      }
    }
  }
}

// Extreme codes and activations through the many-token kernel (the largest integer sums: Q8's
// 255 * 127 * 64 in both planes, combined before the reduction), every path bit for bit.
TEST(Int8Dot, ManyTokensExtremeCodes) {
  for (int planes : {2, 1}) {
    for (int bits : {4, 8}) {
      const int top = (1 << bits) - 1;
      const int64_t in = 576;
      std::vector<float> x(static_cast<size_t>(in)), xneg(x.size());
      for (int64_t c = 0; c < in; ++c) {
        x[static_cast<size_t>(c)] = 3.5f;
        xneg[static_cast<size_t>(c)] = c % 64 == 0 ? 3.5f : -3.5f;
      }
      const TestWeight w(
          bits, 3, in,
          [&](int64_t r, int64_t c) { return r == 1 ? 0 : (r == 0 || c % 2 == 0 ? top : 0); },
          [](int64_t, int64_t g) { return 0.01f * static_cast<float>(g + 1); },
          [](int64_t, int64_t g) { return -0.05f * static_cast<float>(g % 3); });
      const Q8Activations a = quantise(x, planes), b = quantise(xneg, planes);
      const Q8Activations* xs[] = {&a, &b, &a};
      for (Int8Isa isa : supported_paths()) {
        float y[9];
        cpu::int8_rows_dot_tokens(w.view(), 0, 3, xs, 3, y, 3, isa);
        for (int64_t t = 0; t < 3; ++t) {
          for (int64_t r = 0; r < 3; ++r) {
            EXPECT_EQ(
                std::bit_cast<uint32_t>(y[t * 3 + r]),
                std::bit_cast<uint32_t>(cpu::int8_row_dot(w.view(), r, *xs[t], Int8Isa::scalar)))
                << cpu::int8_isa_name(isa) << " planes " << planes << " bits " << bits << " token "
                << t << " row " << r;
          }
        }
      }
    }
  }
}

TEST(Int8Dot, ManyTokensRejectsBadArguments) {
  Rng rng(7);
  const TestWeight w = random_weight(rng, 4, 3, 128);
  const Q8Activations a = quantise(random_input(rng, 128, false));
  const Q8Activations narrow = quantise(random_input(rng, 64, false));
  float y[16];
  auto message = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no error)";
  };
  const Q8Activations* ok[] = {&a, &a};
  EXPECT_NO_THROW(cpu::int8_rows_dot_tokens(w.view(), 1, 2, ok, 2, y, 2));
  const Q8Activations* with_null[] = {&a, nullptr};
  EXPECT_NE(message([&] { cpu::int8_rows_dot_tokens(w.view(), 0, 3, with_null, 2, y, 3); }).find("token 1 is null"),
            std::string::npos);
  const Q8Activations* mixed[] = {&a, &narrow};
  EXPECT_NE(message([&] { cpu::int8_rows_dot_tokens(w.view(), 0, 3, mixed, 2, y, 3); })
                .find("takes 128 inputs, the activations hold 64"),
            std::string::npos);
  const Q8Activations one_plane = quantise(random_input(rng, 128, false), 1);
  const Q8Activations* mixed_planes[] = {&a, &one_plane};
  EXPECT_NE(message([&] {
              cpu::int8_rows_dot_tokens(w.view(), 0, 3, mixed_planes, 2, y, 3);
            }).find("token 1 is quantised in 1 planes, token 0 in 2"),
            std::string::npos);
  EXPECT_NE(message([&] { cpu::int8_rows_dot_tokens(w.view(), 0, 3, ok, 2, y, 2); }).find("stride 2 below the 3 rows"),
            std::string::npos);
  EXPECT_NE(message([&] { cpu::int8_rows_dot_tokens(w.view(), 1, 3, ok, 2, y, 3); }).find("outside weight"),
            std::string::npos);
  EXPECT_NE(message([&] { cpu::int8_rows_dot_tokens(w.view(), 0, 3, ok, -1, y, 3); }).find("token count -1"),
            std::string::npos);
  EXPECT_NE(message([&] { cpu::int8_rows_dot_tokens(w.view(), 0, 3, ok, 2, nullptr, 3); }).find("no output buffer"),
            std::string::npos);
  for (Int8Isa isa : kVectorPaths) {
    if (cpu::int8_isa_supported(isa)) continue;
    EXPECT_NE(message([&] { cpu::int8_rows_dot_tokens(w.view(), 0, 3, ok, 2, y, 3, isa); }).find(cpu::int8_isa_name(isa)),
              std::string::npos);
  }
}

}  // namespace
}  // namespace lily::testing

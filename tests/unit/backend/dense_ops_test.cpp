// CPU backend vs the float64 reference: embed, matmul, the three RMSNorms, moe_route and argmax.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "checkpoint/mlx_quant.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

// Tolerance for ops that are a handful of f32 roundings per output, or an f32 sum of up to a
// few thousand terms: f32 unit roundoff is 6e-8 and the accumulated relative error of such
// sums stays below ~1e-6 on these inputs (the observed figures are 1e-8..1e-7), so 1e-5
// leaves a wide margin while any wrong index, missing term or wrong constant shows up as
// 1e-3..1 (a single wrong weight group of 64 among 256 inputs is already ~1e-1).
constexpr double kTol = 1e-5;
constexpr float kEps = 1e-6f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<double> widen(const std::vector<float>& v) { return ref::widen(v); }

TEST(BackendEmbed, MatchesReferenceAndMlxDequantBitwise) {
  Rng rng(11);
  auto be = cpu();
  for (int bits : {4, 8}) {
    const QuantWeight table(rng, bits, 1, 50, 192, bits == 4 ? 0 : 3, "embed");
    const std::vector<int32_t> ids = {0, 49, 7, 7, 23, 0, 48};
    const auto n = static_cast<int64_t>(ids.size());
    std::vector<float> out(ids.size() * 192, -1.0f);
    be->embed(table.view(), ids.data(), n, out.data());
    const ErrorFigures f = report("embed", "q" + std::to_string(bits) + " n=7 repeated ids", out,
                                  ref::embed(table.view(), ids));
    // One f32 rounding of an exact double value: 2^-24 relative per element.
    EXPECT_LT(f.normalised, 1e-7);
    // The MLX dequantisation (f32 multiply then add) is what embed must produce exactly.
    std::vector<float> row(192);
    for (size_t t = 0; t < ids.size(); ++t) {
      dequantize_row(table.view(), static_cast<uint64_t>(ids[t]), row);
      for (size_t c = 0; c < row.size(); ++c) {
        ASSERT_EQ(out[t * 192 + c], row[c]) << "bits " << bits << " token " << t << " col " << c;
      }
    }
  }
}

struct RowRange {
  int64_t begin, rows;
};

TEST(BackendMatmul, Q4AndQ8RowRangesAndTokenCounts) {
  Rng rng(12);
  auto be = cpu(3);  // 3 threads on small row counts: uneven splits
  for (int bits : {4, 8}) {
    const uint64_t out = bits == 4 ? 48 : 40;
    const uint64_t in = bits == 4 ? 256 : 192;  // 192: a multiple of 64 that is not of 128
    const QuantWeight w(rng, bits, 1, out, in);
    const auto R = static_cast<int64_t>(out);
    for (const RowRange range : {RowRange{0, R}, RowRange{5, 17}, RowRange{R - 1, 1},
                                 RowRange{R - 7, 7}}) {
      for (int64_t n : {1, 2, 7, 33}) {
        const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * in, -2.0f, 2.0f);
        std::vector<float> y(static_cast<size_t>(n * range.rows), 1e30f);
        be->matmul(w.view(), range.begin, range.rows, x.data(), n, y.data());
        const std::string label = std::string("q") + std::to_string(bits) + " rows[" +
                                  std::to_string(range.begin) + ",+" +
                                  std::to_string(range.rows) + ") n=" + std::to_string(n);
        const ErrorFigures f =
            report("matmul", label, y, ref::matmul(w.view(), range.begin, range.rows, widen(x), n));
        EXPECT_LT(f.normalised, kTol) << label;
      }
    }
  }
}

TEST(BackendMatmul, ModelWidthInputsAndUnalignedViews) {
  Rng rng(13);
  auto be = cpu();
  for (int bits : {4, 8}) {
    // in = 2048 (the hidden size): 32 groups per row; every buffer 1 byte off alignment.
    const QuantWeight w(rng, bits, 1, 24, 2048, 1);
    for (int64_t n : {1, 5}) {
      const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * 2048, -3.0f, 3.0f);
      std::vector<float> y(static_cast<size_t>(n) * 24);
      be->matmul(w.view(), 0, 24, x.data(), n, y.data());
      const std::string label = "q" + std::to_string(bits) + " in=2048 unaligned n=" + std::to_string(n);
      const ErrorFigures f = report("matmul", label, y, ref::matmul(w.view(), 0, 24, widen(x), n));
      EXPECT_LT(f.normalised, kTol) << label;
    }
  }
}

TEST(BackendMatmul, PositiveInputsWhereTheBiasTermCancels) {
  // The backend (like MLX) evaluates each group as s * sum(q x) + b * sum(x). With x all
  // positive and b ~ -7.5 s, the two terms are ~10x the result and cancel: this is the
  // worst conditioning of that form on realistic weights, still well inside 1e-5.
  Rng rng(15);
  auto be = cpu();
  for (int bits : {4, 8}) {
    const QuantWeight w(rng, bits, 1, 32, 1024);
    for (int64_t n : {1, 3}) {
      const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * 1024, 0.0f, 2.0f);
      std::vector<float> y(static_cast<size_t>(n) * 32);
      be->matmul(w.view(), 0, 32, x.data(), n, y.data());
      const std::string label = "q" + std::to_string(bits) + " x in [0,2) in=1024 n=" + std::to_string(n);
      const ErrorFigures f = report("matmul", label, y, ref::matmul(w.view(), 0, 32, widen(x), n));
      EXPECT_LT(f.normalised, kTol) << label;
    }
  }
}

TEST(BackendMatmul, StackedExpertRowsAreAddressedAsOneMatrix) {
  Rng rng(14);
  auto be = cpu();
  const QuantWeight w(rng, 4, 4, 16, 128);  // rows e * 16 + r
  const std::vector<float> x = rng.uniform_vector(3 * 128, -1.0f, 1.0f);
  std::vector<float> y(3 * 20);
  be->matmul(w.view(), 30, 20, x.data(), 3, y.data());  // spans experts 1..3
  const ErrorFigures f =
      report("matmul", "q4 stacked experts rows[30,+20) n=3", y, ref::matmul(w.view(), 30, 20, widen(x), 3));
  EXPECT_LT(f.normalised, kTol);
}

TEST(BackendMatmul, GroupRunsEveryTargetOnTheSameInput) {
  Rng rng(57);
  auto be = cpu(2);
  const QuantWeight a(rng, 4, 1, 24, 128, 0, "a");
  const QuantWeight b(rng, 8, 1, 5, 128, 1, "b");
  for (int64_t n : {1, 3}) {
    const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * 128, -2.0f, 2.0f);
    std::vector<float> ya(static_cast<size_t>(n) * 16, 1e30f);
    std::vector<float> yb(static_cast<size_t>(n) * 5, 1e30f);
    const MatmulTarget targets[] = {{&a.view(), 8, 16, ya.data()}, {&b.view(), 0, 5, yb.data()}};
    be->matmul_group(targets, x.data(), n);
    const std::string label = "n=" + std::to_string(n);
    EXPECT_LT(report("matmul_group", label + " a", ya, ref::matmul(a.view(), 8, 16, widen(x), n)).normalised, kTol);
    EXPECT_LT(report("matmul_group", label + " b", yb, ref::matmul(b.view(), 0, 5, widen(x), n)).normalised, kTol);
  }
  const MatmulTarget null_weight[] = {{nullptr, 0, 1, nullptr}};
  std::vector<float> x(128, 1.0f);
  EXPECT_THROW(be->matmul_group(null_weight, x.data(), 1), std::invalid_argument);
}

TEST(BackendRmsNorm, RandomRowsBf16AndF32Gains) {
  Rng rng(21);
  auto be = cpu();
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (int64_t dim : {64, 100, 2048}) {
      const std::vector<float> g = rng.uniform_vector(static_cast<size_t>(dim), 0.5f, 1.5f);
      const DenseTensor gain(dtype, {static_cast<uint64_t>(dim)}, g);
      const int64_t n = 3;
      const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n * dim), -4.0f, 4.0f);
      std::vector<float> out(x.size());
      be->rms_norm(x.data(), gain.view(), n, dim, kEps, out.data());
      const std::string label = std::string(dtype == DType::F32 ? "f32" : "bf16") +
                                " gain dim=" + std::to_string(dim) + " n=3";
      const ErrorFigures f = report("rms_norm", label, out,
                                    ref::rms_norm(widen(x), gain.view(), n, dim, static_cast<double>(kEps)));
      EXPECT_LT(f.normalised, kTol) << label;
    }
  }
}

TEST(BackendRmsNorm, ZeroTinyAndLargeRows) {
  // Row 0 all zero (output 0), row 1 ~1e-20 (eps dominates: output ~x/1e-3), row 2 ~1e15
  // (x^2 ~1e30 still fits in f32, as it must for the f32 sum the model does).
  Rng rng(22);
  auto be = cpu();
  const int64_t dim = 256;
  const std::vector<float> g = rng.uniform_vector(dim, 0.5f, 1.5f);
  const DenseTensor gain(DType::BF16, {dim}, g);
  std::vector<float> x(3 * dim, 0.0f);
  for (int64_t i = 0; i < dim; ++i) {
    x[static_cast<size_t>(dim + i)] = rng.uniform(-1.0f, 1.0f) * 1e-20f;
    x[static_cast<size_t>(2 * dim + i)] = rng.uniform(-1.0f, 1.0f) * 1e15f;
  }
  std::vector<float> out(x.size(), 7.0f);
  be->rms_norm(x.data(), gain.view(), 3, dim, kEps, out.data());
  const std::vector<double> want = ref::rms_norm(widen(x), gain.view(), 3, dim, static_cast<double>(kEps));
  for (int64_t t = 0; t < 3; ++t) {
    const auto b = static_cast<size_t>(t * dim);
    const std::span<const float> got_row(out.data() + b, static_cast<size_t>(dim));
    const std::span<const double> want_row(want.data() + b, static_cast<size_t>(dim));
    const char* names[] = {"zero row", "row ~1e-20 (eps-dominated)", "row ~1e15"};
    const ErrorFigures f = report("rms_norm", names[t], got_row, want_row);
    EXPECT_LT(f.normalised, kTol) << names[t];
  }
  for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], 0.0f);
}

TEST(BackendAddRmsNorm, UpdatesResidualAndNormalises) {
  Rng rng(23);
  auto be = cpu();
  const int64_t dim = 512;
  for (int64_t n : {1, 4}) {
    const DenseTensor gain(DType::BF16, {dim}, rng.uniform_vector(dim, 0.8f, 1.3f));
    std::vector<float> residual = rng.uniform_vector(static_cast<size_t>(n * dim), -10.0f, 10.0f);
    const std::vector<float> delta = rng.uniform_vector(residual.size(), -1.0f, 1.0f);
    std::vector<double> ref_residual = widen(residual);
    std::vector<float> out(residual.size());
    be->add_rms_norm(residual.data(), delta.data(), gain.view(), n, dim, kEps, out.data());
    const std::vector<double> want =
        ref::add_rms_norm(ref_residual, widen(delta), gain.view(), n, dim, static_cast<double>(kEps));
    const std::string label = "dim=512 n=" + std::to_string(n);
    const ErrorFigures fr = report("add_rms_norm", label + " residual", residual, ref_residual);
    const ErrorFigures fo = report("add_rms_norm", label + " out", out, want);
    EXPECT_LT(fr.normalised, 1e-7) << "one f32 rounding per element";
    EXPECT_LT(fo.normalised, kTol);
  }
}

TEST(BackendGatedRmsNorm, PerHeadNormTimesSiluGate) {
  Rng rng(24);
  auto be = cpu();
  for (DType dtype : {DType::F32, DType::BF16}) {
    const int64_t rows = 3 * 4;  // n = 3 tokens x 4 value heads
    const int64_t dim = 128;
    // A plain gain (no +1), around the 1.0 it is initialised to.
    const DenseTensor gain(dtype, {dim}, rng.uniform_vector(dim, 0.5f, 1.5f));
    const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(rows * dim), -2.0f, 2.0f);
    std::vector<float> z = rng.uniform_vector(x.size(), -6.0f, 6.0f);
    z[0] = -90.0f;  // silu -> -0 (exp overflow side)
    z[1] = 90.0f;   // silu -> z
    std::vector<float> out(x.size());
    be->gated_rms_norm(x.data(), z.data(), gain.view(), rows, dim, kEps, out.data());
    const std::string label = std::string(dtype == DType::F32 ? "f32" : "bf16") + " gain rows=12 dim=128";
    const ErrorFigures f = report("gated_rms_norm", label, out,
                                  ref::gated_rms_norm(widen(x), widen(z), gain.view(), rows, dim,
                                                      static_cast<double>(kEps)));
    EXPECT_LT(f.normalised, kTol) << label;
  }
}

void expect_route(Backend& be, const std::vector<float>& logits, int64_t n, int64_t E, int64_t k,
                  const std::string& label) {
  std::vector<int32_t> ids(static_cast<size_t>(n * k), -1);
  std::vector<float> weights(ids.size(), -1.0f);
  be.moe_route(logits.data(), n, E, k, ids.data(), weights.data());
  const ref::Routing want = ref::moe_route(widen(logits), n, E, k);
  EXPECT_EQ(ids, want.ids) << label;
  const ErrorFigures f = report("moe_route", label, weights, want.weights);
  EXPECT_LT(f.normalised, kTol) << label;
}

TEST(BackendMoeRoute, RandomLogitsTopK) {
  Rng rng(31);
  auto be = cpu();
  expect_route(*be, rng.uniform_vector(5 * 256, -4.0f, 4.0f), 5, 256, 8, "E=256 k=8 n=5");
  expect_route(*be, rng.uniform_vector(3 * 10, -30.0f, 30.0f), 3, 10, 3, "E=10 k=3 wide logits");
}

TEST(BackendMoeRoute, AllTiedPicksLowestIdsWithEqualWeights) {
  auto be = cpu();
  const std::vector<float> logits(2 * 16, 0.75f);
  std::vector<int32_t> ids(2 * 4);
  std::vector<float> weights(ids.size());
  be->moe_route(logits.data(), 2, 16, 4, ids.data(), weights.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  for (float w : weights) EXPECT_FLOAT_EQ(w, 0.25f);
  // Partial ties: 3.0 at ids 1, 2, 4; k = 2 takes 1 and 2; k = 4 then 3 (2.0).
  expect_route(*be, {1, 3, 3, 2, 3}, 1, 5, 2, "partial tie k=2");
  expect_route(*be, {1, 3, 3, 2, 3}, 1, 5, 4, "partial tie k=4");
}

TEST(BackendMoeRoute, NegativeInfinityLogitsAndKEqualsE) {
  auto be = cpu();
  // -inf experts have probability 0: chosen only when k exceeds the finite ones, lowest id first.
  expect_route(*be, {kNegInf, 1.0f, kNegInf, 2.0f, kNegInf, 0.5f}, 1, 6, 3, "-inf, k=finite count");
  expect_route(*be, {kNegInf, 1.0f, kNegInf, 2.0f, kNegInf, 0.5f}, 1, 6, 5, "-inf, k>finite count");
  expect_route(*be, {kNegInf, kNegInf, 5.0f, kNegInf}, 1, 4, 1, "single finite expert");
  Rng rng(32);
  expect_route(*be, rng.uniform_vector(2 * 12, -3.0f, 3.0f), 2, 12, 12, "k=E=12");
}

TEST(BackendArgmax, TiesInfinitiesAndRandomRows) {
  Rng rng(41);
  auto be = cpu();
  const int64_t V = 1000;
  std::vector<float> logits = rng.uniform_vector(6 * V, -10.0f, 10.0f);
  float* row = logits.data();
  row[500] = 50.0f;  // row 0: a clear maximum in the middle
  row = logits.data() + V;
  for (int64_t i = 0; i < V; ++i) row[i] = 1.0f;  // row 1: all tied -> 0
  row = logits.data() + 2 * V;
  row[V - 1] = 20.0f;  // row 2: max duplicated, first one wins
  row[300] = 20.0f;
  row[999 - 1] = 20.0f;
  row = logits.data() + 3 * V;
  for (int64_t i = 0; i < V; ++i) row[i] = kNegInf;  // row 3: all -inf -> 0
  row[777] = -1e30f;  // ... except one very negative finite value
  row = logits.data() + 4 * V;
  row[0] = kNegInf;  // row 4: -inf at 0, +inf twice later
  row[10] = std::numeric_limits<float>::infinity();
  row[20] = std::numeric_limits<float>::infinity();
  row = logits.data() + 5 * V;
  row[V - 1] = 11.0f;  // row 5: the last index
  std::vector<int32_t> out(6, -1);
  be->argmax(logits.data(), 6, V, out.data());
  EXPECT_EQ(out, ref::argmax(widen(logits), 6, V));
  EXPECT_EQ(out, (std::vector<int32_t>{500, 0, 300, 777, 10, static_cast<int32_t>(V - 1)}));
  std::vector<float> all_neg_inf(5, kNegInf);
  int32_t single = -1;
  be->argmax(all_neg_inf.data(), 1, 5, &single);
  EXPECT_EQ(single, 0);
}

}  // namespace
}  // namespace lily::testing

// CUDA prefill kernels (matmul n > 8 on tensor cores, grouped expert SwiGLU and down-combine)
// against the float64 reference and the CPU backend, through the Backend interface.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "cuda_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

// Tolerance. The prefill kernels compute the exact-code form of the MLX affine product:
// y = sum_g (s_g * sum_c q_c x_c + b_g * sum_c x_c) with the integer codes q exact in BF16,
// each activation split into two BF16 terms hi + lo (x to ~2^-17 relative), f32 accumulation
// on the tensor cores per 64-column group, and the per-group scale and bias applied in f32.
// So the results agree with the float64 reference to ~1e-6..1e-5 normalised (the split error
// plus f32 roundings), close to the f32 GEMV and the CPU backend. 1e-4 leaves a margin of
// ~10x, while a wrong index, a missing group, a wrong scale or bias, a wrong expert, an
// unwritten output (outputs start as 1e30) or a regression to plain BF16 operands (~2e-3)
// shows up well above it. The comparison against the CPU backend uses the same bound.
constexpr double kTol = 1e-4;
constexpr float kUnwritten = 1e30f;

std::vector<double> widen(const std::vector<float>& v) { return ref::widen(v); }

std::string bits_label(int bits) { return "q" + std::to_string(bits); }

float* unwritten(Backend& be, size_t count) { return to_device(be, std::vector<float>(count, kUnwritten)); }

// ---- matmul (n > 8: the tensor-core GEMM) -----------------------------------------------------

void check_matmul(Backend& be, Backend& host, const QuantWeight& w, int64_t row_begin, int64_t rows,
                  int64_t n, Rng& rng, const std::string& label, float lo = -2.0f, float hi = 2.0f) {
  const auto in = static_cast<int64_t>(w.view().in);
  const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n * in), lo, hi);
  float* y_dev = unwritten(be, static_cast<size_t>(n * rows));
  const uint64_t gemms = path_counts(be).tensor_core_gemm;
  be.matmul(w.view(), row_begin, rows, to_device(be, x), n, y_dev);
  EXPECT_EQ(path_counts(be).tensor_core_gemm, gemms + 1) << label << ": the tensor-core GEMM ran";
  const std::vector<float> got = to_host(be, y_dev, static_cast<size_t>(n * rows));

  const ErrorFigures f = report("matmul", label, got, ref::matmul(w.view(), row_begin, rows, widen(x), n));
  EXPECT_LT(f.normalised, kTol) << label;

  std::vector<float> cpu_y(static_cast<size_t>(n * rows), kUnwritten);
  host.matmul(w.view(), row_begin, rows, x.data(), n, cpu_y.data());
  const ErrorFigures c = report("matmul", label + " vs cpu", got, widen(cpu_y));
  EXPECT_LT(c.normalised, kTol) << label << " vs cpu";
}

struct RowRange {
  int64_t begin, rows;
};

TEST(CudaGemm, Q4AndQ8TokenCountsWidthsAndRowRanges) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(401);
  for (int bits : {4, 8}) {
    // 64: a single K tile; 192: three tiles (not a multiple of 128). 300 weight rows: two full
    // 128-row tiles and a ragged one; the ranges start mid-tile and end mid-tile.
    for (uint64_t in : {uint64_t{64}, uint64_t{128}, uint64_t{192}}) {
      const QuantWeight w(rng, bits, 1, 300, in, 0, "w");
      // 9, 17: barely above the GEMV limit; 64: one full 64-token tile; 65: 128-token tiles,
      // ragged; 300: several tiles, ragged.
      for (int64_t n : {9, 17, 64, 65, 300}) {
        for (const RowRange r : {RowRange{0, 300}, RowRange{0, 100}, RowRange{37, 201}, RowRange{293, 7}}) {
          check_matmul(*be, *host, w, r.begin, r.rows, n, rng,
                       bits_label(bits) + " [300, " + std::to_string(in) + "] rows[" + std::to_string(r.begin) +
                           ",+" + std::to_string(r.rows) + ") n=" + std::to_string(n));
        }
      }
    }
  }
}

TEST(CudaGemm, ModelWidthInputsAndUnalignedViews) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(402);
  for (int bits : {4, 8}) {
    // in = 2048: 32 K tiles; every host buffer 1 byte off alignment (the upload realigns).
    const QuantWeight w(rng, bits, 1, 100, 2048, 1, "w");
    for (int64_t n : {9, 300}) {
      check_matmul(*be, *host, w, 0, 100, n, rng,
                   bits_label(bits) + " [100, 2048] unaligned n=" + std::to_string(n));
    }
  }
  // The Q8 router and the one-row shared-expert gate as prefill sees them.
  const QuantWeight router(rng, 8, 1, 256, 2048, 0, "router");
  const QuantWeight gate(rng, 8, 1, 1, 2048, 0, "shared_expert_gate");
  check_matmul(*be, *host, router, 0, 256, 64, rng, "q8 router [256, 2048] n=64");
  check_matmul(*be, *host, gate, 0, 1, 200, rng, "q8 shared gate [1, 2048] n=200");
}

TEST(CudaGemm, PositiveInputsWhereTheBiasTermCancels) {
  // x > 0 and bias ~ -7.5 scale: s * sum(q x) + b * sum(x) cancels (the CPU's form and the
  // GEMM's). The GEMM's group sums are of the same split values hi + lo that the MMAs see, so
  // the split error acts through the effective weights s q + b and is not amplified.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(403);
  for (int bits : {4, 8}) {
    const QuantWeight w(rng, bits, 1, 32, 1024, 0, "w");
    check_matmul(*be, *host, w, 0, 32, 33, rng, bits_label(bits) + " x in [0,2) [32, 1024] n=33", 0.0f, 2.0f);
  }
}

TEST(CudaGemm, StackedExpertRowsAreAddressedAsOneMatrix) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(404);
  const QuantWeight w(rng, 4, 4, 16, 128, 0, "experts");  // rows e * 16 + r
  check_matmul(*be, *host, w, 30, 20, 33, rng, "q4 stacked experts rows[30,+20) n=33");
  check_matmul(*be, *host, w, 0, 64, 9, rng, "q4 stacked experts rows[0,+64) n=9");
}

TEST(CudaGemm, CapturedReplayMatchesEagerRun) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  if (!be->can_capture()) GTEST_SKIP() << "backend cannot capture";
  Rng rng(405);
  const QuantWeight w(rng, 4, 1, 256, 512, 0, "w");
  const int64_t n = 100;
  const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * 512, -1.0f, 1.0f);
  float* x_dev = to_device(*be, x);
  float* eager = unwritten(*be, static_cast<size_t>(n) * 256);
  float* replayed = unwritten(*be, static_cast<size_t>(n) * 256);
  be->matmul(w.view(), 0, 256, x_dev, n, eager);  // sizes the workspace outside capture
  be->begin_capture();
  be->matmul(w.view(), 0, 256, x_dev, n, replayed);
  const int graph = be->end_capture();
  be->replay(graph);
  // Counted at dispatch: the eager call and the recorded one, not the replay.
  EXPECT_EQ(path_counts(*be).tensor_core_gemm, 2u);
  const std::vector<float> a = to_host(*be, eager, static_cast<size_t>(n) * 256);
  const std::vector<float> b = to_host(*be, replayed, static_cast<size_t>(n) * 256);
  EXPECT_EQ(a, b) << "the replay must reproduce the eager run bit for bit";
}

// ---- grouped experts (n > 8) ------------------------------------------------------------------

// ids [n, k] over the first `used` of the experts (the rest stay unused); distinct per token
// unless `duplicate`, which repeats slot 0's expert in slot 1 of token 0.
std::vector<int32_t> random_ids(Rng& rng, int64_t n, int64_t k, int32_t used, bool duplicate) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> row;
    while (static_cast<int64_t>(row.size()) < k) {
      const int32_t e = rng.below(used);
      if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    ids.insert(ids.end(), row.begin(), row.end());
  }
  if (duplicate && k > 1) ids[1] = ids[0];
  return ids;
}

void check_swiglu(Backend& be, Backend& host, const QuantWeight& gate, const QuantWeight& up, Rng& rng,
                  const std::vector<int32_t>& ids, bool null_ids, int64_t n, int64_t k, const std::string& label) {
  const auto in = static_cast<int64_t>(gate.view().in);
  const auto I = static_cast<int64_t>(gate.view().out);
  const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n * in), -2.0f, 2.0f);
  float* h_dev = unwritten(be, static_cast<size_t>(n * k * I));
  const int32_t* ids_dev = null_ids ? nullptr : to_device(be, ids);
  const uint64_t grouped = path_counts(be).grouped_moe;
  be.expert_swiglu(gate.view(), up.view(), to_device(be, x), ids_dev, n, k, h_dev);
  EXPECT_EQ(path_counts(be).grouped_moe, grouped + 1) << label << ": the grouped GEMMs ran";
  const std::vector<float> got = to_host(be, h_dev, static_cast<size_t>(n * k * I));

  const std::vector<double> want = ref::expert_swiglu(gate.view(), up.view(), widen(x),
                                                      null_ids ? std::span<const int32_t>() : ids, n, k);
  const ErrorFigures f = report("expert_swiglu", label, got, want);
  EXPECT_LT(f.normalised, kTol) << label;

  std::vector<float> cpu_h(static_cast<size_t>(n * k * I), kUnwritten);
  host.expert_swiglu(gate.view(), up.view(), x.data(), null_ids ? nullptr : ids.data(), n, k, cpu_h.data());
  const ErrorFigures c = report("expert_swiglu", label + " vs cpu", got, widen(cpu_h));
  EXPECT_LT(c.normalised, kTol) << label << " vs cpu";
}

TEST(CudaExpertGrouped, SwigluManyExpertsSomeUnusedAndDuplicates) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(411);
  for (int bits : {4, 8}) {
    // E = 16, I = 64, in = 128; routing only touches experts 0..11.
    const QuantWeight gate(rng, bits, 16, 64, 128, 0, "experts_gate");
    const QuantWeight up(rng, bits, 16, 64, 128, 0, "experts_up");
    for (int64_t n : {9, 200}) {
      const std::string label = bits_label(bits) + " E=16 k=4 n=" + std::to_string(n);
      check_swiglu(*be, *host, gate, up, rng, random_ids(rng, n, 4, 12, false), false, n, 4, label);
      check_swiglu(*be, *host, gate, up, rng, random_ids(rng, n, 4, 12, true), false, n, 4,
                   label + " duplicate id");
    }
    // I = 80: the 64-output column tiles end mid-tile; in = 192.
    const QuantWeight rgate(rng, bits, 5, 80, 192, 0, "experts_gate");
    const QuantWeight rup(rng, bits, 5, 80, 192, 0, "experts_up");
    check_swiglu(*be, *host, rgate, rup, rng, random_ids(rng, 70, 3, 5, false), false, 70, 3,
                 bits_label(bits) + " E=5 I=80 in=192 k=3 n=70");
  }
}

TEST(CudaExpertGrouped, SwigluNullIdsUseExpertZero) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(412);
  // The shared expert: one unstacked projection, k = 1.
  const QuantWeight sgate(rng, 4, 1, 128, 128, 0, "shared_gate");
  const QuantWeight sup(rng, 4, 1, 128, 128, 0, "shared_up");
  check_swiglu(*be, *host, sgate, sup, rng, {}, true, 9, 1, "shared n=9 ids=nullptr");
  check_swiglu(*be, *host, sgate, sup, rng, {}, true, 200, 1, "shared n=200 ids=nullptr");
  // Stacked weights with ids = nullptr: every token reads expert 0.
  const QuantWeight gate(rng, 4, 6, 64, 128, 0, "experts_gate");
  const QuantWeight up(rng, 4, 6, 64, 128, 0, "experts_up");
  check_swiglu(*be, *host, gate, up, rng, {}, true, 33, 1, "stacked n=33 k=1 ids=nullptr");
}

void check_down(Backend& be, Backend& host, Rng& rng, const QuantWeight& down, const QuantWeight& shared_down,
                const std::vector<int32_t>& ids, int64_t n, int64_t k, const std::string& label) {
  const auto H = static_cast<int64_t>(down.view().out);
  const auto I = static_cast<int64_t>(down.view().in);
  const auto S = static_cast<int64_t>(shared_down.view().in);
  const std::vector<float> h = rng.uniform_vector(static_cast<size_t>(n * k * I), -1.0f, 1.0f);
  const std::vector<float> shared_h = rng.uniform_vector(static_cast<size_t>(n * S), -1.0f, 1.0f);
  std::vector<float> shared_logit = rng.uniform_vector(static_cast<size_t>(n), -4.0f, 4.0f);
  std::vector<float> weights = rng.uniform_vector(static_cast<size_t>(n * k), 0.05f, 1.0f);
  for (int64_t t = 0; t < n; ++t) {  // router-like: positive, summing to 1 per token
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += weights[static_cast<size_t>(t * k + j)];
    for (int64_t j = 0; j < k; ++j) weights[static_cast<size_t>(t * k + j)] /= sum;
  }
  shared_logit[1] = -80.0f;  // shared expert switched off for token 1
  float* out_dev = unwritten(be, static_cast<size_t>(n * H));
  const uint64_t grouped = path_counts(be).grouped_moe;
  be.expert_down_combine(down.view(), to_device(be, h), to_device(be, ids), to_device(be, weights), n, k,
                         shared_down.view(), to_device(be, shared_h), to_device(be, shared_logit), out_dev);
  EXPECT_EQ(path_counts(be).grouped_moe, grouped + 1) << label << ": the grouped GEMMs ran";
  const std::vector<float> got = to_host(be, out_dev, static_cast<size_t>(n * H));

  const std::vector<double> want = ref::expert_down_combine(down.view(), widen(h), ids, widen(weights), n, k,
                                                            shared_down.view(), widen(shared_h),
                                                            widen(shared_logit));
  const ErrorFigures f = report("expert_down_combine", label, got, want);
  EXPECT_LT(f.normalised, kTol) << label;

  std::vector<float> cpu_out(static_cast<size_t>(n * H), kUnwritten);
  host.expert_down_combine(down.view(), h.data(), ids.data(), weights.data(), n, k, shared_down.view(),
                           shared_h.data(), shared_logit.data(), cpu_out.data());
  const ErrorFigures c = report("expert_down_combine", label + " vs cpu", got, widen(cpu_out));
  EXPECT_LT(c.normalised, kTol) << label << " vs cpu";
}

TEST(CudaExpertGrouped, DownCombineManyExperts) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(413);
  for (int bits : {4, 8}) {
    // E = 16, H = 128, I = 64, S = 128; experts 12..15 unused.
    const QuantWeight down(rng, bits, 16, 128, 64, 0, "experts_down");
    const QuantWeight shared_down(rng, bits, 1, 128, 128, 0, "shared_down");
    for (int64_t n : {9, 200}) {
      const std::string label = bits_label(bits) + " E=16 k=4 n=" + std::to_string(n);
      check_down(*be, *host, rng, down, shared_down, random_ids(rng, n, 4, 12, false), n, 4, label);
      check_down(*be, *host, rng, down, shared_down, random_ids(rng, n, 4, 12, true), n, 4,
                 label + " duplicate id");
    }
    // H = 200: the 128-row output tiles end mid-tile; I = 128 (two K tiles), S = 192.
    const QuantWeight rdown(rng, bits, 6, 200, 128, 0, "experts_down");
    const QuantWeight rshared(rng, bits, 1, 200, 192, 0, "shared_down");
    check_down(*be, *host, rng, rdown, rshared, random_ids(rng, 40, 6, 6, false), 40, 6,
               bits_label(bits) + " E=6 k=6=E H=200 I=128 S=192 n=40");
  }
}

}  // namespace
}  // namespace lily::testing

// CUDA decode kernels (matmul n <= 8, embed, argmax, expert SwiGLU, expert down-combine) against the float64 reference and the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "checkpoint/mlx_quant.h"
#include "cuda_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

// Tolerance, as for the CPU backend tests (dense_ops_test.cpp): every output is an f32 sum of
// at most a few thousand products (plus a SiLU or a sigmoid), so its relative error against
// the exact float64 value stays near 1e-7; 1e-5 leaves a wide margin, while a wrong index,
// a missing group, a wrong scale/bias or a stale output shows up as 1e-3..1 (or infinity:
// outputs start as 1e30, so one unwritten value fails the comparison). The same bound
// applies against the CPU backend (both sides are f32, summed in a different order).
constexpr double kTol = 1e-5;
constexpr float kUnwritten = 1e30f;

std::vector<double> widen(const std::vector<float>& v) { return ref::widen(v); }

std::string bits_label(int bits) { return "q" + std::to_string(bits); }

// A device buffer of `count` floats that all read kUnwritten.
float* unwritten(Backend& be, size_t count) {
  return to_device(be, std::vector<float>(count, kUnwritten));
}

// ---- matmul (the GEMV path for n <= 8) ---------------------------------------------------

// `got` (a device result of rows row_begin.. of w times x [n, in]) against the float64
// reference and the CPU backend's matmul.
void expect_matmul_output(Backend& host, const QuantWeight& w, int64_t row_begin, int64_t rows,
                          const std::vector<float>& x, int64_t n, const std::vector<float>& got,
                          const std::string& op, const std::string& label, double tol) {
  const ErrorFigures f = report(op, label, got, ref::matmul(w.view(), row_begin, rows, widen(x), n));
  EXPECT_LT(f.normalised, tol) << label;
  std::vector<float> cpu_y(static_cast<size_t>(n * rows), kUnwritten);
  host.matmul(w.view(), row_begin, rows, x.data(), n, cpu_y.data());
  const ErrorFigures c = report(op, label + " vs cpu", got, widen(cpu_y));
  EXPECT_LT(c.normalised, tol) << label << " vs cpu";
}

void check_matmul(Backend& be, Backend& host, const QuantWeight& w, int64_t row_begin,
                  int64_t rows, int64_t n, Rng& rng, const std::string& label, double tol = kTol) {
  const auto in = static_cast<int64_t>(w.view().in);
  const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n * in), -2.0f, 2.0f);
  float* y_dev = unwritten(be, static_cast<size_t>(n * rows));
  be.matmul(w.view(), row_begin, rows, to_device(be, x), n, y_dev);
  expect_matmul_output(host, w, row_begin, rows, x, n,
                       to_host(be, y_dev, static_cast<size_t>(n * rows)), "matmul", label, tol);
}

TEST(CudaGemv, Q4AndQ8WidthsAndTokenCounts) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(301);
  for (int bits : {4, 8}) {
    // 64: one group (2 or 4 chunks, lane segments of 2 or 4); 192: not a multiple of 128;
    // 2048: the model's hidden width. 37 rows: not a multiple of the rows per warp or block.
    for (uint64_t in : {uint64_t{64}, uint64_t{128}, uint64_t{192}, uint64_t{2048}}) {
      const QuantWeight w(rng, bits, 1, 37, in, 0, "w");
      for (int64_t n : {1, 2, 5, 8}) {
        check_matmul(*be, *host, w, 0, 37, n, rng,
                     bits_label(bits) + " [37, " + std::to_string(in) + "] n=" + std::to_string(n));
      }
    }
  }
}

TEST(CudaGemv, ModelShapedQ8RouterAndGate) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(302);
  const QuantWeight router(rng, 8, 1, 256, 2048, 0, "router");
  const QuantWeight gate(rng, 8, 1, 1, 2048, 0, "shared_expert_gate");
  check_matmul(*be, *host, router, 0, 256, 1, rng, "q8 router [256, 2048] n=1");
  check_matmul(*be, *host, router, 0, 256, 3, rng, "q8 router [256, 2048] n=3");
  check_matmul(*be, *host, gate, 0, 1, 1, rng, "q8 shared_expert_gate [1, 2048] n=1");
  check_matmul(*be, *host, gate, 0, 1, 8, rng, "q8 shared_expert_gate [1, 2048] n=8");
  // Short rows of the down projections (in = 512: 16 chunks, two rows per warp) and long
  // ones (o_proj, in = 4096).
  const QuantWeight down(rng, 4, 1, 100, 512, 0, "shared_down");
  check_matmul(*be, *host, down, 0, 100, 1, rng, "q4 [100, 512] n=1");
  check_matmul(*be, *host, down, 0, 100, 4, rng, "q4 [100, 512] n=4");
  const QuantWeight o_proj(rng, 4, 1, 33, 4096, 0, "o_proj");
  check_matmul(*be, *host, o_proj, 0, 33, 1, rng, "q4 [33, 4096] n=1");
  check_matmul(*be, *host, o_proj, 0, 33, 7, rng, "q4 [33, 4096] n=7");
}

TEST(CudaGemv, RowRangesAndStackedExperts) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(303);
  for (int bits : {4, 8}) {
    // Stacked experts: expert e is rows e * 64 .. e * 64 + 63 of the flattened matrix.
    const QuantWeight w(rng, bits, 6, 64, 128, 0, "experts");
    const std::string b = bits_label(bits);
    for (int64_t e : {0, 3, 5}) {
      check_matmul(*be, *host, w, e * 64, 64, 1, rng, b + " expert " + std::to_string(e) + " rows n=1");
      check_matmul(*be, *host, w, e * 64, 64, 2, rng, b + " expert " + std::to_string(e) + " rows n=2");
    }
    check_matmul(*be, *host, w, 5, 13, 1, rng, b + " rows [5, 18) n=1");
    check_matmul(*be, *host, w, 5, 13, 8, rng, b + " rows [5, 18) n=8");
    check_matmul(*be, *host, w, 381, 3, 5, rng, b + " rows [381, 384) (last) n=5");
    check_matmul(*be, *host, w, 100, 1, 1, rng, b + " single row 100 n=1");
    check_matmul(*be, *host, w, 0, 384, 2, rng, b + " all 384 stacked rows n=2");
  }
}

TEST(CudaGemv, MisalignedHostViews) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(304);
  for (int bits : {4, 8}) {
    for (size_t misalign : {size_t{1}, size_t{2}, size_t{3}}) {
      const QuantWeight w(rng, bits, 1, 21, 128, misalign, "misaligned");
      const std::string label = bits_label(bits) + " misalign " + std::to_string(misalign);
      check_matmul(*be, *host, w, 0, 21, 1, rng, label + " n=1");
      check_matmul(*be, *host, w, 3, 10, 2, rng, label + " rows [3, 13) n=2");
    }
  }
}

TEST(CudaGemv, ManyRows) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(305);
  // lm_head-like row count (grid of thousands of blocks) with a small width to keep the
  // float64 reference quick.
  const QuantWeight w(rng, 4, 1, 50'001, 64, 0, "lm_head_like");
  check_matmul(*be, *host, w, 0, 50'001, 1, rng, "q4 [50001, 64] n=1");
  check_matmul(*be, *host, w, 0, 50'001, 2, rng, "q4 [50001, 64] n=2");
  check_matmul(*be, *host, w, 49'990, 11, 1, rng, "q4 [50001, 64] rows [49990, 50001) n=1");
  // Tall and as wide as the model's hidden size: 3,126 blocks for n = 1 (the lm_head has 7,760),
  // many waves of blocks each staging the activations again.
  const QuantWeight tall(rng, 4, 1, 100'003, 2048, 0, "tall");
  check_matmul(*be, *host, tall, 0, 100'003, 1, rng, "q4 [100003, 2048] n=1");
  check_matmul(*be, *host, tall, 0, 100'003, 3, rng, "q4 [100003, 2048] n=3");
  check_matmul(*be, *host, tall, 7, 99'990, 2, rng, "q4 [100003, 2048] rows [7, 99997) n=2");
}

// One token over a tall Q4 matrix of 1024 or 2048 inputs (from 32,768 rows; the lm_head is
// 248,320 x 2048) takes the streaming kernel on compute capability 9.0 (stream_gemv.cu). It
// sums in the generic kernel's order, so its output must equal, bit for bit, that of a
// one-target matmul_group (which always runs the generic kernel), besides the references.
// Row counts that leave a partial last tile, a row range starting mid-tile, and more tiles
// than blocks (several laps of the 4-stage ring). Where the device runs the kernel (the
// start-up line says "bulk-copy lm_head GEMV on": sm_90 code, 144 KB of shared memory) the
// path counts show that every matmul took it; elsewhere none did.
TEST(CudaGemv, TallQ4StreamsBitIdenticalToTheGenericKernel) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  const bool streams = be->code_path().find("bulk-copy lm_head GEMV on") != std::string::npos;
  auto host = cpu();
  Rng rng(309);
  struct Case {
    int64_t rows_total, in, row_begin, rows;
  };
  for (const Case c : {Case{100'003, 2048, 0, 100'003}, Case{100'003, 2048, 7, 99'990},
                       Case{40'000, 1024, 0, 40'000}, Case{248'320, 2048, 0, 248'320}}) {
    const std::string label = "q4 [" + std::to_string(c.rows_total) + ", " + std::to_string(c.in) +
                              "] rows [" + std::to_string(c.row_begin) + ", " +
                              std::to_string(c.row_begin + c.rows) + ") n=1";
    const QuantWeight w(rng, 4, 1, static_cast<uint64_t>(c.rows_total), static_cast<uint64_t>(c.in), 0, "tall");
    const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(c.in), -2.0f, 2.0f);
    const float* x_dev = to_device(*be, x);
    float* streamed = unwritten(*be, static_cast<size_t>(c.rows));
    float* generic = unwritten(*be, static_cast<size_t>(c.rows));
    be->matmul(w.view(), c.row_begin, c.rows, x_dev, 1, streamed);
    const MatmulTarget one[] = {{&w.view(), c.row_begin, c.rows, generic}};
    be->matmul_group(one, x_dev, 1);
    const std::vector<float> got = to_host(*be, streamed, static_cast<size_t>(c.rows));
    const std::vector<float> want = to_host(*be, generic, static_cast<size_t>(c.rows));
    int64_t differing = 0;
    for (size_t r = 0; r < got.size(); ++r) {
      if (std::memcmp(&got[r], &want[r], sizeof(float)) != 0) ++differing;
    }
    EXPECT_EQ(differing, 0) << label << ": rows differing from the generic kernel";
    if (c.rows_total < 200'000) {  // the float64 reference of the full lm_head shape is slow
      expect_matmul_output(*host, w, c.row_begin, c.rows, x, 1, got, "matmul", label, kTol);
    }
  }
  EXPECT_EQ(path_counts(*be).stream_gemv, streams ? 4u : 0u) << be->code_path();
  EXPECT_EQ(path_counts(*be).gemv, streams ? 0u : 4u) << be->code_path();
  EXPECT_EQ(path_counts(*be).batched_gemv, 4u) << "the one-target groups run the generic kernel";
  if (!streams) std::printf("[cuda] this device does not run the bulk-copy GEMV: %s\n", be->code_path().c_str());
}

TEST(CudaGemv, RowsPerSegmentFollowTheMatrixSize) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(308);
  // For n <= 2 the kernel takes 8 rows per lane segment, or 2 or 1 when 8 would leave fewer
  // blocks than SMs: 8192 x 2048 (8 rows), 2048 x 4096 like out_proj (2 rows on an H200),
  // 257 x 2048 like router | shared gate (1 row).
  const QuantWeight big(rng, 4, 1, 8192, 2048, 0, "qkv_like");
  const QuantWeight out(rng, 4, 1, 2048, 4096, 0, "out_proj_like");
  const QuantWeight router(rng, 8, 1, 257, 2048, 0, "router_like");
  for (int64_t n : {1, 2}) {
    const std::string t = " n=" + std::to_string(n);
    check_matmul(*be, *host, big, 0, 8192, n, rng, "q4 [8192, 2048]" + t);
    check_matmul(*be, *host, out, 0, 2048, n, rng, "q4 [2048, 4096]" + t);
    check_matmul(*be, *host, router, 0, 257, n, rng, "q8 [257, 2048]" + t);
  }
}

TEST(CudaGemv, SeventeenTokensTakeTheOtherPath) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(306);
  // n > kGemvMaxTokens goes to the GEMM; the op's contract is the same, at the GEMM's bound:
  // exact codes, activations split into two BF16 terms (~2^-17 relative), f32 accumulation and
  // f32 per-group scale and bias give ~1e-6..1e-5 normalised, so 1e-4 (gemm_test.cpp's kTol)
  // rather than the GEMV's f32 1e-5.
  const QuantWeight w(rng, 4, 1, 64, 128, 0, "w");
  check_matmul(*be, *host, w, 0, 64, 17, rng, "q4 [64, 128] n=17", 1e-4);
  EXPECT_EQ(path_counts(*be).tensor_core_gemm, 1u);
  EXPECT_EQ(path_counts(*be).gemv, 0u);
}

// ---- matmul_group (one launch for a fused projection group) ------------------------------

// Runs `targets` (weight, row_begin, rows) as one matmul_group on `be` and checks each output
// against the float64 reference and the CPU backend's matmul of that target alone.
void check_group(Backend& be, Backend& host, const std::vector<const QuantWeight*>& weights,
                 const std::vector<int64_t>& row_begins, const std::vector<int64_t>& rows,
                 int64_t n, Rng& rng, const std::string& label, double tol = kTol) {
  const auto in = static_cast<int64_t>(weights[0]->view().in);
  const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n * in), -2.0f, 2.0f);
  std::vector<MatmulTarget> targets;
  for (size_t i = 0; i < weights.size(); ++i) {
    targets.push_back({&weights[i]->view(), row_begins[i], rows[i],
                       unwritten(be, static_cast<size_t>(n * rows[i]))});
  }
  be.matmul_group(targets, to_device(be, x), n);
  for (size_t i = 0; i < weights.size(); ++i) {
    expect_matmul_output(host, *weights[i], row_begins[i], rows[i], x, n,
                         to_host(be, targets[i].y, static_cast<size_t>(n * rows[i])),
                         "matmul_group", label + " target " + std::to_string(i), tol);
  }
}

TEST(CudaGemv, MatmulGroupOneLaunchPerGroup) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(307);
  for (int bits : {4, 8}) {
    // Shaped like qkv | z | a | b: a large, a middle and two tiny targets (block counts that
    // differ per target), one of them a row range of a larger weight.
    const QuantWeight qkv(rng, bits, 1, 300, 256, 0, "qkv");
    const QuantWeight z(rng, bits, 1, 96, 256, 0, "z");
    const QuantWeight a(rng, bits, 1, 40, 256, 0, "a");
    const QuantWeight b(rng, bits, 1, 1, 256, 0, "b");
    for (int64_t n : {1, 3, 8}) {
      check_group(*be, *host, {&qkv, &z, &a, &b}, {0, 0, 8, 0}, {300, 96, 4, 1}, n, rng,
                  bits_label(bits) + " 4 targets n=" + std::to_string(n));
    }
    // Short rows (in = 64: lane segments of 2 or 4 lanes, several targets per warp's block).
    const QuantWeight s1(rng, bits, 1, 33, 64, 0, "s1");
    const QuantWeight s2(rng, bits, 1, 5, 64, 0, "s2");
    check_group(*be, *host, {&s1, &s2}, {0, 0}, {33, 5}, 2, rng, bits_label(bits) + " in=64 n=2");
  }
  // Router | shared-expert gate as in the model: Q8, [256, 2048] and [1, 2048].
  const QuantWeight router(rng, 8, 1, 256, 2048, 0, "router");
  const QuantWeight gate(rng, 8, 1, 1, 2048, 0, "shared_expert_gate");
  check_group(*be, *host, {&router, &gate}, {0, 0}, {256, 1}, 1, rng, "q8 router|gate n=1");
  // Mixed bit widths and more than 8 tokens are served target by target: same results.
  const QuantWeight w4(rng, 4, 1, 20, 128, 0, "w4");
  const QuantWeight w8(rng, 8, 1, 12, 128, 0, "w8");
  check_group(*be, *host, {&w4, &w8}, {0, 0}, {20, 12}, 2, rng, "q4|q8 n=2");
  check_group(*be, *host, {&w4, &w8}, {0, 0}, {20, 12}, 17, rng, "q4|q8 n=17", 1e-4);
  // One launch for each of the 9 groups of one width and n <= 8; the mixed ones per target.
  EXPECT_EQ(path_counts(*be).batched_gemv, 9u);
  EXPECT_EQ(path_counts(*be).gemv, 2u);
  EXPECT_EQ(path_counts(*be).tensor_core_gemm, 2u);
}

// ---- embed ---------------------------------------------------------------------------------

TEST(CudaEmbed, Q4AndQ8MatchReferenceAndMlxDequantBitwise) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(311);
  for (int bits : {4, 8}) {
    for (uint64_t in : {uint64_t{64}, uint64_t{192}, uint64_t{2048}}) {
      const QuantWeight table(rng, bits, 1, 100, in, bits == 4 ? 0 : 3, "embed");
      const std::vector<int32_t> ids = {0, 99, 42, 42, 7};
      const auto n = static_cast<int64_t>(ids.size());
      const size_t count = ids.size() * in;
      float* out_dev = unwritten(*be, count);
      be->embed(table.view(), to_device(*be, ids), n, out_dev);
      const std::vector<float> got = to_host(*be, out_dev, count);
      const std::string label = bits_label(bits) + " in=" + std::to_string(in) + " n=5 repeated ids";
      const ErrorFigures f = report("embed", label, got, ref::embed(table.view(), ids));
      EXPECT_LT(f.normalised, 1e-7) << label;  // one f32 rounding of an exact value: 2^-24

      // Bit for bit the MLX dequantisation (f32 multiply then add) and the CPU backend.
      std::vector<float> cpu_out(count, kUnwritten);
      host->embed(table.view(), ids.data(), n, cpu_out.data());
      std::vector<float> row(in);
      for (size_t t = 0; t < ids.size(); ++t) {
        dequantize_row(table.view(), static_cast<uint64_t>(ids[t]), row);
        for (size_t c = 0; c < in; ++c) {
          ASSERT_EQ(got[t * in + c], row[c]) << label << " token " << t << " col " << c;
          ASSERT_EQ(got[t * in + c], cpu_out[t * in + c]) << label << " token " << t << " col " << c;
        }
      }
    }
  }
}

// ---- argmax --------------------------------------------------------------------------------

std::vector<int32_t> cuda_argmax(Backend& be, const std::vector<float>& logits, int64_t n,
                                 int64_t vocab) {
  int32_t* out = to_device(be, std::vector<int32_t>(static_cast<size_t>(n), -1));
  be.argmax(to_device(be, logits), n, vocab, out);
  return to_host(be, out, static_cast<size_t>(n));
}

std::vector<int32_t> cpu_argmax(Backend& host, const std::vector<float>& logits, int64_t n,
                                int64_t vocab) {
  std::vector<int32_t> out(static_cast<size_t>(n), -1);
  host.argmax(logits.data(), n, vocab, out.data());
  return out;
}

TEST(CudaArgmax, VocabSizedRowsLastIndexTiesAndAllEqual) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(321);
  constexpr int64_t kVocab = 248'320;
  constexpr int64_t n = 3;
  std::vector<float> logits = rng.uniform_vector(static_cast<size_t>(n * kVocab), -10.0f, 10.0f);
  logits[kVocab - 1] = 100.0f;  // row 0: the maximum at the last index
  for (int64_t i : {200'000, 7, 123'457, 248'319}) logits[static_cast<size_t>(kVocab + i)] = 50.0f;  // row 1: ties
  std::fill(logits.begin() + 2 * kVocab, logits.end(), 3.25f);  // row 2: all equal
  const std::vector<int32_t> got = cuda_argmax(*be, logits, n, kVocab);
  const std::vector<int32_t> want = {static_cast<int32_t>(kVocab - 1), 7, 0};
  std::printf("[ref] argmax vocab=248320 n=3: got {%d, %d, %d} want {%d, %d, %d}\n", got[0],
              got[1], got[2], want[0], want[1], want[2]);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got, ref::argmax(widen(logits), n, kVocab));
  EXPECT_EQ(got, cpu_argmax(*host, logits, n, kVocab));
}

TEST(CudaArgmax, OddSizesAndFrequentTies) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(322);
  for (int64_t vocab : {1, 2, 7, 255, 2048, 2049, 4097, 100'000, 1'000'003}) {
    const int64_t n = 2;
    // Row 0: continuous values; row 1: five distinct values, so the maximum repeats often.
    std::vector<float> logits = rng.uniform_vector(static_cast<size_t>(n * vocab), -5.0f, 5.0f);
    for (int64_t i = 0; i < vocab; ++i) logits[static_cast<size_t>(vocab + i)] = static_cast<float>(rng.below(5));
    const std::vector<int32_t> got = cuda_argmax(*be, logits, n, vocab);
    const std::vector<int32_t> want = ref::argmax(widen(logits), n, vocab);
    std::printf("[ref] argmax vocab=%lld n=2: got {%d, %d} want {%d, %d}\n",
                static_cast<long long>(vocab), got[0], got[1], want[0], want[1]);
    EXPECT_EQ(got, want) << "vocab " << vocab;
    EXPECT_EQ(got, cpu_argmax(*host, logits, n, vocab)) << "vocab " << vocab;
  }
}

TEST(CudaArgmax, InfinitiesAndNaN) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr int64_t kVocab = 5000;
  std::vector<float> logits(4 * kVocab, -kInf);  // row 0: all -inf -> 0
  float* row = logits.data() + kVocab;           // row 1: NaNs never win over a number
  row[10] = kNaN;
  row[3000] = kNaN;
  row[2000] = 1.0f;
  row = logits.data() + 2 * kVocab;  // row 2: +inf twice -> the first
  row[4000] = kInf;
  row[4500] = kInf;
  row = logits.data() + 3 * kVocab;  // row 3: a NaN at index 0 loses too (cuda_ops.h contract)
  row[0] = kNaN;
  row[17] = -3.0f;
  const std::vector<int32_t> got = cuda_argmax(*be, logits, 4, kVocab);
  std::printf("[ref] argmax inf/nan: got {%d, %d, %d, %d} want {0, 2000, 4000, 17}\n", got[0],
              got[1], got[2], got[3]);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 2000, 4000, 17}));
  std::vector<float> all_nan(64, kNaN);
  EXPECT_EQ(cuda_argmax(*be, all_nan, 2, 32), (std::vector<int32_t>{0, 0}));
}

// ---- expert_swiglu -------------------------------------------------------------------------
// Mirrors tests/unit/backend/moe_test.cpp, on the device, with the CPU backend as a second
// reference.

constexpr uint64_t kExperts = 10;
constexpr uint64_t kHidden = 128;       // H: input width of gate/up, output rows of down
constexpr uint64_t kIntermediate = 64;  // I
constexpr uint64_t kShared = 128;       // S

// Distinct expert ids per token (as top-k gives), with experts shared between tokens.
std::vector<int32_t> random_ids(Rng& rng, int64_t n, int64_t k, uint64_t experts = kExperts) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> row;
    while (static_cast<int64_t>(row.size()) < k) {
      const int32_t e = rng.below(static_cast<int32_t>(experts));
      if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return ids;
}

void check_swiglu(Backend& be, Backend& host, const QuantWeight& gate, const QuantWeight& up,
                  Rng& rng, const std::vector<int32_t>& ids, bool null_ids, int64_t n, int64_t k,
                  const std::string& label) {
  const uint64_t in = gate.view().in;
  const auto I = static_cast<int64_t>(gate.view().out);
  const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * in, -2.0f, 2.0f);
  const size_t count = static_cast<size_t>(n * k * I);
  float* h_dev = unwritten(be, count);
  be.expert_swiglu(gate.view(), up.view(), to_device(be, x), null_ids ? nullptr : to_device(be, ids),
                   n, k, h_dev);
  const std::vector<float> got = to_host(be, h_dev, count);
  const std::vector<double> want = ref::expert_swiglu(
      gate.view(), up.view(), widen(x), null_ids ? std::span<const int32_t>() : ids, n, k);
  const ErrorFigures f = report("expert_swiglu", label, got, want);
  EXPECT_LT(f.normalised, kTol) << label;

  std::vector<float> cpu_h(count, kUnwritten);
  host.expert_swiglu(gate.view(), up.view(), x.data(), null_ids ? nullptr : ids.data(), n, k,
                     cpu_h.data());
  const ErrorFigures c = report("expert_swiglu", label + " vs cpu", got, widen(cpu_h));
  EXPECT_LT(c.normalised, kTol) << label << " vs cpu";
}

TEST(CudaExpertSwiglu, RoutedIds) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(331);
  for (int bits : {4, 8}) {
    const QuantWeight gate(rng, bits, kExperts, kIntermediate, kHidden, 0, "experts_gate");
    const QuantWeight up(rng, bits, kExperts, kIntermediate, kHidden, 2, "experts_up");
    const std::string b = bits_label(bits) + " ";
    check_swiglu(*be, *host, gate, up, rng, {5, 0, 3}, false, 1, 3, b + "n=1 k=3 ids {5,0,3}");
    check_swiglu(*be, *host, gate, up, rng, random_ids(rng, 1, 8), false, 1, 8, b + "n=1 k=8 distinct");
    check_swiglu(*be, *host, gate, up, rng, {9}, false, 1, 1, b + "n=1 k=1 last expert");
    check_swiglu(*be, *host, gate, up, rng, random_ids(rng, 5, 3), false, 5, 3, b + "n=5 k=3 shared experts");
    check_swiglu(*be, *host, gate, up, rng, random_ids(rng, 8, 8), false, 8, 8, b + "n=8 k=8");
    // Not produced by top-k but allowed by the contract: the same expert twice in a token.
    check_swiglu(*be, *host, gate, up, rng, {2, 2, 4, 2}, false, 2, 2, b + "n=2 k=2 repeated id");
  }
  // Gate and up of different code widths (the kernel's two-pass variant).
  const QuantWeight gate4(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_gate");
  const QuantWeight up8(rng, 8, kExperts, kIntermediate, kHidden, 0, "experts_up");
  check_swiglu(*be, *host, gate4, up8, rng, {1, 7}, false, 1, 2, "gate q4 up q8 n=1 k=2");
  // I = 30: not a multiple of the rows per lane segment.
  const QuantWeight gate30(rng, 4, 4, 30, kHidden, 0, "experts_gate");
  const QuantWeight up30(rng, 4, 4, 30, kHidden, 0, "experts_up");
  check_swiglu(*be, *host, gate30, up30, rng, {3, 1}, false, 1, 2, "q4 I=30 n=1 k=2");
}

TEST(CudaExpertSwiglu, NullIdsUseExpertZero) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(332);
  // The shared expert: one unstacked projection, k = 1.
  const QuantWeight sgate(rng, 4, 1, kShared, kHidden, 0, "shared_gate");
  const QuantWeight sup(rng, 4, 1, kShared, kHidden, 0, "shared_up");
  check_swiglu(*be, *host, sgate, sup, rng, {}, true, 1, 1, "shared n=1 ids=nullptr");
  check_swiglu(*be, *host, sgate, sup, rng, {}, true, 4, 1, "shared n=4 ids=nullptr");
  check_swiglu(*be, *host, sgate, sup, rng, {}, true, 8, 1, "shared n=8 ids=nullptr");
}

TEST(CudaExpertSwiglu, ModelShape) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(333);
  // H = 2048, I = 512, k = 8 as in the model (16 experts instead of 256 to keep it small).
  const QuantWeight gate(rng, 4, 16, 512, 2048, 0, "experts_gate");
  const QuantWeight up(rng, 4, 16, 512, 2048, 0, "experts_up");
  check_swiglu(*be, *host, gate, up, rng, random_ids(rng, 1, 8, 16), false, 1, 8, "q4 [16x512, 2048] n=1 k=8");
  check_swiglu(*be, *host, gate, up, rng, random_ids(rng, 3, 8, 16), false, 3, 8, "q4 [16x512, 2048] n=3 k=8");
}

// The routed experts and the shared expert in one expert_swiglu_with_shared.
void check_swiglu_with_shared(Backend& be, Backend& host, const QuantWeight& gate,
                              const QuantWeight& up, const QuantWeight& sgate,
                              const QuantWeight& sup, Rng& rng, int64_t n, int64_t k,
                              const std::string& label, double tol = kTol) {
  const uint64_t in = gate.view().in;
  const auto I = static_cast<int64_t>(gate.view().out);
  const auto S = static_cast<int64_t>(sgate.view().out);
  const std::vector<int32_t> ids = random_ids(rng, n, k, gate.view().experts);
  const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * in, -2.0f, 2.0f);
  float* h_dev = unwritten(be, static_cast<size_t>(n * k * I));
  float* sh_dev = unwritten(be, static_cast<size_t>(n * S));
  be.expert_swiglu_with_shared(gate.view(), up.view(), to_device(be, ids), k, h_dev, sgate.view(),
                               sup.view(), sh_dev, to_device(be, x), n);
  const std::vector<float> h = to_host(be, h_dev, static_cast<size_t>(n * k * I));
  const std::vector<float> sh = to_host(be, sh_dev, static_cast<size_t>(n * S));
  const ErrorFigures f = report("expert_swiglu_with_shared", label + " routed", h,
                                ref::expert_swiglu(gate.view(), up.view(), widen(x), ids, n, k));
  EXPECT_LT(f.normalised, tol) << label << " routed";
  const ErrorFigures g = report("expert_swiglu_with_shared", label + " shared", sh,
                                ref::expert_swiglu(sgate.view(), sup.view(), widen(x),
                                                   std::span<const int32_t>(), n, 1));
  EXPECT_LT(g.normalised, tol) << label << " shared";
  std::vector<float> cpu_h(static_cast<size_t>(n * k * I), kUnwritten);
  std::vector<float> cpu_sh(static_cast<size_t>(n * S), kUnwritten);
  host.expert_swiglu_with_shared(gate.view(), up.view(), ids.data(), k, cpu_h.data(),
                                 sgate.view(), sup.view(), cpu_sh.data(), x.data(), n);
  EXPECT_LT(report("expert_swiglu_with_shared", label + " routed vs cpu", h, widen(cpu_h)).normalised, tol);
  EXPECT_LT(report("expert_swiglu_with_shared", label + " shared vs cpu", sh, widen(cpu_sh)).normalised, tol);
}

TEST(CudaExpertSwiglu, WithSharedExpertInOneLaunch) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(335);
  const QuantWeight gate(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_gate");
  const QuantWeight up(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_up");
  const QuantWeight sgate(rng, 4, 1, kShared, kHidden, 0, "shared_gate");
  const QuantWeight sup(rng, 4, 1, kShared, kHidden, 0, "shared_up");
  // in = 128: 4-lane segments, so one warp holds routed and shared units side by side.
  for (int64_t n : {1, 2, 8}) {
    check_swiglu_with_shared(*be, *host, gate, up, sgate, sup, rng, n, 3,
                             "q4 n=" + std::to_string(n) + " k=3");
  }
  // S = 30: the shared expert's last unit is partial.
  const QuantWeight sgate30(rng, 4, 1, 30, kHidden, 0, "shared_gate");
  const QuantWeight sup30(rng, 4, 1, 30, kHidden, 0, "shared_up");
  check_swiglu_with_shared(*be, *host, gate, up, sgate30, sup30, rng, 1, 8, "q4 S=30 n=1 k=8");
  // Model shape: H = 2048, I = S = 512, k = 8 (16 experts instead of 256).
  const QuantWeight mg(rng, 4, 16, 512, 2048, 0, "experts_gate");
  const QuantWeight mu(rng, 4, 16, 512, 2048, 0, "experts_up");
  const QuantWeight msg(rng, 4, 1, 512, 2048, 0, "shared_gate");
  const QuantWeight msu(rng, 4, 1, 512, 2048, 0, "shared_up");
  check_swiglu_with_shared(*be, *host, mg, mu, msg, msu, rng, 1, 8, "q4 model shape n=1");
  // Shared expert of another code width, and prefill sizes: served as two ops, same results.
  const QuantWeight sgate8(rng, 8, 1, kShared, kHidden, 0, "shared_gate");
  const QuantWeight sup8(rng, 8, 1, kShared, kHidden, 0, "shared_up");
  check_swiglu_with_shared(*be, *host, gate, up, sgate8, sup8, rng, 2, 3, "shared q8 n=2");
  check_swiglu_with_shared(*be, *host, gate, up, sgate, sup, rng, 12, 3, "q4 n=12", 1e-4);
  // The five calls of one width and n <= 8 in one launch; n = 12 as grouped GEMMs (2 ops).
  EXPECT_EQ(path_counts(*be).fused_swiglu_shared, 5u);
  EXPECT_EQ(path_counts(*be).grouped_moe, 2u);
}

// Routing fused into the SwiGLU launch: ids and weights as the CPU's moe_route, h and
// shared_h as the CPU's expert SwiGLU with those ids.
void check_route_swiglu(Backend& be, Backend& host, const QuantWeight& gate, const QuantWeight& up,
                        const QuantWeight& sgate, const QuantWeight& sup, Rng& rng, int64_t n,
                        int64_t k, const std::string& label,
                        const QuantWeight* next_down = nullptr) {
  const auto E = static_cast<int64_t>(gate.view().experts);
  const auto in = static_cast<int64_t>(gate.view().in);
  const auto I = static_cast<int64_t>(gate.view().out);
  const auto S = static_cast<int64_t>(sgate.view().out);
  const std::vector<float> logits = rng.uniform_vector(static_cast<size_t>(n * E), -4.0f, 4.0f);
  const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n * in), -2.0f, 2.0f);
  int32_t* ids_dev = to_device(be, std::vector<int32_t>(static_cast<size_t>(n * k), -1));
  float* w_dev = unwritten(be, static_cast<size_t>(n * k));
  float* h_dev = unwritten(be, static_cast<size_t>(n * k * I));
  float* sh_dev = unwritten(be, static_cast<size_t>(n * S));
  const QuantView down_view = next_down != nullptr ? next_down->view() : QuantView{};
  be.route_expert_swiglu(to_device(be, logits), E, k, ids_dev, w_dev, gate.view(), up.view(), h_dev,
                         sgate.view(), sup.view(), sh_dev, to_device(be, x), n,
                         next_down != nullptr ? &down_view : nullptr);

  std::vector<int32_t> ids(static_cast<size_t>(n * k), -1);
  std::vector<float> w(static_cast<size_t>(n * k), kUnwritten);
  std::vector<float> h(static_cast<size_t>(n * k * I), kUnwritten);
  std::vector<float> sh(static_cast<size_t>(n * S), kUnwritten);
  host.route_expert_swiglu(logits.data(), E, k, ids.data(), w.data(), gate.view(), up.view(),
                           h.data(), sgate.view(), sup.view(), sh.data(), x.data(), n, nullptr);
  EXPECT_EQ(to_host(be, ids_dev, ids.size()), ids) << label << ": expert ids";
  EXPECT_LT(report("route_expert_swiglu", label + " weights vs cpu", to_host(be, w_dev, w.size()),
                   widen(w)).normalised, kTol);
  EXPECT_LT(report("route_expert_swiglu", label + " h vs cpu", to_host(be, h_dev, h.size()),
                   widen(h)).normalised, kTol);
  EXPECT_LT(report("route_expert_swiglu", label + " shared_h vs cpu", to_host(be, sh_dev, sh.size()),
                   widen(sh)).normalised, kTol);
  // And against the float64 reference with the CPU's ids.
  EXPECT_LT(report("route_expert_swiglu", label + " h", to_host(be, h_dev, h.size()),
                   ref::expert_swiglu(gate.view(), up.view(), widen(x), ids, n, k)).normalised, kTol);
}

TEST(CudaExpertSwiglu, RoutingFusedIntoTheLaunch) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(336);
  const QuantWeight gate(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_gate");
  const QuantWeight up(rng, 4, kExperts, kIntermediate, kHidden, 0, "experts_up");
  const QuantWeight sgate(rng, 4, 1, kShared, kHidden, 0, "shared_gate");
  const QuantWeight sup(rng, 4, 1, kShared, kHidden, 0, "shared_up");
  for (int64_t n : {1, 3, 8}) {
    check_route_swiglu(*be, *host, gate, up, sgate, sup, rng, n, 3, "E=10 k=3 n=" + std::to_string(n));
  }
  check_route_swiglu(*be, *host, gate, up, sgate, sup, rng, 2, 10, "E=10 k=10 (every expert)");
  // The model's routing width: 256 experts, k = 8 (small experts to keep it quick).
  const QuantWeight gate256(rng, 4, 256, 8, kHidden, 0, "experts_gate");
  const QuantWeight up256(rng, 4, 256, 8, kHidden, 0, "experts_up");
  check_route_swiglu(*be, *host, gate256, up256, sgate, sup, rng, 1, 8, "E=256 k=8 n=1");
  check_route_swiglu(*be, *host, gate256, up256, sgate, sup, rng, 4, 8, "E=256 k=8 n=4");
  // With the down projection's rows prefetched from inside the launch (the model's call): a
  // hint only, the same results.
  const QuantWeight down256(rng, 4, 256, kHidden, 8 * 64, 0, "experts_down");
  check_route_swiglu(*be, *host, gate256, up256, sgate, sup, rng, 3, 8, "E=256 k=8 n=3 +prefetch",
                     &down256);
  // Prefill sizes take the routing kernel and the grouped GEMMs: same contract.
  check_route_swiglu(*be, *host, gate, up, sgate, sup, rng, 11, 3, "E=10 k=3 n=11 (two ops)");
  // Seven calls routed inside the SwiGLU launch; n = 11 as the routing kernel and two
  // grouped GEMMs.
  EXPECT_EQ(path_counts(*be).fused_route_swiglu, 7u);
  EXPECT_EQ(path_counts(*be).fused_swiglu_shared, 0u);
  EXPECT_EQ(path_counts(*be).grouped_moe, 2u);
}

// ---- expert_down_combine -------------------------------------------------------------------

void check_down(Backend& be, Backend& host, Rng& rng, const QuantWeight& down,
                const QuantWeight& shared_down, const std::vector<int32_t>& ids, int64_t n,
                int64_t k, const std::string& label) {
  const auto H = static_cast<int64_t>(down.view().out);
  const auto I = static_cast<int64_t>(down.view().in);
  const auto S = static_cast<int64_t>(shared_down.view().in);
  const std::vector<float> h = rng.uniform_vector(static_cast<size_t>(n * k * I), -1.0f, 1.0f);
  const std::vector<float> shared_h = rng.uniform_vector(static_cast<size_t>(n * S), -1.0f, 1.0f);
  std::vector<float> shared_logit = rng.uniform_vector(static_cast<size_t>(n), -4.0f, 4.0f);
  // Router-like weights: positive, summing to 1 per token.
  std::vector<float> weights = rng.uniform_vector(static_cast<size_t>(n * k), 0.05f, 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += weights[static_cast<size_t>(t * k + j)];
    for (int64_t j = 0; j < k; ++j) weights[static_cast<size_t>(t * k + j)] /= sum;
  }
  if (n > 1) shared_logit[1] = -80.0f;  // shared expert switched off for token 1
  const size_t count = static_cast<size_t>(n * H);
  float* out_dev = unwritten(be, count);
  be.expert_down_combine(down.view(), to_device(be, h), to_device(be, ids), to_device(be, weights),
                         n, k, shared_down.view(), to_device(be, shared_h),
                         to_device(be, shared_logit), out_dev);
  const std::vector<float> got = to_host(be, out_dev, count);
  const std::vector<double> want =
      ref::expert_down_combine(down.view(), widen(h), ids, widen(weights), n, k,
                               shared_down.view(), widen(shared_h), widen(shared_logit));
  const ErrorFigures f = report("expert_down_combine", label, got, want);
  EXPECT_LT(f.normalised, kTol) << label;

  std::vector<float> cpu_out(count, kUnwritten);
  host.expert_down_combine(down.view(), h.data(), ids.data(), weights.data(), n, k,
                           shared_down.view(), shared_h.data(), shared_logit.data(),
                           cpu_out.data());
  const ErrorFigures c = report("expert_down_combine", label + " vs cpu", got, widen(cpu_out));
  EXPECT_LT(c.normalised, kTol) << label << " vs cpu";
}

TEST(CudaExpertDownCombine, RoutedAndSharedTerms) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(341);
  for (int bits : {4, 8}) {
    const QuantWeight down(rng, bits, kExperts, kHidden, kIntermediate, 0, "experts_down");
    const QuantWeight shared_down(rng, bits, 1, kHidden, kShared, 1, "shared_down");
    const std::string b = bits_label(bits) + " ";
    check_down(*be, *host, rng, down, shared_down, {4, 1, 5}, 1, 3, b + "n=1 k=3");
    check_down(*be, *host, rng, down, shared_down, {0}, 1, 1, b + "n=1 k=1");
    check_down(*be, *host, rng, down, shared_down, {9}, 1, 1, b + "n=1 k=1 last expert");
    check_down(*be, *host, rng, down, shared_down, random_ids(rng, 1, 8), 1, 8, b + "n=1 k=8");
    check_down(*be, *host, rng, down, shared_down, random_ids(rng, 2, 3), 2, 3, b + "n=2 k=3");
    check_down(*be, *host, rng, down, shared_down, random_ids(rng, 5, 4), 5, 4, b + "n=5 k=4");
    check_down(*be, *host, rng, down, shared_down, random_ids(rng, 8, 8), 8, 8, b + "n=8 k=8");
    check_down(*be, *host, rng, down, shared_down, {3, 3, 6, 3}, 2, 2, b + "n=2 k=2 repeated id");
  }
  // Routed and shared rows of different widths and code widths; H = 37 rows (odd tail).
  const QuantWeight down(rng, 4, 4, 37, 192, 0, "experts_down");
  const QuantWeight shared_down(rng, 8, 1, 37, 64, 0, "shared_down");
  check_down(*be, *host, rng, down, shared_down, {2, 0}, 1, 2, "down q4 I=192, shared q8 S=64, H=37 n=1");
  check_down(*be, *host, rng, down, shared_down, random_ids(rng, 3, 2, 4), 3, 2,
             "down q4 I=192, shared q8 S=64, H=37 n=3");
}

TEST(CudaExpertDownCombine, ModelShape) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu();
  Rng rng(342);
  // H = 2048, I = S = 512, k = 8 as in the model (16 experts instead of 256).
  const QuantWeight down(rng, 4, 16, 2048, 512, 0, "experts_down");
  const QuantWeight shared_down(rng, 4, 1, 2048, 512, 0, "shared_down");
  check_down(*be, *host, rng, down, shared_down, random_ids(rng, 1, 8, 16), 1, 8, "q4 H=2048 I=S=512 n=1 k=8");
  check_down(*be, *host, rng, down, shared_down, random_ids(rng, 4, 8, 16), 4, 8, "q4 H=2048 I=S=512 n=4 k=8");
}

}  // namespace
}  // namespace lily::testing

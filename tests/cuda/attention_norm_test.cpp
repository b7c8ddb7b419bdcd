// CUDA backend vs the float64 reference and the CPU backend: the three RMSNorms,
// attention_prepare (q/k norm + partial RoPE) and cached causal attention (split-K decode with
// host and device positions, tiled prefill chunks, CUDA-graph replay of a decode step).
//
// Tolerances: the CUDA norms and attention are f32 on CUDA cores (SIMT), with the CPU's
// numerics up to summation order, so the CPU tests' figures apply: 1e-5 normalised for the
// norms and attention (observed 1e-8..5e-7), 1e-6 for attention_prepare (observed ~1e-7; a
// double-formed RoPE angle would be 4e-5..4e-4 off at positions >= 1e5). If the prefill
// moves to BF16 tensor cores, kPrefillTol becomes the documented BF16 bound (~5e-3).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "cuda_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

constexpr double kTol = 1e-5;         // norms, decode attention (f32)
constexpr double kPrefillTol = 1e-5;  // prefill attention (f32 SIMT tiles)
constexpr double kPrepareTol = 1e-6;
constexpr double kCpuTol = 1e-5;  // CUDA vs the CPU backend (both f32, different orders)
constexpr float kEps = 1e-6f;
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

std::vector<double> widen(const std::vector<float>& v) { return ref::widen(v); }

AttentionDims small_dims() { return {4, 2, 64, 16, 1e7}; }    // 2 query heads per kv head
AttentionDims model_dims() { return {16, 2, 256, 64, 1e7}; }  // the real model (group 8)

std::string dims_label(const AttentionDims& d) {
  return "Hq=" + std::to_string(d.q_heads) + " Hkv=" + std::to_string(d.kv_heads) +
         " D=" + std::to_string(d.head_dim) + " rot=" + std::to_string(d.rotary_dim);
}

// ---- norms ------------------------------------------------------------------------------

// Runs rms_norm on CUDA and the CPU; checks both figures.
void check_rms_norm(Backend& cuda, Backend& cpu_be, const std::vector<float>& x,
                    const DenseTensor& gain, int64_t n, int64_t dim, const std::string& label) {
  float* dx = to_device(cuda, x);
  float* dout = cuda.alloc(x.size());
  cuda.rms_norm(dx, gain.view(), n, dim, kEps, dout);
  const std::vector<float> got = to_host(cuda, dout, x.size());
  std::vector<float> cpu_out(x.size());
  cpu_be.rms_norm(x.data(), gain.view(), n, dim, kEps, cpu_out.data());
  const ErrorFigures f = report("cuda rms_norm", label, got,
                                ref::rms_norm(widen(x), gain.view(), n, dim, static_cast<double>(kEps)));
  const ErrorFigures fc = report("cuda rms_norm", label + " vs cpu", got, widen(cpu_out));
  EXPECT_LT(f.normalised, kTol) << label;
  EXPECT_LT(fc.normalised, kCpuTol) << label;
}

TEST(CudaRmsNorm, RandomRowsBf16AndF32Gains) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu();
  Rng rng(121);
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (int64_t dim : {64, 100, 128, 256, 2048}) {
      const std::vector<float> g = rng.uniform_vector(static_cast<size_t>(dim), 0.5f, 1.5f);
      const DenseTensor gain(dtype, {static_cast<uint64_t>(dim)}, g);
      for (int64_t n : {1, 5}) {
        const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n * dim), -4.0f, 4.0f);
        check_rms_norm(*be, *cpu_be, x, gain, n, dim,
                       std::string(dtype == DType::F32 ? "f32" : "bf16") + " gain dim=" +
                           std::to_string(dim) + " n=" + std::to_string(n));
      }
    }
  }
}

TEST(CudaRmsNorm, ZeroTinyAndLargeRows) {
  // Row 0 all zero (output exactly 0), row 1 ~1e-20 (eps dominates), row 2 ~1e15 (x^2 ~1e30
  // still fits the f32 sum). Both the warp-per-row (128) and block-per-row (2048) kernels.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu();
  Rng rng(122);
  for (int64_t dim : {128, 2048}) {
    const DenseTensor gain(DType::BF16, {static_cast<uint64_t>(dim)},
                           rng.uniform_vector(static_cast<size_t>(dim), 0.5f, 1.5f));
    std::vector<float> x(static_cast<size_t>(3 * dim), 0.0f);
    for (int64_t i = 0; i < dim; ++i) {
      x[static_cast<size_t>(dim + i)] = rng.uniform(-1.0f, 1.0f) * 1e-20f;
      x[static_cast<size_t>(2 * dim + i)] = rng.uniform(-1.0f, 1.0f) * 1e15f;
    }
    float* dx = to_device(*be, x);
    float* dout = to_device(*be, std::vector<float>(x.size(), 7.0f));
    be->rms_norm(dx, gain.view(), 3, dim, kEps, dout);
    const std::vector<float> out = to_host(*be, dout, x.size());
    const std::vector<double> want = ref::rms_norm(widen(x), gain.view(), 3, dim, static_cast<double>(kEps));
    const char* names[] = {"zero row", "row ~1e-20 (eps-dominated)", "row ~1e15"};
    for (int64_t t = 0; t < 3; ++t) {
      const auto b = static_cast<size_t>(t * dim);
      const std::string label = std::string(names[t]) + " dim=" + std::to_string(dim);
      const ErrorFigures f = report("cuda rms_norm", label,
                                    std::span<const float>(out.data() + b, static_cast<size_t>(dim)),
                                    std::span<const double>(want.data() + b, static_cast<size_t>(dim)));
      EXPECT_LT(f.normalised, kTol) << label;
    }
    for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], 0.0f);
    check_rms_norm(*be, *cpu_be, x, gain, 3, dim, "zero/tiny/large dim=" + std::to_string(dim));
  }
}

TEST(CudaAddRmsNorm, UpdatesResidualAndNormalises) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu();
  Rng rng(123);
  for (int64_t dim : {128, 512, 2048}) {
    for (int64_t n : {1, 4, 33}) {
      const DenseTensor gain(DType::BF16, {static_cast<uint64_t>(dim)},
                             rng.uniform_vector(static_cast<size_t>(dim), 0.8f, 1.3f));
      const std::vector<float> residual = rng.uniform_vector(static_cast<size_t>(n * dim), -10.0f, 10.0f);
      const std::vector<float> delta = rng.uniform_vector(residual.size(), -1.0f, 1.0f);
      float* dres = to_device(*be, residual);
      float* ddelta = to_device(*be, delta);
      float* dout = be->alloc(residual.size());
      be->add_rms_norm(dres, ddelta, gain.view(), n, dim, kEps, dout);
      const std::vector<float> got_res = to_host(*be, dres, residual.size());
      const std::vector<float> got = to_host(*be, dout, residual.size());
      std::vector<double> ref_residual = widen(residual);
      const std::vector<double> want =
          ref::add_rms_norm(ref_residual, widen(delta), gain.view(), n, dim, static_cast<double>(kEps));
      std::vector<float> cpu_res = residual;
      std::vector<float> cpu_out(residual.size());
      cpu_be->add_rms_norm(cpu_res.data(), delta.data(), gain.view(), n, dim, kEps, cpu_out.data());
      const std::string label = "dim=" + std::to_string(dim) + " n=" + std::to_string(n);
      const ErrorFigures fr = report("cuda add_rms_norm", label + " residual", got_res, ref_residual);
      const ErrorFigures fo = report("cuda add_rms_norm", label + " out", got, want);
      const ErrorFigures fc = report("cuda add_rms_norm", label + " out vs cpu", got, widen(cpu_out));
      EXPECT_LT(fr.normalised, 1e-7) << "one f32 rounding per element";
      EXPECT_EQ(got_res, cpu_res) << label << ": the residual add is one exact f32 addition";
      EXPECT_LT(fo.normalised, kTol) << label;
      EXPECT_LT(fc.normalised, kCpuTol) << label;
    }
  }
}

TEST(CudaGatedRmsNorm, PerHeadNormTimesSiluGate) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu();
  Rng rng(124);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t n : {1, 7}) {
      const int64_t rows = n * 32;  // n tokens x 32 value heads
      const int64_t dim = 128;
      const DenseTensor gain(dtype, {dim}, rng.uniform_vector(dim, 0.5f, 1.5f));
      std::vector<float> x = rng.uniform_vector(static_cast<size_t>(rows * dim), -2.0f, 2.0f);
      for (int64_t i = 0; i < dim; ++i) x[static_cast<size_t>(dim + i)] = 0.0f;  // a zero row
      std::vector<float> z = rng.uniform_vector(x.size(), -6.0f, 6.0f);
      z[0] = -90.0f;  // silu -> -0 (exp overflow side)
      z[1] = 90.0f;   // silu -> z
      float* dx = to_device(*be, x);
      float* dz = to_device(*be, z);
      float* dout = be->alloc(x.size());
      be->gated_rms_norm(dx, dz, gain.view(), rows, dim, kEps, dout);
      const std::vector<float> got = to_host(*be, dout, x.size());
      std::vector<float> cpu_out(x.size());
      cpu_be->gated_rms_norm(x.data(), z.data(), gain.view(), rows, dim, kEps, cpu_out.data());
      const std::string label = std::string(dtype == DType::F32 ? "f32" : "bf16") +
                                " gain rows=" + std::to_string(rows) + " dim=128";
      const ErrorFigures f = report("cuda gated_rms_norm", label, got,
                                    ref::gated_rms_norm(widen(x), widen(z), gain.view(), rows, dim,
                                                        static_cast<double>(kEps)));
      const ErrorFigures fc = report("cuda gated_rms_norm", label + " vs cpu", got, widen(cpu_out));
      EXPECT_LT(f.normalised, kTol) << label;
      EXPECT_LT(fc.normalised, kCpuTol) << label;
    }
  }
}

// ---- attention_prepare ---------------------------------------------------------------------

struct PrepareCase {
  AttentionDims dims;
  int64_t start_pos;
  int64_t n;
  bool device_pos;  // n == 1 only
};

TEST(CudaAttentionPrepare, NormAndRopeAtSmallAndLargePositions) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu();
  Rng rng(151);
  const AttentionDims d128{8, 2, 128, 32, 1e7};
  for (const PrepareCase& c :
       {PrepareCase{small_dims(), 0, 3, false}, PrepareCase{small_dims(), 100000, 2, false},
        PrepareCase{small_dims(), 100000, 1, true}, PrepareCase{d128, 5, 4, false},
        PrepareCase{model_dims(), 0, 2, false}, PrepareCase{model_dims(), 0, 300, false},
        PrepareCase{model_dims(), 1, 1, true}, PrepareCase{model_dims(), 100000, 2, false},
        PrepareCase{model_dims(), 131071, 1, true}, PrepareCase{model_dims(), 262143, 1, false}}) {
    const AttentionDims& d = c.dims;
    const auto D = static_cast<uint64_t>(d.head_dim);
    const DenseTensor q_norm(DType::BF16, {D}, rng.uniform_vector(D, 0.7f, 1.6f), "q_norm");
    const DenseTensor k_norm(DType::BF16, {D}, rng.uniform_vector(D, 0.7f, 1.6f), "k_norm");
    const auto qg_size = static_cast<size_t>(c.n * d.q_heads * 2 * d.head_dim);
    const auto k_size = static_cast<size_t>(c.n * d.kv_heads * d.head_dim);
    const std::vector<float> qg_in = rng.uniform_vector(qg_size, -3.0f, 3.0f);
    const std::vector<float> k_in = rng.uniform_vector(k_size, -3.0f, 3.0f);
    float* dqg = to_device(*be, qg_in);
    float* dk = to_device(*be, k_in);
    if (c.device_pos) {
      const int32_t* dpos = to_device(*be, std::vector<int32_t>{static_cast<int32_t>(c.start_pos)});
      // The host hint is deliberately wrong: a device position must win.
      be->attention_prepare(dqg, dk, q_norm.view(), k_norm.view(), d, SeqPos(0, dpos), c.n, kEps);
    } else {
      be->attention_prepare(dqg, dk, q_norm.view(), k_norm.view(), d, SeqPos(c.start_pos), c.n, kEps);
    }
    const std::vector<float> qg = to_host(*be, dqg, qg_size);
    const std::vector<float> k = to_host(*be, dk, k_size);
    std::vector<double> ref_qg = widen(qg_in);
    std::vector<double> ref_k = widen(k_in);
    ref::attention_prepare(ref_qg, ref_k, q_norm.view(), k_norm.view(), d, c.start_pos, c.n,
                           static_cast<double>(kEps));
    std::vector<float> cpu_qg = qg_in;
    std::vector<float> cpu_k = k_in;
    cpu_be->attention_prepare(cpu_qg.data(), cpu_k.data(), q_norm.view(), k_norm.view(), d,
                              SeqPos(c.start_pos), c.n, kEps);
    const std::string label = dims_label(d) + " pos=" + std::to_string(c.start_pos) +
                              " n=" + std::to_string(c.n) + (c.device_pos ? " (device pos)" : "");
    const ErrorFigures fq = report("cuda attention_prepare", label + " q", qg, ref_qg);
    const ErrorFigures fk = report("cuda attention_prepare", label + " k", k, ref_k);
    const ErrorFigures fcq = report("cuda attention_prepare", label + " q vs cpu", qg, widen(cpu_qg));
    const ErrorFigures fck = report("cuda attention_prepare", label + " k vs cpu", k, widen(cpu_k));
    EXPECT_LT(fq.normalised, kPrepareTol) << label;
    EXPECT_LT(fk.normalised, kPrepareTol) << label;
    EXPECT_LT(fcq.normalised, kPrepareTol) << label;
    EXPECT_LT(fck.normalised, kPrepareTol) << label;
    for (int64_t t = 0; t < c.n; ++t) {
      for (int64_t h = 0; h < d.q_heads; ++h) {
        for (int64_t i = 0; i < d.head_dim; ++i) {
          const auto at = static_cast<size_t>(((t * d.q_heads + h) * 2 + 1) * d.head_dim + i);
          ASSERT_EQ(qg[at], qg_in[at]) << label << " gate changed at t=" << t << " h=" << h;
        }
      }
    }
    if (c.start_pos >= 100000) {
      std::vector<double> exact_qg = widen(qg_in);
      std::vector<double> exact_k = widen(k_in);
      ref::attention_prepare(exact_qg, exact_k, q_norm.view(), k_norm.view(), d, c.start_pos,
                             c.n, static_cast<double>(kEps), ref::RopeAngle::exact);
      const ErrorFigures fe = report("cuda attention_prepare", label + " q vs f64-angle ref", qg, exact_qg);
      EXPECT_GT(fe.normalised, 10 * kPrepareTol) << label;
    }
  }
}

// ---- attention -----------------------------------------------------------------------------

// Runs CUDA attention, CPU attention and the reference on the same inputs, each with its own
// cache (CUDA's in device memory, poisoned with NaN), and checks the outputs and cache rows.
class CudaAttentionRunner {
 public:
  CudaAttentionRunner(const AttentionDims& dims, int64_t capacity, Backend& cuda, Backend& cpu_be)
      : dims_(dims), capacity_(capacity), cuda_(cuda), cpu_(cpu_be),
        cpu_k_(static_cast<size_t>(capacity * dims.kv_heads * dims.head_dim), kPoison),
        cpu_v_(cpu_k_.size(), kPoison) {
    k_cache_ = to_device(cuda_, cpu_k_);
    v_cache_ = to_device(cuda_, cpu_v_);
    pos_ = to_device(cuda_, std::vector<int32_t>{0});
  }

  size_t row() const { return static_cast<size_t>(dims_.kv_heads * dims_.head_dim); }
  float* k_cache() { return k_cache_; }
  float* v_cache() { return v_cache_; }
  int32_t* device_pos() { return pos_; }
  const AttentionDims& dims() const { return dims_; }
  int64_t capacity() const { return capacity_; }

  // Random rows 0..rows-1 written straight into all three caches (a long history without
  // the cost of the reference attending over it).
  void fill(Rng& rng, int64_t rows) {
    const std::vector<float> k = rng.uniform_vector(static_cast<size_t>(rows) * row(), -1.0f, 1.0f);
    const std::vector<float> v = rng.uniform_vector(k.size(), -2.0f, 2.0f);
    std::copy(k.begin(), k.end(), cpu_k_.begin());
    std::copy(v.begin(), v.end(), cpu_v_.begin());
    cuda_.copy_from_host(k.data(), k.size(), k_cache_);
    cuda_.copy_from_host(v.data(), v.size(), v_cache_);
    ref_k_.assign(static_cast<size_t>(capacity_) * row(), 0.0);
    ref_v_.assign(ref_k_.size(), 0.0);
    for (size_t i = 0; i < k.size(); ++i) {
      ref_k_[i] = static_cast<double>(k[i]);
      ref_v_[i] = static_cast<double>(v[i]);
    }
  }

  void step(Rng& rng, int64_t start_pos, int64_t n, float magnitude, const std::string& what,
            bool device_pos = false) {
    std::vector<float> qg = rng.uniform_vector(static_cast<size_t>(n * dims_.q_heads * 2 * dims_.head_dim), -1.0f, 1.0f);
    std::vector<float> k = rng.uniform_vector(static_cast<size_t>(n) * row(), -1.0f, 1.0f);
    const std::vector<float> v = rng.uniform_vector(k.size(), -2.0f, 2.0f);
    for (float& x : qg) x *= magnitude;
    for (float& x : k) x *= magnitude;
    run(qg, k, v, start_pos, n, what, device_pos);
  }

  // The CUDA output (device buffers for qg, k, v, out are made here unless given).
  std::vector<float> run(const std::vector<float>& qg, const std::vector<float>& k,
                         const std::vector<float>& v, int64_t start_pos, int64_t n,
                         const std::string& what, bool device_pos) {
    float* dqg = to_device(cuda_, qg);
    float* dk = to_device(cuda_, k);
    float* dv = to_device(cuda_, v);
    const auto out_size = static_cast<size_t>(n * dims_.q_heads * dims_.head_dim);
    float* dout = to_device(cuda_, std::vector<float>(out_size, 1e30f));
    if (device_pos) {
      const auto p = static_cast<int32_t>(start_pos);
      cuda_.copy_from_host(&p, 1, pos_);
      // The host hint is ignored by contract; a wrong one shows a backend that used it.
      cuda_.attention(dqg, dk, dv, k_cache_, v_cache_, capacity_, dims_, SeqPos(0, pos_), n, dout);
    } else {
      cuda_.attention(dqg, dk, dv, k_cache_, v_cache_, capacity_, dims_, SeqPos(start_pos), n, dout);
    }
    const std::vector<float> got = to_host(cuda_, dout, out_size);
    check(got, qg, k, v, start_pos, n, what + (device_pos ? " (device pos)" : ""));
    return got;
  }

  // Compares a CUDA output with CPU attention and the reference for the same inputs (which
  // the CUDA side has already consumed), then the CUDA cache.
  void check(const std::vector<float>& got, const std::vector<float>& qg, const std::vector<float>& k,
             const std::vector<float>& v, int64_t start_pos, int64_t n, const std::string& what) {
    if (ref_k_.empty()) {
      ref_k_.assign(static_cast<size_t>(capacity_) * row(), 0.0);
      ref_v_.assign(ref_k_.size(), 0.0);
    }
    std::vector<float> cpu_out(got.size(), 1e30f);
    cpu_.attention(qg.data(), k.data(), v.data(), cpu_k_.data(), cpu_v_.data(), capacity_, dims_,
                   SeqPos(start_pos), n, cpu_out.data());
    const std::vector<double> want = ref::attention(widen(qg), widen(k), widen(v), ref_k_, ref_v_,
                                                    capacity_, dims_, start_pos, n);
    const std::string label = dims_label(dims_) + " cap=" + std::to_string(capacity_) + " " + what;
    const ErrorFigures f = report("cuda attention", label, got, want);
    const ErrorFigures fc = report("cuda attention", label + " vs cpu", got, widen(cpu_out));
    EXPECT_LT(f.normalised, n == 1 ? kTol : kPrefillTol) << label;
    EXPECT_LT(fc.normalised, n == 1 ? kCpuTol : kPrefillTol) << label;
    // New rows stored exactly; rows past the end untouched (NaN: never read, or the output
    // would be NaN too).
    const std::vector<float> kc = to_host(cuda_, k_cache_, cpu_k_.size());
    const std::vector<float> vc = to_host(cuda_, v_cache_, cpu_v_.size());
    const size_t r = row();
    for (size_t i = 0; i < static_cast<size_t>(n) * r; ++i) {
      ASSERT_EQ(kc[static_cast<size_t>(start_pos) * r + i], k[i]) << label;
      ASSERT_EQ(vc[static_cast<size_t>(start_pos) * r + i], v[i]) << label;
    }
    for (size_t i = static_cast<size_t>(start_pos + n) * r; i < kc.size(); ++i) {
      ASSERT_TRUE(std::isnan(kc[i])) << label << " row " << i / r << " written";
      ASSERT_TRUE(std::isnan(vc[i])) << label << " row " << i / r << " written";
    }
  }

 private:
  AttentionDims dims_;
  int64_t capacity_;
  Backend& cuda_;
  Backend& cpu_;
  std::vector<float> cpu_k_, cpu_v_;
  float* k_cache_ = nullptr;
  float* v_cache_ = nullptr;
  int32_t* pos_ = nullptr;
  std::vector<double> ref_k_, ref_v_;
};

TEST(CudaAttention, DecodeWithDevicePositionAcrossSplits) {
  // Capacity 2048: the decode grid is sized from it, the position only known on the device.
  // 255/256 straddle split and tile boundaries; the prefills in between fill the history.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu(4);
  Rng rng(152);
  for (const AttentionDims& d : {small_dims(), AttentionDims{4, 2, 256, 64, 1e7}}) {
    CudaAttentionRunner r(d, 2048, *be, *cpu_be);
    r.step(rng, 0, 1, 1.0f, "decode pos=0", true);  // one key: v * sigmoid(gate)
    r.step(rng, 1, 1, 1.0f, "decode pos=1", true);
    r.step(rng, 2, 253, 1.0f, "prefill n=253 pos=2");
    r.step(rng, 255, 1, 1.0f, "decode pos=255", true);
    r.step(rng, 256, 1, 1.0f, "decode pos=256", true);
    r.step(rng, 257, 1, 1.0f, "decode pos=257 (host pos)", false);
    r.step(rng, 258, 742, 1.0f, "prefill n=742 pos=258");
    r.step(rng, 1000, 1, 1.0f, "decode pos=1000", true);
  }
}

TEST(CudaAttention, PrefillChunksFromStartAndAfterEarlierChunk) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu(4);
  Rng rng(153);
  for (const AttentionDims& d : {small_dims(), AttentionDims{4, 2, 256, 64, 1e7},
                                 AttentionDims{8, 1, 64, 16, 1e7}, AttentionDims{6, 2, 128, 32, 1e7}}) {
    for (int64_t n : {2, 17, 300}) {
      CudaAttentionRunner fresh(d, 512, *be, *cpu_be);
      fresh.step(rng, 0, n, 1.0f, "prefill n=" + std::to_string(n) + " pos=0");
      CudaAttentionRunner later(d, 512, *be, *cpu_be);
      later.step(rng, 0, 100, 1.0f, "prefill n=100 pos=0");
      later.step(rng, 100, n, 1.0f, "prefill n=" + std::to_string(n) + " pos=100");
      later.step(rng, 100 + n, 1, 1.0f, "decode after it", true);
    }
  }
}

TEST(CudaAttention, ModelDims) {
  // 16 query heads over 2 kv heads (group 8), head_dim 256, rotary 64, at a moderate size.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu(4);
  Rng rng(154);
  CudaAttentionRunner r(model_dims(), 700, *be, *cpu_be);
  r.step(rng, 0, 1, 1.0f, "decode pos=0", true);
  r.step(rng, 1, 130, 1.0f, "prefill n=130 pos=1");
  r.step(rng, 131, 1, 1.0f, "decode pos=131", true);
  r.step(rng, 132, 1, 1.0f, "decode pos=132 (host pos)");
  r.step(rng, 133, 400, 1.0f, "prefill n=400 pos=133");
  r.step(rng, 533, 1, 1.0f, "decode pos=533", true);
  r.step(rng, 534, 166, 1.0f, "prefill n=166 pos=534 (fills capacity)");
}

TEST(CudaAttention, LongHistoryDecodeAtLargePositions) {
  // Histories written straight into the caches; decode at the far end, where the split-K
  // grid (sized from the capacity) is fully used.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu(4);
  Rng rng(155);
  {
    CudaAttentionRunner r(small_dims(), 100010, *be, *cpu_be);
    r.fill(rng, 100000);
    r.step(rng, 100000, 1, 1.0f, "decode pos=100000", true);
    r.step(rng, 100001, 1, 1.0f, "decode pos=100001 (host pos)");
    r.step(rng, 100002, 8, 1.0f, "prefill n=8 pos=100002");
  }
  {
    CudaAttentionRunner r(model_dims(), 20000, *be, *cpu_be);
    r.fill(rng, 19990);
    r.step(rng, 19990, 1, 1.0f, "decode pos=19990", true);
    r.step(rng, 19991, 9, 1.0f, "prefill n=9 pos=19991 (fills capacity)");
  }
}

TEST(CudaAttention, LargeMagnitudeAndNegativeInfinityScores) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto cpu_be = cpu();
  Rng rng(156);
  const AttentionDims d = small_dims();
  {
    CudaAttentionRunner r(d, 300, *be, *cpu_be);
    r.step(rng, 0, 70, 40.0f, "scores ~1e2..1e3 prefill n=70");
    r.step(rng, 70, 1, 40.0f, "scores ~1e2..1e3 decode", true);
  }
  {
    // Identical huge keys: every score equal -> uniform average of the values.
    CudaAttentionRunner u(d, 40, *be, *cpu_be);
    const size_t row = u.row();
    std::vector<float> qg(static_cast<size_t>(40 * d.q_heads * 2 * d.head_dim), 30.0f);
    std::vector<float> k(40 * row, 30.0f);
    const std::vector<float> v = rng.uniform_vector(40 * row, -1.0f, 1.0f);
    u.run(qg, k, v, 0, 40, "equal scores of 7200", false);
  }
  {
    // A key with -inf in dimension 0 and queries with q[0] > 0: its score is -inf and its
    // value (+-1e30) must get weight exactly 0, in decode and in a prefill that spans it.
    const auto D = static_cast<size_t>(d.head_dim);
    CudaAttentionRunner r(d, 80, *be, *cpu_be);
    r.step(rng, 0, 2, 1.0f, "prefill n=2 before -inf key");
    const size_t row = r.row();
    std::vector<float> qg = rng.uniform_vector(static_cast<size_t>(d.q_heads) * 2 * D, -1.0f, 1.0f);
    for (size_t h = 0; h < static_cast<size_t>(d.q_heads); ++h) qg[h * 2 * D] = 0.5f + rng.uniform(0.0f, 1.0f);
    std::vector<float> k = rng.uniform_vector(row, -1.0f, 1.0f);
    std::vector<float> v = rng.uniform_vector(row, -1.0f, 1.0f);
    k[0] = -std::numeric_limits<float>::infinity();
    k[D] = -std::numeric_limits<float>::infinity();
    v[0] = 1e30f;
    v[D + 3] = -1e30f;
    r.run(qg, k, v, 2, 1, "decode over a -inf key (pos=2)", true);
    std::vector<float> qg2 = rng.uniform_vector(static_cast<size_t>(40 * d.q_heads) * 2 * D, -1.0f, 1.0f);
    for (size_t t = 0; t < 40; ++t)
      for (size_t h = 0; h < static_cast<size_t>(d.q_heads); ++h) qg2[(t * static_cast<size_t>(d.q_heads) + h) * 2 * D] = 0.25f;
    r.run(qg2, rng.uniform_vector(40 * row, -1.0f, 1.0f), rng.uniform_vector(40 * row, -1.0f, 1.0f), 3,
          40, "prefill n=40 after a -inf key (pos=3)", false);
  }
}

TEST(CudaAttention, GraphReplayReadsTheDevicePosition) {
  // One decode step (prepare + attention) captured once with a device position, replayed at
  // later positions: the replay must read the position, write the right cache row and attend
  // over the right number of keys.
  LILY_CUDA_BACKEND_OR_SKIP(be);
  if (!be->can_capture()) GTEST_SKIP() << "backend cannot capture";
  auto cpu_be = cpu();
  Rng rng(157);
  const AttentionDims d = model_dims();
  const auto D = static_cast<size_t>(d.head_dim);
  CudaAttentionRunner r(d, 1024, *be, *cpu_be);
  r.step(rng, 0, 300, 1.0f, "history prefill n=300");
  const DenseTensor q_norm(DType::BF16, {D}, rng.uniform_vector(D, 0.7f, 1.6f), "q_norm");
  const DenseTensor k_norm(DType::BF16, {D}, rng.uniform_vector(D, 0.7f, 1.6f), "k_norm");
  const size_t qg_size = static_cast<size_t>(d.q_heads) * 2 * D;
  const size_t row = r.row();
  float* dqg = be->alloc(qg_size);
  float* dk = be->alloc(row);
  float* dv = be->alloc(row);
  float* dout = be->alloc(static_cast<size_t>(d.q_heads) * D);
  const SeqPos pos(0, r.device_pos());
  auto upload = [&](const std::vector<float>& qg, const std::vector<float>& k,
                    const std::vector<float>& v, int32_t p) {
    be->copy_from_host(qg.data(), qg.size(), dqg);
    be->copy_from_host(k.data(), k.size(), dk);
    be->copy_from_host(v.data(), v.size(), dv);
    be->copy_from_host(&p, 1, r.device_pos());
  };
  auto step_ops = [&] {
    be->attention_prepare(dqg, dk, q_norm.view(), k_norm.view(), d, pos, 1, kEps);
    be->attention(dqg, dk, dv, r.k_cache(), r.v_cache(), r.capacity(), d, pos, 1, dout);
  };
  int graph = -1;
  for (int32_t p = 300; p < 306; ++p) {
    const std::vector<float> qg_in = rng.uniform_vector(qg_size, -3.0f, 3.0f);
    const std::vector<float> k_in = rng.uniform_vector(row, -3.0f, 3.0f);
    const std::vector<float> v = rng.uniform_vector(row, -2.0f, 2.0f);
    upload(qg_in, k_in, v, p);
    if (p == 300) {
      step_ops();  // eager: sizes the workspace
    } else {
      if (graph < 0) {
        be->begin_capture();
        step_ops();
        graph = be->end_capture();
      }
      be->replay(graph);
    }
    const std::vector<float> got = to_host(*be, dout, static_cast<size_t>(d.q_heads) * D);
    // The prepared q/k as the device computed them feed the CPU and the reference.
    const std::vector<float> qg = to_host(*be, dqg, qg_size);
    const std::vector<float> k = to_host(*be, dk, row);
    std::vector<double> ref_qg = widen(qg_in);
    std::vector<double> ref_k = widen(k_in);
    ref::attention_prepare(ref_qg, ref_k, q_norm.view(), k_norm.view(), d, p, 1, static_cast<double>(kEps));
    const std::string label = "graph step pos=" + std::to_string(p);
    EXPECT_LT(report("cuda attention_prepare", label + " q", qg, ref_qg).normalised, kPrepareTol);
    EXPECT_LT(report("cuda attention_prepare", label + " k", k, ref_k).normalised, kPrepareTol);
    r.check(got, qg, k, v, p, 1, label);
  }
}

}  // namespace
}  // namespace lily::testing

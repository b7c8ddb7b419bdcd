// CUDA backend vs the float64 reference and the CPU backend: conv1d_silu (with its carried
// window), the gated delta rule (with its carried state) and moe_route; plus one decode step of
// all three captured into a CUDA graph and replayed.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

// conv1d_silu and moe_route are a handful of f32 roundings per output (K products and a SiLU;
// an exp and two divisions): observed ~1e-8..1e-7, bound 1e-5 as for the CPU backend.
// The delta rule carries its state across tokens, so f32 roundings accumulate over the
// sequence; with L2-normalised keys (|k| = 1) and beta <= 1 the update is a contraction and the
// error stays at the level of one step, so the CPU test's bound 1e-5 applies too (CUDA differs
// from the CPU only by FMA contraction and the summation order of the length-Dk dot products).
constexpr double kTol = 1e-5;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<double> widen(const std::vector<float>& v) { return ref::widen(v); }

// The model's Gated DeltaNet: C = 2*16*128 + 32*128 = 8192 channels.
GatedDeltaNetDims model_dims() { return {16, 32, 128, 128, 4}; }

// Exact comparison of an f32 buffer with a reference that only copied f32 values.
void expect_exact(const std::vector<float>& got, const std::vector<double>& want,
                  const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(static_cast<double>(got[i]), want[i]) << label << " at " << i;
  }
}

std::string dims_label(const GatedDeltaNetDims& d) {
  return "Hk=" + std::to_string(d.key_heads) + " Hv=" + std::to_string(d.value_heads) +
         " Dk=" + std::to_string(d.key_dim) + " Dv=" + std::to_string(d.value_dim);
}

// ---- conv1d_silu ------------------------------------------------------------------------------

// One conv layer run three ways with the same weights and starting window: CUDA (window in
// device memory), the CPU backend and the float64 reference (each with its own window).
class ConvRunner {
 public:
  ConvRunner(Rng& rng, const GatedDeltaNetDims& d, Backend& gpu, Backend& host)
      : d_(d), gpu_(gpu), host_(host),
        weight_(DType::BF16, {static_cast<uint64_t>(d.channels()), static_cast<uint64_t>(d.conv_kernel), 1},
                rng.uniform_vector(static_cast<size_t>(d.channels() * d.conv_kernel), -0.6f, 0.6f),
                "conv1d"),
        host_window_(rng.uniform_vector(static_cast<size_t>((d.conv_kernel - 1) * d.channels()), -2.0f, 2.0f)),
        ref_window_(widen(host_window_)),
        device_window_(to_device(gpu, host_window_)) {}

  std::vector<float> step(const std::vector<float>& mixed, int64_t n, const std::string& label) {
    float* d_mixed = to_device(gpu_, mixed);
    float* d_out = gpu_.alloc(mixed.size());
    gpu_.conv1d_silu(d_mixed, device_window_, weight_.view(), d_, n, d_out);
    const std::vector<float> out = to_host(gpu_, d_out, mixed.size());
    const std::vector<float> window = to_host(gpu_, device_window_, host_window_.size());

    std::vector<float> cpu_out(mixed.size(), 1e30f);
    host_.conv1d_silu(mixed.data(), host_window_.data(), weight_.view(), d_, n, cpu_out.data());
    const std::vector<double> want = ref::conv1d_silu(widen(mixed), ref_window_, weight_.view(), d_, n);

    const ErrorFigures f = report("cuda conv1d_silu", label, out, want);
    EXPECT_LT(f.normalised, kTol) << label;
    const ErrorFigures fc = report("cuda conv1d_silu", label + " vs cpu", out, widen(cpu_out));
    EXPECT_LT(fc.normalised, kTol) << label;
    // The window only copies inputs: exact.
    expect_exact(window, ref_window_, label + " window");
    EXPECT_EQ(window, host_window_) << label << " window vs cpu";
    return out;
  }

 private:
  GatedDeltaNetDims d_;
  Backend& gpu_;
  Backend& host_;
  DenseTensor weight_;
  std::vector<float> host_window_;
  std::vector<double> ref_window_;
  float* device_window_;
};

std::vector<float> random_mixed(Rng& rng, const GatedDeltaNetDims& d, int64_t n) {
  return rng.uniform_vector(static_cast<size_t>(n * d.channels()), -2.0f, 2.0f);
}

TEST(CudaConv1dSilu, ModelDimsDecodeStepsThenPrefillChunks) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu(2);
  Rng rng(161);
  const GatedDeltaNetDims d = model_dims();
  ConvRunner r(rng, d, *be, *host);
  // Decode: n = 1 repeatedly, the window carried from step to step.
  for (int i = 0; i < 6; ++i) r.step(random_mixed(rng, d, 1), 1, "model decode step " + std::to_string(i));
  // Then chunks, still carrying the window: n = 5, n = 300, n = 1.
  for (int64_t n : {5, 300, 1}) r.step(random_mixed(rng, d, n), n, "model carried n=" + std::to_string(n));
}

TEST(CudaConv1dSilu, SmallDimsEveryChunkSizeFromAFreshWindow) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu(2);
  Rng rng(162);
  // n < K-1, = K-1, = K, and sizes around power-of-two tile edges; K = 2 and 8 as well.
  for (int64_t kernel : {4, 2, 8}) {
    const GatedDeltaNetDims d{2, 4, 32, 32, kernel};
    for (int64_t n : {1, 2, 3, 4, 7, 31, 32, 33, 64, 65, 130}) {
      ConvRunner r(rng, d, *be, *host);
      r.step(random_mixed(rng, d, n), n,
             "K=" + std::to_string(kernel) + " fresh window n=" + std::to_string(n));
    }
  }
}

TEST(CudaConv1dSilu, SplitCallsEqualOneCall) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu(2);
  Rng rng(163);
  const GatedDeltaNetDims d = model_dims();
  const auto C = static_cast<long>(d.channels());
  const std::vector<float> mixed = random_mixed(rng, d, 300);
  Rng twin_a(17);
  Rng twin_b(17);
  ConvRunner whole(twin_a, d, *be, *host);
  ConvRunner split(twin_b, d, *be, *host);  // same weights and window
  const std::vector<float> one = whole.step(mixed, 300, "one call n=300");
  std::vector<float> parts = split.step({mixed.begin(), mixed.begin() + 100 * C}, 100, "split 100 of 300");
  const std::vector<float> rest = split.step({mixed.begin() + 100 * C, mixed.end()}, 200, "split 200 of 300");
  parts.insert(parts.end(), rest.begin(), rest.end());
  // Every output is the same K products of the same inputs either way: identical.
  EXPECT_EQ(parts, one);
}

// ---- gated_delta_rule -------------------------------------------------------------------------

struct DeltaInputs {
  std::vector<float> conv, a, b;
};

DeltaInputs random_inputs(Rng& rng, const GatedDeltaNetDims& d, int64_t n) {
  DeltaInputs in;
  // The conv output is a SiLU: mostly positive, down to -0.28.
  in.conv = rng.uniform_vector(static_cast<size_t>(n * d.channels()), -0.28f, 2.0f);
  in.a = rng.uniform_vector(static_cast<size_t>(n * d.value_heads), -3.0f, 3.0f);
  in.b = rng.uniform_vector(in.a.size(), -4.0f, 4.0f);
  return in;
}

// One delta-rule layer run three ways from the same A_log, dt_bias and starting state.
class DeltaRunner {
 public:
  DeltaRunner(Rng& rng, const GatedDeltaNetDims& d, Backend& gpu, Backend& host, bool random_state,
              DType a_log_type = DType::F32, DType dt_bias_type = DType::BF16)
      : d_(d), gpu_(gpu), host_(host),
        a_log_(a_log_type, {static_cast<uint64_t>(d.value_heads)},
               rng.uniform_vector(static_cast<size_t>(d.value_heads), 0.0f, 2.7f), "A_log"),
        dt_bias_(dt_bias_type, {static_cast<uint64_t>(d.value_heads)},
                 rng.uniform_vector(static_cast<size_t>(d.value_heads), -1.0f, 1.0f), "dt_bias"),
        host_state_(static_cast<size_t>(d.value_heads * d.key_dim * d.value_dim), 0.0f) {
    if (random_state) host_state_ = rng.uniform_vector(host_state_.size(), -0.5f, 0.5f);
    ref_state_ = widen(host_state_);
    device_state_ = to_device(gpu, host_state_);
  }

  std::vector<float> step(const DeltaInputs& in, int64_t n, const std::string& label) {
    const auto out_count = static_cast<size_t>(n * d_.value_heads * d_.value_dim);
    float* d_conv = to_device(gpu_, in.conv);
    float* d_a = to_device(gpu_, in.a);
    float* d_b = to_device(gpu_, in.b);
    float* d_out = gpu_.alloc(out_count);
    gpu_.gated_delta_rule(d_conv, d_a, d_b, a_log_.view(), dt_bias_.view(), device_state_, d_, n, d_out);
    const std::vector<float> out = to_host(gpu_, d_out, out_count);
    state_ = to_host(gpu_, device_state_, host_state_.size());

    std::vector<float> cpu_out(out_count, 1e30f);
    host_.gated_delta_rule(in.conv.data(), in.a.data(), in.b.data(), a_log_.view(), dt_bias_.view(),
                           host_state_.data(), d_, n, cpu_out.data());
    const std::vector<double> want = ref::gated_delta_rule(widen(in.conv), widen(in.a), widen(in.b),
                                                           a_log_.view(), dt_bias_.view(), ref_state_, d_, n);

    const ErrorFigures fo = report("cuda gated_delta_rule", label + " out", out, want);
    const ErrorFigures fs = report("cuda gated_delta_rule", label + " state", state_, ref_state_);
    const ErrorFigures co = report("cuda gated_delta_rule", label + " out vs cpu", out, widen(cpu_out));
    const ErrorFigures cs = report("cuda gated_delta_rule", label + " state vs cpu", state_, widen(host_state_));
    EXPECT_LT(fo.normalised, kTol) << label;
    EXPECT_LT(fs.normalised, kTol) << label;
    EXPECT_LT(co.normalised, kTol) << label;
    EXPECT_LT(cs.normalised, kTol) << label;
    return out;
  }

  const std::vector<float>& state() const { return state_; }  // CUDA's, after the last step

 private:
  GatedDeltaNetDims d_;
  Backend& gpu_;
  Backend& host_;
  DenseTensor a_log_, dt_bias_;
  std::vector<float> host_state_;
  std::vector<double> ref_state_;
  float* device_state_ = nullptr;
  std::vector<float> state_;
};

TEST(CudaGatedDeltaRule, SmallDimsSingleTokensAndSequences) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu(2);
  Rng rng(171);
  // Two value heads per key head; Dk != Dv in two of them so a transposed state index fails.
  const GatedDeltaNetDims all[] = {{2, 4, 32, 32, 4}, {2, 4, 64, 64, 4}, {2, 4, 32, 64, 4}, {2, 4, 64, 32, 4}};
  for (const GatedDeltaNetDims& d : all) {
    const std::string dl = dims_label(d);
    {
      DeltaRunner r(rng, d, *be, *host, false);
      r.step(random_inputs(rng, d, 1), 1, dl + " n=1 zero state");
    }
    {
      DeltaRunner r(rng, d, *be, *host, true, DType::BF16, DType::F32);
      r.step(random_inputs(rng, d, 1), 1, dl + " n=1 random state");
    }
    {
      // Carried state: decode steps, a chunk that is not a multiple of anything, a long one.
      DeltaRunner r(rng, d, *be, *host, true);
      for (int64_t n : {1, 1, 12, 1, 5, 64, 9}) {
        r.step(random_inputs(rng, d, n), n, dl + " carried n=" + std::to_string(n));
      }
    }
  }
}

TEST(CudaGatedDeltaRule, ModelDimsDecodeAndPrefill) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu(2);
  Rng rng(172);
  const GatedDeltaNetDims d = model_dims();
  {
    DeltaRunner r(rng, d, *be, *host, false);
    r.step(random_inputs(rng, d, 1), 1, "model n=1 zero state");
  }
  DeltaRunner r(rng, d, *be, *host, true);
  for (int64_t n : {1, 1, 1, 64, 1, 3}) {
    r.step(random_inputs(rng, d, n), n, "model carried n=" + std::to_string(n));
  }
}

TEST(CudaGatedDeltaRule, CarriedStateEqualsOneCallOverTheConcatenation) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu(2);
  Rng rng(173);
  const GatedDeltaNetDims d = model_dims();
  const DeltaInputs all = random_inputs(rng, d, 20);
  Rng twin_a(19);
  DeltaRunner whole(twin_a, d, *be, *host, true);
  const std::vector<float> one = whole.step(all, 20, "one call n=20");
  const auto C = static_cast<long>(d.channels());
  const auto Hv = static_cast<long>(d.value_heads);
  // The same tokens in several launches, from the same A_log, dt_bias and initial state.
  const auto run_split = [&](std::initializer_list<std::pair<long, long>> parts, DeltaRunner& split) {
    std::vector<float> joined;
    for (auto [begin, count] : parts) {
      const DeltaInputs part{{all.conv.begin() + begin * C, all.conv.begin() + (begin + count) * C},
                             {all.a.begin() + begin * Hv, all.a.begin() + (begin + count) * Hv},
                             {all.b.begin() + begin * Hv, all.b.begin() + (begin + count) * Hv}};
      const std::vector<float> out =
          split.step(part, count, "split at " + std::to_string(begin) + " n=" + std::to_string(count));
      joined.insert(joined.end(), out.begin(), out.end());
    }
    return joined;
  };
  {
    // Chunked launches (n >= 2): each (head, column) runs the same per-token arithmetic however
    // the tokens are split and whichever launch shape a token count picks: identical.
    Rng twin_b(19);
    DeltaRunner split(twin_b, d, *be, *host, true);
    EXPECT_EQ(run_split({{0, 3}, {3, 2}, {5, 15}}, split), one);
    EXPECT_EQ(split.state(), whole.state());
  }
  {
    // A one-token launch sums the Dk rows of its dot products in another order (the decode
    // kernel's row groups), so it may differ in the last bits; at f32 rounding, not more.
    Rng twin_c(19);
    DeltaRunner split(twin_c, d, *be, *host, true);
    const std::vector<float> joined = run_split({{0, 3}, {3, 1}, {4, 1}, {5, 15}}, split);
    EXPECT_LT(compare_f32(joined, one).normalised, 1e-6);
    EXPECT_LT(compare_f32(split.state(), whole.state()).normalised, 1e-6);
  }
}

TEST(CudaGatedDeltaRule, ExtremeDecayAndBeta) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu(2);
  Rng rng(174);
  const GatedDeltaNetDims d{2, 4, 32, 64, 4};
  auto with = [&](float a, float b) {
    DeltaInputs in = random_inputs(rng, d, 3);
    for (float& x : in.a) x = a;
    for (float& x : in.b) x = b;
    return in;
  };
  {
    DeltaRunner r(rng, d, *be, *host, true);
    r.step(with(1e4f, 0.5f), 3, "a=+1e4 (alpha=0, state wiped)");
  }
  {
    DeltaRunner r(rng, d, *be, *host, true);
    r.step(with(-1e4f, 0.5f), 3, "a=-1e4 (alpha=1, no decay)");
  }
  {
    DeltaRunner r(rng, d, *be, *host, true);
    r.step(with(0.3f, 1e4f), 3, "b=+1e4 (beta=1)");
    r.step(with(0.3f, -1e4f), 3, "b=-1e4 (beta=0)");
    r.step(with(30.0f, -30.0f), 3, "a=30 b=-30 (softplus linear branch)");
  }
  {
    // Zero q and k vectors: the L2 norm's 1e-6 keeps them zero instead of NaN.
    DeltaRunner r(rng, d, *be, *host, true);
    DeltaInputs in = random_inputs(rng, d, 2);
    const auto key_width = static_cast<size_t>(2 * d.key_heads * d.key_dim);
    for (size_t i = 0; i < key_width; ++i) in.conv[i] = 0.0f;  // token 0: q and k all zero
    r.step(in, 2, "zero q and k at token 0");
  }
}

// ---- moe_route --------------------------------------------------------------------------------

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route_on_cuda(Backend& be, const std::vector<float>& logits, int64_t n, int64_t E, int64_t k) {
  float* d_logits = to_device(be, logits);
  int32_t* d_ids = be.alloc_i32(static_cast<size_t>(n * k));
  float* d_weights = be.alloc(static_cast<size_t>(n * k));
  be.moe_route(d_logits, n, E, k, d_ids, d_weights);
  return {to_host(be, d_ids, static_cast<size_t>(n * k)), to_host(be, d_weights, static_cast<size_t>(n * k))};
}

// Ids exactly as the float64 reference and the CPU backend (the logits are not near ties),
// weights within kTol.
Routed expect_route(Backend& gpu, Backend& host, const std::vector<float>& logits, int64_t n,
                    int64_t E, int64_t k, const std::string& label) {
  const Routed got = route_on_cuda(gpu, logits, n, E, k);
  const ref::Routing want = ref::moe_route(widen(logits), n, E, k);
  EXPECT_EQ(got.ids, want.ids) << label;
  const ErrorFigures f = report("cuda moe_route", label, got.weights, want.weights);
  EXPECT_LT(f.normalised, kTol) << label;
  std::vector<int32_t> cpu_ids(static_cast<size_t>(n * k), -1);
  std::vector<float> cpu_weights(cpu_ids.size(), -1.0f);
  host.moe_route(logits.data(), n, E, k, cpu_ids.data(), cpu_weights.data());
  EXPECT_EQ(got.ids, cpu_ids) << label << " vs cpu";
  const ErrorFigures fc = report("cuda moe_route", label + " vs cpu", got.weights, widen(cpu_weights));
  EXPECT_LT(fc.normalised, kTol) << label;
  return got;
}

TEST(CudaMoeRoute, RandomLogitsTopK) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu(2);
  Rng rng(181);
  for (int64_t n : {1, 100}) {
    const std::string ns = " n=" + std::to_string(n);
    expect_route(*be, *host, rng.uniform_vector(static_cast<size_t>(n * 256), -4.0f, 4.0f), n, 256, 8, "E=256 k=8" + ns);
    expect_route(*be, *host, rng.uniform_vector(static_cast<size_t>(n * 6), -4.0f, 4.0f), n, 6, 3, "E=6 k=3" + ns);
  }
  expect_route(*be, *host, rng.uniform_vector(3 * 10, -30.0f, 30.0f), 3, 10, 3, "E=10 k=3 wide logits");
  expect_route(*be, *host, rng.uniform_vector(5 * 1024, -4.0f, 4.0f), 5, 1024, 16, "E=1024 k=16");
  expect_route(*be, *host, rng.uniform_vector(4 * 33, -4.0f, 4.0f), 4, 33, 5, "E=33 k=5");
  expect_route(*be, *host, rng.uniform_vector(2 * 12, -3.0f, 3.0f), 2, 12, 12, "k=E=12");
}

TEST(CudaMoeRoute, TiesPickLowestIdsAndInfinitiesHaveZeroWeight) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  auto host = cpu(2);
  {
    // All equal: ids 0..k-1 in every row, weights exactly 1/k (all sums of powers of two).
    const Routed r = expect_route(*be, *host, std::vector<float>(2 * 256, 0.75f), 2, 256, 8, "all tied E=256 k=8");
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}));
    for (float w : r.weights) EXPECT_EQ(w, 0.125f);
  }
  {
    const Routed r = expect_route(*be, *host, std::vector<float>(100 * 6, -1.5f), 100, 6, 3, "all tied E=6 k=3 n=100");
    for (int64_t t = 0; t < 100; ++t) {
      for (int32_t j = 0; j < 3; ++j) EXPECT_EQ(r.ids[static_cast<size_t>(t * 3 + j)], j);
    }
    for (float w : r.weights) EXPECT_FLOAT_EQ(w, 1.0f / 3.0f);
  }
  // Partial ties: 3.0 at ids 1, 2, 4; k = 2 takes 1 and 2; k = 4 then 3 (2.0).
  expect_route(*be, *host, {1, 3, 3, 2, 3}, 1, 5, 2, "partial tie k=2");
  expect_route(*be, *host, {1, 3, 3, 2, 3}, 1, 5, 4, "partial tie k=4");
  // -inf experts have probability 0: chosen only when k exceeds the finite ones, lowest id first.
  expect_route(*be, *host, {kNegInf, 1.0f, kNegInf, 2.0f, kNegInf, 0.5f}, 1, 6, 3, "-inf, k=finite count");
  expect_route(*be, *host, {kNegInf, 1.0f, kNegInf, 2.0f, kNegInf, 0.5f}, 1, 6, 5, "-inf, k>finite count");
  expect_route(*be, *host, {kNegInf, kNegInf, 5.0f, kNegInf}, 1, 4, 1, "single finite expert");
}

// ---- gated_delta_net_mixer ----------------------------------------------------------------------

// The mixer after the input projections (conv, delta rule, gated norm, output projection) over
// consecutive steps with carried window and state, three ways: the CUDA backend (for n = 1 the
// conv runs inside the delta rule's launch and the window shifts in the projection's; on 9.0
// code the gated norm runs in the delta rule's launch too, its output checked bit for bit
// against the gated_rms_norm op on the same core output), the CUDA
// backend with that fusion off (--cuda-disable fused-conv: the four ops) and the CPU backend.
// The path counts show that the fused path ran for every one-token step, and never unfused.
// A window shifted too early (before every block read it) or not at all, a wrong q/k/v channel
// in the fused conv, or a stale conv output shows up as a window mismatch or an O(1) error.
TEST(CudaGatedDeltaNetMixer, FusedConvStepsMatchTheThreeOps) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  std::string why;
  std::unique_ptr<Backend> unfused = cuda_backend_or_null(CudaOptions::disabling("fused-conv"), &why);
  ASSERT_TRUE(unfused) << why;
  // Compute capability 9.0 code: the gated norm runs inside the delta rule's launch too.
  const bool clusters = be->code_path().find("gated norm inside the delta rule on") != std::string::npos;
  if (!clusters) std::printf("[cuda] the gated norm runs as a launch of its own: %s\n", be->code_path().c_str());
  auto host = cpu(2);
  Rng rng(181);
  // Two value heads per key head; Dk != Dv in one; the model's shape.
  const GatedDeltaNetDims all[] = {{2, 4, 32, 32, 4}, {2, 4, 64, 32, 4}, {2, 4, 128, 64, 4}, model_dims()};
  for (const GatedDeltaNetDims& d : all) {
    const std::string dl = dims_label(d);
    const auto C = static_cast<size_t>(d.channels());
    const auto Hv = static_cast<size_t>(d.value_heads);
    const auto Dv = static_cast<size_t>(d.value_dim);
    const auto K = static_cast<size_t>(d.conv_kernel);
    const uint64_t H = d.key_dim == 128 && d.key_heads == 16 ? 2048 : 96;
    const DenseTensor conv(DType::BF16, {C, K, 1}, rng.uniform_vector(C * K, -0.6f, 0.6f), "conv1d");
    const DenseTensor a_log(DType::F32, {Hv}, rng.uniform_vector(Hv, 0.0f, 2.7f), "A_log");
    const DenseTensor dt_bias(DType::BF16, {Hv}, rng.uniform_vector(Hv, -1.0f, 1.0f), "dt_bias");
    const DenseTensor norm(DType::BF16, {Dv}, rng.uniform_vector(Dv, 0.5f, 1.5f), "norm");
    const QuantWeight out_proj(rng, 4, 1, H, Hv * Dv, 0, "out_proj");
    const GatedDeltaNetWeights w = mixer_weights(conv, a_log, dt_bias, norm, out_proj);
    const size_t state_count = Hv * static_cast<size_t>(d.key_dim) * Dv;

    // Per backend: window, state and the scratch/output buffers.
    struct Side {
      Backend* be;
      float *window, *state, *conv_out, *core_out, *normed, *y;
    };
    const std::vector<float> window0 = rng.uniform_vector((K - 1) * C, -2.0f, 2.0f);
    const std::vector<float> state0 = rng.uniform_vector(state_count, -0.5f, 0.5f);
    auto side = [&](Backend& b, size_t n_max) {
      return Side{&b, to_device(b, window0), to_device(b, state0), b.alloc(n_max * C),
                  b.alloc(n_max * Hv * Dv), b.alloc(n_max * Hv * Dv), b.alloc(n_max * H)};
    };
    constexpr size_t kMaxTokens = 3;
    Side sides[] = {side(*be, kMaxTokens), side(*unfused, kMaxTokens), side(*host, kMaxTokens)};
    // Five decode steps, a 3-token call (the op's unfused path on CUDA too), two more steps.
    const uint64_t fused_before = path_counts(*be).fused_conv_delta;
    const uint64_t norm_before = path_counts(*be).gated_norm_in_delta;
    int step = 0;
    for (int64_t n : {1, 1, 1, 1, 1, 3, 1, 1}) {
      const std::string label = dl + " step " + std::to_string(step++) + " n=" + std::to_string(n);
      const auto un = static_cast<size_t>(n);
      const std::vector<float> mixed = rng.uniform_vector(un * C, -2.0f, 2.0f);
      const std::vector<float> z = rng.uniform_vector(un * Hv * Dv, -3.0f, 3.0f);
      const std::vector<float> a = rng.uniform_vector(un * Hv, -3.0f, 3.0f);
      const std::vector<float> b = rng.uniform_vector(un * Hv, -4.0f, 4.0f);
      std::vector<std::vector<float>> y, state, window, normed;
      for (Side& x : sides) {
        Backend& b2 = *x.be;
        float* z_dev = to_device(b2, z);
        b2.gated_delta_net_mixer(w, d, 1e-6f, to_device(b2, mixed), z_dev, to_device(b2, a),
                                 to_device(b2, b), x.window, x.state, n, x.conv_out, x.core_out,
                                 x.normed, x.y);
        y.push_back(to_host(b2, x.y, un * H));
        state.push_back(to_host(b2, x.state, state_count));
        window.push_back(to_host(b2, x.window, window0.size()));
        normed.push_back(to_host(b2, x.normed, un * Hv * Dv));
        if (x.be == be.get()) {
          // The gated norm as an op of its own on the mixer's core output: the same bits as the
          // norm formed inside the delta rule's launch (same order of every sum and product).
          float* again = b2.alloc(un * Hv * Dv);
          b2.gated_rms_norm(x.core_out, z_dev, w.norm, n * d.value_heads, d.value_dim, 1e-6f, again);
          EXPECT_EQ(normed.back(), to_host(b2, again, un * Hv * Dv)) << label << ": normed vs the op";
        }
      }
      // The window only ever holds copied inputs: equal bit for bit on every side.
      EXPECT_EQ(window[0], window[2]) << label << ": fused window vs cpu";
      EXPECT_EQ(window[1], window[2]) << label << ": unfused window vs cpu";
      const ErrorFigures fy = report("cuda gated_delta_net_mixer", label + " y vs cpu", y[0], widen(y[2]));
      const ErrorFigures fs = report("cuda gated_delta_net_mixer", label + " state vs cpu", state[0], widen(state[2]));
      EXPECT_LT(fy.normalised, kTol) << label;
      EXPECT_LT(fs.normalised, kTol) << label;
      // Fused and unfused CUDA run the same arithmetic (the conv's expression, the delta
      // rule's code): within f32 rounding of each other, far below the CPU bound.
      EXPECT_LT(compare_f32(y[0], y[1]).normalised, 1e-6) << label << ": fused vs unfused y";
      EXPECT_LT(compare_f32(state[0], state[1]).normalised, 1e-6) << label << ": fused vs unfused state";
      EXPECT_LT(compare_f32(normed[0], normed[1]).normalised, 1e-6) << label << ": fused vs unfused normed";
      EXPECT_LT(report("cuda gated_delta_net_mixer", label + " normed vs cpu", normed[0], widen(normed[2])).normalised, kTol)
          << label;
    }
    EXPECT_EQ(path_counts(*be).fused_conv_delta - fused_before, 7u) << dl << ": one per n = 1 step";
    EXPECT_EQ(path_counts(*be).gated_norm_in_delta - norm_before, clusters ? 7u : 0u)
        << dl << ": the gated norm inside the delta rule, one per n = 1 step";
  }
  EXPECT_EQ(path_counts(*unfused).fused_conv_delta, 0u);
  EXPECT_EQ(path_counts(*unfused).gated_norm_in_delta, 0u);
}

// ---- graph capture ----------------------------------------------------------------------------

// One decode step (conv -> delta rule, and a routing) recorded into a CUDA graph and replayed
// three times gives bit for bit what three eager steps give: nothing in the three ops depends
// on host state at launch time.
TEST(CudaGdnRoute, DecodeStepCapturedInAGraphReplaysLikeEagerSteps) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  if (!be->can_capture()) GTEST_SKIP() << "backend cannot capture";
  Rng rng(191);
  const GatedDeltaNetDims d = model_dims();
  const auto C = static_cast<size_t>(d.channels());
  const auto Hv = static_cast<size_t>(d.value_heads);
  const size_t state_count = Hv * static_cast<size_t>(d.key_dim * d.value_dim);
  const size_t out_count = Hv * static_cast<size_t>(d.value_dim);
  const DenseTensor weight(DType::BF16, {C, static_cast<uint64_t>(d.conv_kernel), 1},
                           rng.uniform_vector(C * static_cast<size_t>(d.conv_kernel), -0.6f, 0.6f), "conv1d");
  const DenseTensor a_log(DType::F32, {Hv}, rng.uniform_vector(Hv, 0.0f, 2.7f), "A_log");
  const DenseTensor dt_bias(DType::BF16, {Hv}, rng.uniform_vector(Hv, -1.0f, 1.0f), "dt_bias");
  const std::vector<float> window0 = rng.uniform_vector(static_cast<size_t>(d.conv_kernel - 1) * C, -2.0f, 2.0f);
  const std::vector<float> state0 = rng.uniform_vector(state_count, -0.5f, 0.5f);
  float* mixed = to_device(*be, rng.uniform_vector(C, -2.0f, 2.0f));
  float* a = to_device(*be, rng.uniform_vector(Hv, -3.0f, 3.0f));
  float* b = to_device(*be, rng.uniform_vector(Hv, -4.0f, 4.0f));
  float* logits = to_device(*be, rng.uniform_vector(256, -4.0f, 4.0f));

  struct Buffers {
    float* window;
    float* state;
    float* conv;
    float* out;
    int32_t* ids;
    float* weights;
  };
  auto make = [&]() {
    return Buffers{to_device(*be, window0), to_device(*be, state0), be->alloc(C), be->alloc(out_count),
                   be->alloc_i32(8), be->alloc(8)};
  };
  auto issue = [&](const Buffers& x) {
    be->conv1d_silu(mixed, x.window, weight.view(), d, 1, x.conv);
    be->gated_delta_rule(x.conv, a, b, a_log.view(), dt_bias.view(), x.state, d, 1, x.out);
    be->moe_route(logits, 1, 256, 8, x.ids, x.weights);
  };
  const Buffers eager = make();
  const Buffers graph = make();
  for (int i = 0; i < 3; ++i) issue(eager);  // also uploads the weights, outside the capture
  be->begin_capture();
  issue(graph);
  const int g = be->end_capture();
  for (int i = 0; i < 3; ++i) be->replay(g);
  be->synchronize();
  EXPECT_EQ(to_host(*be, graph.window, window0.size()), to_host(*be, eager.window, window0.size()));
  EXPECT_EQ(to_host(*be, graph.state, state_count), to_host(*be, eager.state, state_count));
  EXPECT_EQ(to_host(*be, graph.out, out_count), to_host(*be, eager.out, out_count));
  EXPECT_EQ(to_host(*be, graph.ids, 8), to_host(*be, eager.ids, 8));
  EXPECT_EQ(to_host(*be, graph.weights, 8), to_host(*be, eager.weights, 8));
  // And the state did move: three steps from state0.
  EXPECT_NE(to_host(*be, eager.state, state_count), state0);
}

// ---- launch order -------------------------------------------------------------------------------

// The conv, the one-token delta rule and the fused mixer read their window or state before their
// dependency wait (programmatic dependent launch), so the backend refuses to launch one right
// after the launch that wrote that buffer (cuda::LaunchOrder): with std::logic_error, before
// anything is launched, and accepts it once another op or a copy is in between. The model never
// issues such a pair; a refused pair that ran would read a state still being written.
TEST(CudaLaunchOrder, RefusesAReadBeforeTheWaitRightAfterTheWrite) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(193);
  const GatedDeltaNetDims d = model_dims();
  const auto C = static_cast<size_t>(d.channels());
  const auto Hv = static_cast<size_t>(d.value_heads);
  const auto Dv = static_cast<size_t>(d.value_dim);
  const auto K = static_cast<size_t>(d.conv_kernel);
  const size_t state_count = Hv * static_cast<size_t>(d.key_dim) * Dv;
  const DenseTensor conv(DType::BF16, {C, K, 1}, rng.uniform_vector(C * K, -0.6f, 0.6f), "conv1d");
  const DenseTensor a_log(DType::F32, {Hv}, rng.uniform_vector(Hv, 0.0f, 2.7f), "A_log");
  const DenseTensor dt_bias(DType::BF16, {Hv}, rng.uniform_vector(Hv, -1.0f, 1.0f), "dt_bias");
  const DenseTensor norm(DType::BF16, {Dv}, rng.uniform_vector(Dv, 0.5f, 1.5f), "norm");
  const QuantWeight out_proj(rng, 4, 1, 2048, Hv * Dv, 0, "out_proj");
  const GatedDeltaNetWeights w = mixer_weights(conv, a_log, dt_bias, norm, out_proj);
  const std::vector<float> window0 = rng.uniform_vector((K - 1) * C, -2.0f, 2.0f);
  const std::vector<float> state0 = rng.uniform_vector(state_count, -0.5f, 0.5f);
  float* mixed = to_device(*be, rng.uniform_vector(C, -2.0f, 2.0f));
  float* z = to_device(*be, rng.uniform_vector(Hv * Dv, -3.0f, 3.0f));
  float* a = to_device(*be, rng.uniform_vector(Hv, -3.0f, 3.0f));
  float* b = to_device(*be, rng.uniform_vector(Hv, -4.0f, 4.0f));
  float* logits = to_device(*be, rng.uniform_vector(256, -4.0f, 4.0f));
  int32_t* ids = be->alloc_i32(8);
  float* weights = be->alloc(8);
  float* window = to_device(*be, window0);
  float* state = to_device(*be, state0);
  float* conv_out = be->alloc(C);
  float* core_out = be->alloc(Hv * Dv);
  float* normed = be->alloc(Hv * Dv);
  float* y = be->alloc(2048);
  // The same steps on a second window and state that no refused call touched.
  float* window_ref = to_device(*be, window0);
  float* state_ref = to_device(*be, state0);

  // conv1d_silu right after conv1d_silu on the same window.
  be->conv1d_silu(mixed, window, w.conv1d, d, 1, conv_out);
  EXPECT_THROW(be->conv1d_silu(mixed, window, w.conv1d, d, 1, conv_out), std::logic_error);
  be->conv1d_silu(mixed, window_ref, w.conv1d, d, 1, conv_out);
  EXPECT_EQ(to_host(*be, window, window0.size()), to_host(*be, window_ref, window0.size()))
      << "the refused conv shifted the window";
  // After a copy (to_host above), the same conv is accepted.
  EXPECT_NO_THROW(be->conv1d_silu(mixed, window, w.conv1d, d, 1, conv_out));
  be->conv1d_silu(mixed, window_ref, w.conv1d, d, 1, conv_out);

  // The one-token delta rule right after one on the same state; accepted with a routing between.
  be->gated_delta_rule(conv_out, a, b, w.a_log, w.dt_bias, state, d, 1, core_out);
  EXPECT_THROW(be->gated_delta_rule(conv_out, a, b, w.a_log, w.dt_bias, state, d, 1, core_out),
               std::logic_error);
  be->moe_route(logits, 1, 256, 8, ids, weights);
  EXPECT_NO_THROW(be->gated_delta_rule(conv_out, a, b, w.a_log, w.dt_bias, state, d, 1, core_out));
  for (int i = 0; i < 2; ++i) {
    be->gated_delta_rule(conv_out, a, b, w.a_log, w.dt_bias, state_ref, d, 1, core_out);
    be->moe_route(logits, 1, 256, 8, ids, weights);
  }
  EXPECT_EQ(to_host(*be, state, state_count), to_host(*be, state_ref, state_count))
      << "the refused delta rule moved the state";

  // The fused mixer's output projection shifts the window: a conv right after it is refused,
  // and so is a second mixer (its delta step reads the window before the wait).
  const uint64_t fused_before = path_counts(*be).fused_conv_delta;
  be->gated_delta_net_mixer(w, d, 1e-6f, mixed, z, a, b, window, state, 1, conv_out, core_out,
                            normed, y);
  EXPECT_EQ(path_counts(*be).fused_conv_delta - fused_before, 1u) << "the fused mixer did not run";
  EXPECT_THROW(be->conv1d_silu(mixed, window, w.conv1d, d, 1, conv_out), std::logic_error);
  EXPECT_THROW(be->gated_delta_net_mixer(w, d, 1e-6f, mixed, z, a, b, window, state, 1, conv_out,
                                         core_out, normed, y),
               std::logic_error);
  // Another op between: accepted.
  be->moe_route(logits, 1, 256, 8, ids, weights);
  EXPECT_NO_THROW(be->gated_delta_net_mixer(w, d, 1e-6f, mixed, z, a, b, window, state, 1, conv_out,
                                            core_out, normed, y));
  be->synchronize();
}

}  // namespace
}  // namespace lily::testing

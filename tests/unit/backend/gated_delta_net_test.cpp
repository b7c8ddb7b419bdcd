// CPU backend vs the float64 reference: conv1d_silu (with its window) and the gated delta rule (with its state).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

// f32 vs f64. The delta rule carries its state across tokens, so f32 roundings accumulate
// over the sequence; with the L2-normalised keys (|k| = 1) and beta <= 1 the update is a
// contraction, so the error stays at the level of one step (observed ~1e-7) and the same
// 1e-5 bound as the other ops applies.
constexpr double kTol = 1e-5;

std::vector<double> widen(const std::vector<float>& v) { return ref::widen(v); }

// Key heads 2, value heads 4 (two value heads per key head), Dk != Dv so that a transposed
// state index cannot pass, kernel 4: C = 2*2*32 + 4*16 = 192 channels.
GatedDeltaNetDims dims() { return {2, 4, 32, 16, 4}; }

// Exact comparison of an f32 buffer with a reference that only copied f32 values.
void expect_exact(const std::vector<float>& got, const std::vector<double>& want,
                  const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(static_cast<double>(got[i]), want[i]) << label << " at " << i;
  }
}

class ConvRunner {
 public:
  ConvRunner(Rng& rng, const GatedDeltaNetDims& d, Backend& be)
      : d_(d), be_(be),
        weight_(DType::BF16, {static_cast<uint64_t>(d.channels()), static_cast<uint64_t>(d.conv_kernel), 1},
                rng.uniform_vector(static_cast<size_t>(d.channels() * d.conv_kernel), -0.6f, 0.6f),
                "conv1d"),
        window_(rng.uniform_vector(static_cast<size_t>((d.conv_kernel - 1) * d.channels()), -2.0f, 2.0f)),
        ref_window_(widen(window_)) {}

  std::vector<float> step(const std::vector<float>& mixed, int64_t n, const std::string& label) {
    std::vector<float> out(mixed.size(), 1e30f);
    be_.conv1d_silu(mixed.data(), window_.data(), weight_.view(), d_, n, out.data());
    const std::vector<double> want = ref::conv1d_silu(widen(mixed), ref_window_, weight_.view(), d_, n);
    const ErrorFigures f = report("conv1d_silu", label, out, want);
    EXPECT_LT(f.normalised, kTol) << label;
    expect_exact(window_, ref_window_, label + " window");
    return out;
  }
  const std::vector<float>& window() const { return window_; }

 private:
  GatedDeltaNetDims d_;
  Backend& be_;
  DenseTensor weight_;
  std::vector<float> window_;
  std::vector<double> ref_window_;
};

TEST(BackendConv1dSilu, WindowedDecodeAndChunksOfEverySize) {
  Rng rng(61);
  auto be = cpu(3);
  const GatedDeltaNetDims d = dims();
  const auto C = static_cast<size_t>(d.channels());
  // n = 1 with a non-zero window; n = 7 > K; n = 2 < K - 1; n = 3 = K - 1; n = 4 = K.
  for (int64_t n : {1, 7, 2, 3, 4}) {
    ConvRunner r(rng, d, *be);
    r.step(rng.uniform_vector(static_cast<size_t>(n) * C, -2.0f, 2.0f), n,
           "fresh random window n=" + std::to_string(n));
  }
  // A sequence of calls carries the window: 1, 2, 1, 6 tokens.
  ConvRunner r(rng, d, *be);
  for (int64_t n : {1, 2, 1, 6}) {
    r.step(rng.uniform_vector(static_cast<size_t>(n) * C, -2.0f, 2.0f), n,
           "carried window n=" + std::to_string(n));
  }
}

TEST(BackendConv1dSilu, SplitCallsEqualOneCall) {
  Rng rng(62);
  auto be = cpu();
  const GatedDeltaNetDims d = dims();
  const auto C = static_cast<size_t>(d.channels());
  const std::vector<float> mixed = rng.uniform_vector(9 * C, -2.0f, 2.0f);
  Rng twin_a(7);
  Rng twin_b(7);
  ConvRunner whole(twin_a, d, *be);
  ConvRunner split(twin_b, d, *be);  // same weights and window
  const std::vector<float> one = whole.step(mixed, 9, "one call n=9");
  std::vector<float> parts = split.step({mixed.begin(), mixed.begin() + 2 * static_cast<long>(C)}, 2, "split 2 of 9");
  const std::vector<float> rest = split.step({mixed.begin() + 2 * static_cast<long>(C), mixed.end()}, 7, "split 7 of 9");
  parts.insert(parts.end(), rest.begin(), rest.end());
  EXPECT_EQ(parts, one);
}

// Decode runs the conv one token at a time (its own loop: no history buffer, the window
// shifted in place): nine one-token calls give one nine-token call's bits, window included.
// The prefill takes the channels in blocks of 64 (gated_delta_net.cpp): 192 channels (three
// whole blocks), 152 (a 24-channel tail), and 66 with kernel 5 (a 2-channel tail, a longer
// history).
TEST(BackendConv1dSilu, OneTokenCallsEqualOneCall) {
  for (const GatedDeltaNetDims& d :
       {dims(), GatedDeltaNetDims{2, 4, 24, 14, 4}, GatedDeltaNetDims{1, 2, 20, 13, 5}}) {
    Rng rng(63);
    auto be = cpu(2);
    const auto C = static_cast<long>(d.channels());
    const std::string label = "C=" + std::to_string(C) + " K=" + std::to_string(d.conv_kernel);
    const std::vector<float> mixed = rng.uniform_vector(static_cast<size_t>(9 * C), -2.0f, 2.0f);
    Rng twin_a(8);
    Rng twin_b(8);
    ConvRunner whole(twin_a, d, *be);
    ConvRunner steps(twin_b, d, *be);  // same weights and window
    const std::vector<float> one = whole.step(mixed, 9, label + " one call n=9");
    std::vector<float> tokens;
    for (long t = 0; t < 9; ++t) {
      const std::vector<float> o = steps.step({mixed.begin() + t * C, mixed.begin() + (t + 1) * C},
                                              1, label + " token " + std::to_string(t));
      tokens.insert(tokens.end(), o.begin(), o.end());
    }
    EXPECT_EQ(tokens, one) << label;
    EXPECT_EQ(steps.window(), whole.window()) << label;
  }
}

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

class DeltaRunner {
 public:
  DeltaRunner(Rng& rng, const GatedDeltaNetDims& d, Backend& be, bool random_state,
              DType a_log_type = DType::F32, DType dt_bias_type = DType::BF16)
      : d_(d), be_(be),
        a_log_(a_log_type, {static_cast<uint64_t>(d.value_heads)},
               rng.uniform_vector(static_cast<size_t>(d.value_heads), 0.0f, 2.7f), "A_log"),
        dt_bias_(dt_bias_type, {static_cast<uint64_t>(d.value_heads)},
                 rng.uniform_vector(static_cast<size_t>(d.value_heads), -1.0f, 1.0f), "dt_bias"),
        state_(static_cast<size_t>(d.value_heads * d.key_dim * d.value_dim), 0.0f) {
    if (random_state) state_ = rng.uniform_vector(state_.size(), -0.5f, 0.5f);
    ref_state_ = widen(state_);
  }

  std::vector<float> step(const DeltaInputs& in, int64_t n, const std::string& label) {
    std::vector<float> out(static_cast<size_t>(n * d_.value_heads * d_.value_dim), 1e30f);
    be_.gated_delta_rule(in.conv.data(), in.a.data(), in.b.data(), a_log_.view(), dt_bias_.view(),
                         state_.data(), d_, n, out.data());
    const std::vector<double> want = ref::gated_delta_rule(widen(in.conv), widen(in.a), widen(in.b),
                                                           a_log_.view(), dt_bias_.view(), ref_state_, d_, n);
    const ErrorFigures fo = report("gated_delta_rule", label + " out", out, want);
    const ErrorFigures fs = report("gated_delta_rule", label + " state", state_, ref_state_);
    EXPECT_LT(fo.normalised, kTol) << label;
    EXPECT_LT(fs.normalised, kTol) << label;
    return out;
  }

  const std::vector<float>& state() const { return state_; }

 private:
  GatedDeltaNetDims d_;
  Backend& be_;
  DenseTensor a_log_, dt_bias_;
  std::vector<float> state_;
  std::vector<double> ref_state_;
};

TEST(BackendGatedDeltaRule, SingleTokenAndSequences) {
  Rng rng(71);
  auto be = cpu(3);
  const GatedDeltaNetDims d = dims();
  {
    DeltaRunner r(rng, d, *be, false);
    r.step(random_inputs(rng, d, 1), 1, "n=1 zero state");
  }
  {
    DeltaRunner r(rng, d, *be, true, DType::BF16, DType::F32);
    r.step(random_inputs(rng, d, 1), 1, "n=1 random state, bf16 A_log f32 dt_bias");
  }
  {
    DeltaRunner r(rng, d, *be, false);
    r.step(random_inputs(rng, d, 12), 12, "n=12 zero state");
    r.step(random_inputs(rng, d, 1), 1, "n=1 after 12");
    r.step(random_inputs(rng, d, 5), 5, "n=5 after 13");
  }
  {
    // One value head per key head, model-size heads (Dk = Dv = 128), a longer sequence.
    const GatedDeltaNetDims square{2, 2, 128, 128, 4};
    DeltaRunner r(rng, square, *be, false);
    r.step(random_inputs(rng, square, 24), 24, "Hk=Hv=2 Dk=Dv=128 n=24");
  }
}

TEST(BackendGatedDeltaRule, CarriedStateEqualsOneCallOverTheConcatenation) {
  Rng rng(72);
  auto be = cpu();
  const GatedDeltaNetDims d = dims();
  const DeltaInputs all = random_inputs(rng, d, 10);
  Rng twin_a(9);
  Rng twin_b(9);
  DeltaRunner whole(twin_a, d, *be, true);
  DeltaRunner split(twin_b, d, *be, true);  // same A_log, dt_bias and initial state
  const std::vector<float> one = whole.step(all, 10, "one call n=10");
  const auto C = static_cast<long>(d.channels());
  const auto Hv = static_cast<long>(d.value_heads);
  std::vector<float> joined;
  for (auto [begin, count] : {std::pair<long, long>{0, 3}, {3, 1}, {4, 6}}) {
    const DeltaInputs part{{all.conv.begin() + begin * C, all.conv.begin() + (begin + count) * C},
                           {all.a.begin() + begin * Hv, all.a.begin() + (begin + count) * Hv},
                           {all.b.begin() + begin * Hv, all.b.begin() + (begin + count) * Hv}};
    const std::vector<float> out = split.step(part, count, "split at " + std::to_string(begin) + " n=" + std::to_string(count));
    joined.insert(joined.end(), out.begin(), out.end());
  }
  // The recurrence is sequential per head either way: the results are identical.
  EXPECT_EQ(joined, one);
  EXPECT_EQ(split.state(), whole.state());
}

TEST(BackendGatedDeltaRule, ExtremeDecayAndBeta) {
  Rng rng(73);
  auto be = cpu();
  const GatedDeltaNetDims d = dims();
  auto with = [&](float a, float b) {
    DeltaInputs in = random_inputs(rng, d, 3);
    for (float& x : in.a) x = a;
    for (float& x : in.b) x = b;
    return in;
  };
  {
    // a = +1e4: softplus = 1e4, g = -exp(A_log) 1e4, alpha = exp(g) = 0: the old state is wiped.
    DeltaRunner r(rng, d, *be, true);
    r.step(with(1e4f, 0.5f), 3, "a=+1e4 (alpha=0, state wiped)");
  }
  {
    // a = -1e4: softplus ~ 0, alpha = 1: no decay at all.
    DeltaRunner r(rng, d, *be, true);
    r.step(with(-1e4f, 0.5f), 3, "a=-1e4 (alpha=1, no decay)");
  }
  {
    // b = +1e4: beta = 1 (full overwrite along k); b = -1e4: beta = 0 (no write, only decay).
    DeltaRunner r(rng, d, *be, true);
    r.step(with(0.3f, 1e4f), 3, "b=+1e4 (beta=1)");
    r.step(with(0.3f, -1e4f), 3, "b=-1e4 (beta=0)");
    r.step(with(30.0f, -30.0f), 3, "a=30 b=-30 (softplus linear branch)");
  }
  {
    // Zero q and k vectors: the L2 norm's 1e-6 keeps them zero instead of NaN.
    DeltaRunner r(rng, d, *be, true);
    DeltaInputs in = random_inputs(rng, d, 2);
    const auto key_width = static_cast<size_t>(2 * d.key_heads * d.key_dim);
    for (size_t i = 0; i < key_width; ++i) in.conv[i] = 0.0f;  // token 0: q and k all zero
    r.step(in, 2, "zero q and k at token 0");
  }
}

}  // namespace
}  // namespace lily::testing

// The CUDA decode plan's Gated DeltaNet mixer (one persistent kernel per layer) against the op
// path it replaces (bit for bit) and the CPU backend: eager, many steps in a row (the window and
// the state carried), replayed from a graph, with the input norm owed or already applied.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "cuda_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

// Against the CPU backend's ops: the chain of two GEMVs, the delta rule and two norms differs
// from the CPU by FMA contraction and summation order only (observed ~1e-7 per op); one step
// stays far below this bound, and a wrong lane order or a stale read is far above it.
constexpr double kTol = 1e-5;
constexpr float kEps = 1e-6f;

struct Dims {
  int64_t H;
  GatedDeltaNetDims d;
  std::string label;
  int64_t value_width() const { return d.value_heads * d.value_dim; }
};

// One Gated DeltaNet layer's weights in memory, as the checkpoint would give them (Q4
// projections, BF16 conv taps, norms and dt_bias, F32 A_log).
struct DeltaNetLayer {
  DeltaNetLayer(Rng& rng, const Dims& s)
      : in_qkv(rng, 4, 1, static_cast<uint64_t>(s.d.channels()), static_cast<uint64_t>(s.H), 0, "in_proj_qkv"),
        in_z(rng, 4, 1, static_cast<uint64_t>(s.value_width()), static_cast<uint64_t>(s.H), 0, "in_proj_z"),
        in_a(rng, 4, 1, static_cast<uint64_t>(s.d.value_heads), static_cast<uint64_t>(s.H), 0, "in_proj_a"),
        in_b(rng, 4, 1, static_cast<uint64_t>(s.d.value_heads), static_cast<uint64_t>(s.H), 0, "in_proj_b"),
        out_proj(rng, 4, 1, static_cast<uint64_t>(s.H), static_cast<uint64_t>(s.value_width()), 0, "out_proj"),
        conv1d(DType::BF16, {static_cast<uint64_t>(s.d.channels()), static_cast<uint64_t>(s.d.conv_kernel), 1},
               rng.uniform_vector(static_cast<size_t>(s.d.channels() * s.d.conv_kernel), -0.6f, 0.6f), "conv1d"),
        a_log(DType::F32, {static_cast<uint64_t>(s.d.value_heads)},
              log_of(rng.uniform_vector(static_cast<size_t>(s.d.value_heads), 1.0f, 16.0f)), "A_log"),
        dt_bias(DType::BF16, {static_cast<uint64_t>(s.d.value_heads)},
                rng.uniform_vector(static_cast<size_t>(s.d.value_heads), -1.0f, 1.0f), "dt_bias"),
        gated_norm(DType::BF16, {static_cast<uint64_t>(s.d.value_dim)},
                   rng.uniform_vector(static_cast<size_t>(s.d.value_dim), 0.5f, 1.5f), "norm"),
        input_norm(DType::BF16, {static_cast<uint64_t>(s.H)},
                   rng.uniform_vector(static_cast<size_t>(s.H), 0.5f, 1.5f), "input_layernorm") {}
  QuantWeight in_qkv, in_z, in_a, in_b, out_proj;
  DenseTensor conv1d, a_log, dt_bias, gated_norm, input_norm;

  static std::vector<float> log_of(std::vector<float> v) {
    for (float& x : v) x = std::log(x);
    return v;
  }
  LayerWeights weights() const {
    LayerWeights l;
    l.kind = LayerKind::linear_attention;
    l.input_norm = input_norm.view();
    l.gdn = GatedDeltaNetWeights{in_qkv.view(), in_z.view(), in_a.view(), in_b.view(), conv1d.view(),
                                 a_log.view(), dt_bias.view(), gated_norm.view(), out_proj.view()};
    return l;
  }
};

// The mixer's buffers in one backend's memory; the state and window start from random values
// (a layer some tokens into a sequence).
struct Buffers {
  Buffers(Backend& be, const Dims& s, Rng& rng) {
    const auto n = [](int64_t v) { return static_cast<size_t>(v); };
    b.residual = be.alloc(n(s.H));
    b.delta = be.alloc(n(s.H));
    b.normed = be.alloc(n(s.H));
    b.mixed = be.alloc(n(s.d.channels()));
    b.z = be.alloc(n(s.value_width()));
    b.a = be.alloc(n(s.d.value_heads));
    b.b = be.alloc(n(s.d.value_heads));
    b.conv_window = to_device(be, rng.uniform_vector(n((s.d.conv_kernel - 1) * s.d.channels()), -1.0f, 1.0f));
    b.state = to_device(be, rng.uniform_vector(n(s.d.value_heads * s.d.key_dim * s.d.value_dim), -0.2f, 0.2f));
    b.core_out = be.alloc(n(s.value_width()));
    b.gated = be.alloc(n(s.value_width()));
    conv_out = be.alloc(n(s.d.channels()));
  }
  DeltaNetBlockBuffers b;
  float* conv_out = nullptr;  // the op path's scratch
};

// Copies every buffer of `from` (one backend) into `to`, so two paths start alike.
void copy_buffers(Backend& be, const Dims& s, const DeltaNetBlockBuffers& from,
                  const DeltaNetBlockBuffers& to) {
  const auto copy = [&](const float* src, float* dst, int64_t count) {
    const std::vector<float> v = to_host(be, src, static_cast<size_t>(count));
    be.copy_from_host(v.data(), v.size(), dst);
  };
  copy(from.residual, to.residual, s.H);
  copy(from.delta, to.delta, s.H);
  copy(from.normed, to.normed, s.H);
  copy(from.conv_window, to.conv_window, (s.d.conv_kernel - 1) * s.d.channels());
  copy(from.state, to.state, s.d.value_heads * s.d.key_dim * s.d.value_dim);
}

// New residual and delta for the next token (and, without the owed norm, a new normed input).
void next_inputs(Backend& be, const Dims& s, Rng& rng, const DeltaNetBlockBuffers& a,
                 const DeltaNetBlockBuffers& b) {
  const auto residual = rng.uniform_vector(static_cast<size_t>(s.H), -2.0f, 2.0f);
  const auto delta = rng.uniform_vector(static_cast<size_t>(s.H), -1.0f, 1.0f);
  const auto normed = rng.uniform_vector(static_cast<size_t>(s.H), -1.5f, 1.5f);
  for (const DeltaNetBlockBuffers* x : {&a, &b}) {
    be.copy_from_host(residual.data(), residual.size(), x->residual);
    be.copy_from_host(delta.data(), delta.size(), x->delta);
    be.copy_from_host(normed.data(), normed.size(), x->normed);
  }
}

// The op path of the model's mixer for one token (Qwen36Model::delta_net_mixer without a plan).
void run_ops(Backend& be, const Dims& s, const LayerWeights& l, bool add_norm, const Buffers& x) {
  const DeltaNetBlockBuffers& b = x.b;
  if (add_norm) be.add_rms_norm(b.residual, b.delta, l.input_norm, 1, s.H, kEps, b.normed);
  const GatedDeltaNetWeights& w = l.gdn;
  const MatmulTarget projections[] = {{&w.in_proj_qkv, 0, s.d.channels(), b.mixed},
                                      {&w.in_proj_z, 0, s.value_width(), b.z},
                                      {&w.in_proj_a, 0, s.d.value_heads, b.a},
                                      {&w.in_proj_b, 0, s.d.value_heads, b.b}};
  be.matmul_group(projections, b.normed, 1);
  be.gated_delta_net_mixer(w, s.d, kEps, b.mixed, b.z, b.a, b.b, b.conv_window, b.state, 1,
                           x.conv_out, b.core_out, b.gated, b.delta);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every output of the fused mixer equals the op path's bit for bit.
void expect_same(Backend& be, const Dims& s, const DeltaNetBlockBuffers& got,
                 const DeltaNetBlockBuffers& want, const std::string& label) {
  const auto f = [&](const float* p, int64_t n) { return to_host(be, p, static_cast<size_t>(n)); };
  EXPECT_TRUE(bit_equal(f(got.residual, s.H), f(want.residual, s.H))) << label << ": residual";
  EXPECT_TRUE(bit_equal(f(got.normed, s.H), f(want.normed, s.H))) << label << ": normed";
  EXPECT_TRUE(bit_equal(f(got.mixed, s.d.channels()), f(want.mixed, s.d.channels()))) << label << ": mixed";
  EXPECT_TRUE(bit_equal(f(got.z, s.value_width()), f(want.z, s.value_width()))) << label << ": z";
  EXPECT_TRUE(bit_equal(f(got.a, s.d.value_heads), f(want.a, s.d.value_heads))) << label << ": a";
  EXPECT_TRUE(bit_equal(f(got.b, s.d.value_heads), f(want.b, s.d.value_heads))) << label << ": b";
  const int64_t window = (s.d.conv_kernel - 1) * s.d.channels();
  EXPECT_TRUE(bit_equal(f(got.conv_window, window), f(want.conv_window, window))) << label << ": window";
  const int64_t state = s.d.value_heads * s.d.key_dim * s.d.value_dim;
  EXPECT_TRUE(bit_equal(f(got.state, state), f(want.state, state))) << label << ": state";
  EXPECT_TRUE(bit_equal(f(got.core_out, s.value_width()), f(want.core_out, s.value_width()))) << label << ": core out";
  EXPECT_TRUE(bit_equal(f(got.gated, s.value_width()), f(want.gated, s.value_width()))) << label << ": gated norm";
  EXPECT_TRUE(bit_equal(f(got.delta, s.H), f(want.delta, s.H))) << label << ": output";
}

ModelWeights two_layers(const DeltaNetLayer& first, const DeltaNetLayer& second) {
  ModelWeights model;
  model.layers.push_back(first.weights());
  model.layers.push_back(second.weights());
  return model;
}

DecodePlanShape plan_shape(const Dims& s) {
  // The MoE part of the plan is not used here (no MoE weights: it stays on the op path).
  return DecodePlanShape{s.H, 0, 0, kEps, s.d};
}

void check_mixer(const Dims& s, uint64_t seed) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(seed);
  const DeltaNetLayer layer0(rng, s);
  const DeltaNetLayer layer1(rng, s);
  const ModelWeights model = two_layers(layer0, layer1);
  const std::unique_ptr<DecodePlan> plan = be->make_decode_plan(model, plan_shape(s));
  ASSERT_NE(plan, nullptr);
  ASSERT_TRUE(plan->has_delta_net_block()) << s.label << ": " << plan->describe();
  std::printf("[plan] %s: %s\n", s.label.c_str(), plan->describe().c_str());
  const LayerWeights l[2] = {model.layers[0], model.layers[1]};

  for (bool add_norm : {true, false}) {
    const std::string mode = add_norm ? " norm owed" : " norm applied";
    Buffers ops(*be, s, rng);
    Buffers fused(*be, s, rng);
    copy_buffers(*be, s, ops.b, fused.b);
    next_inputs(*be, s, rng, ops.b, fused.b);
    run_ops(*be, s, l[1], add_norm, ops);
    const uint64_t before = plan->delta_net_blocks_run();
    plan->delta_net_block(1, add_norm, fused.b);
    EXPECT_EQ(plan->delta_net_blocks_run(), before + 1) << "the fused mixer ran";
    expect_same(*be, s, fused.b, ops.b, s.label + mode + " eager");

    // Twenty tokens in a row over both layers' weights: the window and the state carry from
    // step to step, the barrier counter keeps growing, and every result stays the op path's.
    for (int i = 0; i < 20; ++i) {
      next_inputs(*be, s, rng, ops.b, fused.b);
      run_ops(*be, s, l[i % 2], add_norm, ops);
      plan->delta_net_block(static_cast<size_t>(i % 2), add_norm, fused.b);
    }
    expect_same(*be, s, fused.b, ops.b, s.label + mode + " after 20 tokens");
  }

  // Against the CPU backend's ops (an independent f32 implementation), one token.
  {
    auto host = cpu();
    Buffers gpu(*be, s, rng);
    Buffers cpu_buffers(*host, s, rng);
    const auto copy_to_cpu = [&](const float* src, float* dst, int64_t count) {
      const std::vector<float> v = to_host(*be, src, static_cast<size_t>(count));
      std::memcpy(dst, v.data(), v.size() * sizeof(float));
    };
    next_inputs(*be, s, rng, gpu.b, gpu.b);
    copy_to_cpu(gpu.b.residual, cpu_buffers.b.residual, s.H);
    copy_to_cpu(gpu.b.delta, cpu_buffers.b.delta, s.H);
    copy_to_cpu(gpu.b.conv_window, cpu_buffers.b.conv_window, (s.d.conv_kernel - 1) * s.d.channels());
    copy_to_cpu(gpu.b.state, cpu_buffers.b.state, s.d.value_heads * s.d.key_dim * s.d.value_dim);
    plan->delta_net_block(0, true, gpu.b);
    run_ops(*host, s, l[0], true, cpu_buffers);
    const auto cpu_out = std::vector<float>(cpu_buffers.b.delta, cpu_buffers.b.delta + s.H);
    EXPECT_LT(report("delta_net_block", s.label + " output vs cpu",
                     to_host(*be, gpu.b.delta, static_cast<size_t>(s.H)), ref::widen(cpu_out)).normalised,
              kTol);
  }

  if (be->can_capture()) {
    Buffers ops(*be, s, rng);
    Buffers fused(*be, s, rng);
    copy_buffers(*be, s, ops.b, fused.b);
    next_inputs(*be, s, rng, ops.b, fused.b);
    // The graph runs both layers on one set of buffers; replayed ten times, the state and the
    // window advance ten tokens on each.
    be->begin_capture();
    plan->delta_net_block(0, true, fused.b);
    plan->delta_net_block(1, true, fused.b);
    const int g = be->end_capture();
    for (int i = 0; i < 10; ++i) {
      run_ops(*be, s, l[0], true, ops);
      run_ops(*be, s, l[1], true, ops);
      be->replay(g);
    }
    expect_same(*be, s, fused.b, ops.b, s.label + " graph replays");
  }
}

TEST(CudaDecodePlan, DeltaNetBlockTinyShapeEqualsTheOps) {
  check_mixer(Dims{256, {2, 4, 128, 128, 4}, "tiny H=256 Hk=2 Hv=4 Dk=Dv=128"}, 911);
}

TEST(CudaDecodePlan, DeltaNetBlockModelShapeEqualsTheOps) {
  check_mixer(Dims{2048, {16, 32, 128, 128, 4}, "H=2048 Hk=16 Hv=32 Dk=Dv=128"}, 912);
}

TEST(CudaDecodePlan, DeltaNetBlockNarrowHeadsEqualTheOps) {
  // Key and value dim 64 (two tiles of 32 columns per head), a wider hidden.
  check_mixer(Dims{1024, {4, 8, 64, 64, 4}, "H=1024 Hk=4 Hv=8 Dk=Dv=64"}, 913);
}

TEST(CudaDecodePlan, TurnedOffTheDeltaNetBlockRunsTheOps) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  std::string why;
  const std::unique_ptr<Backend> off = cuda_backend_or_null(CudaOptions::disabling("delta-net-layer"), &why);
  ASSERT_TRUE(off) << why;
  Rng rng(914);
  const Dims s{256, {2, 4, 128, 128, 4}, "tiny"};
  const DeltaNetLayer layer(rng, s);
  const ModelWeights model = two_layers(layer, layer);
  const std::unique_ptr<DecodePlan> on = be->make_decode_plan(model, plan_shape(s));
  ASSERT_NE(on, nullptr);
  EXPECT_TRUE(on->has_delta_net_block()) << "on by default: " << on->describe();
  const std::unique_ptr<DecodePlan> plan = off->make_decode_plan(model, plan_shape(s));
  ASSERT_NE(plan, nullptr);
  EXPECT_FALSE(plan->has_delta_net_block());
  EXPECT_NE(plan->describe().find("--cuda-disable delta-net-layer"), std::string::npos) << plan->describe();
  Buffers b(*off, s, rng);
  EXPECT_THROW(plan->delta_net_block(0, true, b.b), std::logic_error);
}

TEST(CudaDecodePlan, UnsupportedDeltaNetShapesSayWhyAndRefuseTheBlock) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(915);
  // Conv kernel 3: the kernel is built for the model's 4.
  const Dims s{256, {2, 4, 128, 128, 3}, "conv kernel 3"};
  const DeltaNetLayer layer(rng, s);
  const ModelWeights model = two_layers(layer, layer);
  const std::unique_ptr<DecodePlan> plan = be->make_decode_plan(model, plan_shape(s));
  ASSERT_NE(plan, nullptr);
  EXPECT_FALSE(plan->has_delta_net_block());
  EXPECT_NE(plan->describe().find("Gated DeltaNet mixer on the op path: conv kernel 3"), std::string::npos)
      << plan->describe();
  Buffers b(*be, s, rng);
  EXPECT_THROW(plan->delta_net_block(0, true, b.b), std::logic_error);

  // A layer index that is not a Gated DeltaNet layer, and a null buffer, are refused.
  const Dims ok{256, {2, 4, 128, 128, 4}, "tiny"};
  const DeltaNetLayer good(rng, ok);
  ModelWeights mixed_model = two_layers(good, good);
  mixed_model.layers[1].kind = LayerKind::full_attention;
  const std::unique_ptr<DecodePlan> plan2 = be->make_decode_plan(mixed_model, plan_shape(ok));
  ASSERT_TRUE(plan2->has_delta_net_block()) << plan2->describe();
  Buffers b2(*be, ok, rng);
  EXPECT_THROW(plan2->delta_net_block(1, true, b2.b), std::invalid_argument);
  EXPECT_THROW(plan2->delta_net_block(2, true, b2.b), std::invalid_argument);
  DeltaNetBlockBuffers missing = b2.b;
  missing.state = nullptr;
  EXPECT_THROW(plan2->delta_net_block(0, true, missing), std::invalid_argument);
}

}  // namespace
}  // namespace lily::testing

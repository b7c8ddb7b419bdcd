// The CUDA decode plan's MoE block (one persistent kernel per layer) against the op path it
// replaces (bit for bit) and the CPU backend, eager, repeated and replayed from a graph.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "cuda_test_support.h"
#include "ref/reference_ops.h"

namespace lily::testing {
namespace {

constexpr double kTol = 1e-5;  // against the CPU backend, as gemv_test.cpp
constexpr float kEps = 1e-6f;

// One MoE layer's weights in memory, as the checkpoint would give them (router and shared
// gate Q8, experts Q4).
struct MoeLayer {
  MoeLayer(Rng& rng, int64_t H, int64_t E, int64_t I, int64_t S, int router_bits)
      : router(rng, router_bits, 1, static_cast<uint64_t>(E), static_cast<uint64_t>(H), 0, "router"),
        shared_expert_gate(rng, router_bits, 1, 1, static_cast<uint64_t>(H), 0, "shared_expert_gate"),
        gate(rng, 4, static_cast<uint64_t>(E), static_cast<uint64_t>(I), static_cast<uint64_t>(H), 0, "experts_gate"),
        up(rng, 4, static_cast<uint64_t>(E), static_cast<uint64_t>(I), static_cast<uint64_t>(H), 0, "experts_up"),
        down(rng, 4, static_cast<uint64_t>(E), static_cast<uint64_t>(H), static_cast<uint64_t>(I), 0, "experts_down"),
        shared_gate(rng, 4, 1, static_cast<uint64_t>(S), static_cast<uint64_t>(H), 0, "shared_gate"),
        shared_up(rng, 4, 1, static_cast<uint64_t>(S), static_cast<uint64_t>(H), 0, "shared_up"),
        shared_down(rng, 4, 1, static_cast<uint64_t>(H), static_cast<uint64_t>(S), 0, "shared_down"),
        norm(DType::BF16, {static_cast<uint64_t>(H)},
             rng.uniform_vector(static_cast<size_t>(H), 0.5f, 1.5f), "post_attention_norm") {}
  QuantWeight router, shared_expert_gate, gate, up, down, shared_gate, shared_up, shared_down;
  DenseTensor norm;

  LayerWeights weights() const {
    LayerWeights l;
    l.post_attention_norm = norm.view();
    l.moe = MoeWeights{router.view(), gate.view(), up.view(), down.view(), shared_gate.view(),
                       shared_up.view(), shared_down.view(), shared_expert_gate.view()};
    return l;
  }
};

struct Shape {
  int64_t H, E, I, S, k;
  int router_bits;
  std::string label;
};

// The block's buffers in one backend's memory.
struct Buffers {
  Buffers(Backend& be, const Shape& s, const std::vector<float>& residual,
          const std::vector<float>& delta) {
    b.residual = to_device(be, residual);
    b.delta = to_device(be, delta);
    b.normed = be.alloc(static_cast<size_t>(s.H));
    b.router_logits = be.alloc(static_cast<size_t>(s.E));
    b.shared_logit = be.alloc(1);
    b.expert_ids = be.alloc_i32(static_cast<size_t>(s.k));
    b.expert_weights = be.alloc(static_cast<size_t>(s.k));
    b.expert_h = be.alloc(static_cast<size_t>(s.k * s.I));
    b.shared_h = be.alloc(static_cast<size_t>(s.S));
  }
  MoeBlockBuffers b;
};

// The op path of the model's MoE block for one token (Qwen36Model::moe without a plan).
void run_ops(Backend& be, const Shape& s, const LayerWeights& l, const MoeBlockBuffers& b) {
  be.add_rms_norm(b.residual, b.delta, l.post_attention_norm, 1, s.H, kEps, b.normed);
  const MatmulTarget gates[] = {{&l.moe.router, 0, s.E, b.router_logits},
                                {&l.moe.shared_expert_gate, 0, 1, b.shared_logit}};
  be.matmul_group(gates, b.normed, 1);
  be.route_expert_swiglu(b.router_logits, s.E, s.k, b.expert_ids, b.expert_weights,
                         l.moe.experts_gate, l.moe.experts_up, b.expert_h, l.moe.shared_gate,
                         l.moe.shared_up, b.shared_h, b.normed, 1, &l.moe.experts_down);
  be.expert_down_combine(l.moe.experts_down, b.expert_h, b.expert_ids, b.expert_weights, 1, s.k,
                         l.moe.shared_down, b.shared_h, b.shared_logit, b.delta);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every output of the fused block equals the op path's bit for bit.
void expect_same(Backend& be, const Shape& s, const MoeBlockBuffers& got, const MoeBlockBuffers& want,
                 const std::string& label) {
  const auto f = [&](const float* p, int64_t n) { return to_host(be, p, static_cast<size_t>(n)); };
  EXPECT_TRUE(bit_equal(f(got.residual, s.H), f(want.residual, s.H))) << label << ": residual";
  EXPECT_TRUE(bit_equal(f(got.normed, s.H), f(want.normed, s.H))) << label << ": normed";
  EXPECT_TRUE(bit_equal(f(got.router_logits, s.E), f(want.router_logits, s.E))) << label << ": router logits";
  EXPECT_TRUE(bit_equal(f(got.shared_logit, 1), f(want.shared_logit, 1))) << label << ": shared logit";
  EXPECT_EQ(to_host(be, got.expert_ids, static_cast<size_t>(s.k)),
            to_host(be, want.expert_ids, static_cast<size_t>(s.k))) << label << ": expert ids";
  EXPECT_TRUE(bit_equal(f(got.expert_weights, s.k), f(want.expert_weights, s.k))) << label << ": weights";
  EXPECT_TRUE(bit_equal(f(got.expert_h, s.k * s.I), f(want.expert_h, s.k * s.I))) << label << ": h";
  EXPECT_TRUE(bit_equal(f(got.shared_h, s.S), f(want.shared_h, s.S))) << label << ": shared h";
  EXPECT_TRUE(bit_equal(f(got.delta, s.H), f(want.delta, s.H))) << label << ": output";
}

void check_block(const Shape& s, uint64_t seed) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(seed);
  const MoeLayer layer(rng, s.H, s.E, s.I, s.S, s.router_bits);
  ModelWeights model;
  model.layers.push_back(layer.weights());
  model.layers.push_back(layer.weights());  // a second layer: the plan indexes layers
  const std::unique_ptr<DecodePlan> plan =
      be->make_decode_plan(model, DecodePlanShape{s.H, s.E, s.k, kEps});
  ASSERT_NE(plan, nullptr);
  ASSERT_TRUE(plan->has_moe_block()) << s.label << ": " << plan->describe();
  std::printf("[plan] %s: %s\n", s.label.c_str(), plan->describe().c_str());

  const auto residual = rng.uniform_vector(static_cast<size_t>(s.H), -2.0f, 2.0f);
  const auto delta = rng.uniform_vector(static_cast<size_t>(s.H), -1.0f, 1.0f);
  const LayerWeights l = layer.weights();
  Buffers ops(*be, s, residual, delta);
  Buffers fused(*be, s, residual, delta);
  run_ops(*be, s, l, ops.b);
  const uint64_t before = plan->moe_blocks_run();
  plan->moe_block(1, fused.b);
  EXPECT_EQ(plan->moe_blocks_run(), before + 1) << "the fused block ran";
  expect_same(*be, s, fused.b, ops.b, s.label + " eager");

  // Against the CPU backend's ops (an independent f32 implementation).
  auto host = cpu();
  std::vector<float> r = residual;
  std::vector<float> d = delta;
  std::vector<float> normed(static_cast<size_t>(s.H)), logits(static_cast<size_t>(s.E)), shared_logit(1);
  std::vector<int32_t> ids(static_cast<size_t>(s.k));
  std::vector<float> w(static_cast<size_t>(s.k)), h(static_cast<size_t>(s.k * s.I)), sh(static_cast<size_t>(s.S));
  run_ops(*host, s, l, MoeBlockBuffers{r.data(), d.data(), normed.data(), logits.data(),
                                       shared_logit.data(), ids.data(), w.data(), h.data(), sh.data()});
  EXPECT_EQ(to_host(*be, fused.b.expert_ids, ids.size()), ids) << s.label << ": ids vs cpu";
  EXPECT_LT(report("moe_block", s.label + " output vs cpu",
                   to_host(*be, fused.b.delta, static_cast<size_t>(s.H)), ref::widen(d)).normalised, kTol);

  // Many launches in a row, then a captured graph replayed: the barrier counter keeps growing
  // across launches and replays, and every result stays the op path's.
  for (int round = 0; round < 3; ++round) {
    const auto r2 = rng.uniform_vector(static_cast<size_t>(s.H), -2.0f, 2.0f);
    const auto d2 = rng.uniform_vector(static_cast<size_t>(s.H), -1.0f, 1.0f);
    Buffers o2(*be, s, r2, d2);
    Buffers f2(*be, s, r2, d2);
    run_ops(*be, s, l, o2.b);
    for (int i = 0; i < 20; ++i) {  // the same inputs each time: residual is restored below
      be->copy_from_host(r2.data(), r2.size(), f2.b.residual);
      be->copy_from_host(d2.data(), d2.size(), f2.b.delta);
      plan->moe_block(static_cast<size_t>(i % 2), f2.b);
    }
    expect_same(*be, s, f2.b, o2.b, s.label + " after 20 launches, round " + std::to_string(round));
  }
  if (be->can_capture()) {
    const auto r3 = rng.uniform_vector(static_cast<size_t>(s.H), -2.0f, 2.0f);
    const auto d3 = rng.uniform_vector(static_cast<size_t>(s.H), -1.0f, 1.0f);
    Buffers o3(*be, s, r3, d3);
    Buffers f3(*be, s, r3, d3);
    // The op path applied twice (the graph below runs the block twice on its own output).
    run_ops(*be, s, l, o3.b);
    run_ops(*be, s, l, o3.b);
    be->begin_capture();
    plan->moe_block(0, f3.b);
    plan->moe_block(1, f3.b);
    const int g = be->end_capture();
    for (int i = 0; i < 10; ++i) {
      be->copy_from_host(r3.data(), r3.size(), f3.b.residual);
      be->copy_from_host(d3.data(), d3.size(), f3.b.delta);
      be->replay(g);
    }
    expect_same(*be, s, f3.b, o3.b, s.label + " graph replays");
  }
}

TEST(CudaDecodePlan, MoeBlockTinyShapeEqualsTheOps) {
  check_block(Shape{256, 32, 128, 128, 8, 8, "tiny H=256 E=32 I=S=128 k=8"}, 901);
}

TEST(CudaDecodePlan, MoeBlockModelShapeEqualsTheOps) {
  // The model's widths (H = 2048, I = S = 512, k = 8) with 32 experts instead of 256.
  check_block(Shape{2048, 32, 512, 512, 8, 8, "H=2048 E=32 I=S=512 k=8"}, 902);
}

TEST(CudaDecodePlan, MoeBlockModelRoutingWidthEqualsTheOps) {
  // The model's routing width (256 experts) with narrow experts; a Q4 router.
  check_block(Shape{2048, 256, 64, 512, 8, 8, "H=2048 E=256 I=64 S=512 k=8"}, 903);
  check_block(Shape{512, 64, 128, 64, 4, 4, "H=512 E=64 I=128 S=64 k=4 q4 router"}, 904);
}

TEST(CudaDecodePlan, TurnedOffTheBlockRunsTheOps) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  std::string why;
  const std::unique_ptr<Backend> off = cuda_backend_or_null(CudaOptions::disabling("moe-layer"), &why);
  ASSERT_TRUE(off) << why;
  Rng rng(906);
  const MoeLayer layer(rng, 256, 32, 128, 128, 8);
  ModelWeights model;
  model.layers.push_back(layer.weights());
  const std::unique_ptr<DecodePlan> on = be->make_decode_plan(model, DecodePlanShape{256, 32, 8, kEps});
  ASSERT_NE(on, nullptr);
  EXPECT_TRUE(on->has_moe_block()) << "on by default: " << on->describe();
  const std::unique_ptr<DecodePlan> plan =
      off->make_decode_plan(model, DecodePlanShape{256, 32, 8, kEps});
  ASSERT_NE(plan, nullptr);
  EXPECT_FALSE(plan->has_moe_block());
  EXPECT_NE(plan->describe().find("--cuda-disable moe-layer"), std::string::npos) << plan->describe();
}

TEST(CudaDecodePlan, UnsupportedShapesSayWhyAndRefuseTheBlock) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  Rng rng(905);
  const MoeLayer layer(rng, 256, 32, 128, 128, 8);
  ModelWeights model;
  model.layers.push_back(layer.weights());
  // k = 17: above the fused routing's 16.
  const std::unique_ptr<DecodePlan> plan =
      be->make_decode_plan(model, DecodePlanShape{256, 32, 17, kEps});
  ASSERT_NE(plan, nullptr);
  EXPECT_FALSE(plan->has_moe_block());
  EXPECT_NE(plan->describe().find("op path"), std::string::npos) << plan->describe();
  Buffers b(*be, Shape{256, 32, 128, 128, 17, 8, ""}, std::vector<float>(256, 1.0f),
            std::vector<float>(256, 1.0f));
  EXPECT_THROW(plan->moe_block(0, b.b), std::logic_error);
}

}  // namespace
}  // namespace lily::testing

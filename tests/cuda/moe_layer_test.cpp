// The CUDA decode plan's MoE block (one persistent kernel per layer), alone and with the next
// layer's norm and input projection, against the op path it replaces (bit for bit) and the CPU
// backend, eager, repeated and replayed from a graph.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
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

// The block's buffers in host memory, for the CPU backend, from the same inputs.
struct HostBuffers {
  HostBuffers(const Shape& s, const std::vector<float>& residual_in, const std::vector<float>& delta_in)
      : residual(residual_in), delta(delta_in), normed(static_cast<size_t>(s.H)),
        logits(static_cast<size_t>(s.E)), shared_logit(1), ids(static_cast<size_t>(s.k)),
        weights(static_cast<size_t>(s.k)), h(static_cast<size_t>(s.k * s.I)),
        shared_h(static_cast<size_t>(s.S)) {}
  MoeBlockBuffers buffers() {
    return {residual.data(), delta.data(), normed.data(), logits.data(), shared_logit.data(),
            ids.data(), weights.data(), h.data(), shared_h.data()};
  }
  std::vector<float> residual, delta, normed, logits, shared_logit;
  std::vector<int32_t> ids;
  std::vector<float> weights, h, shared_h;
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
  plan->moe_block(1, fused.b, nullptr);
  EXPECT_EQ(plan->moe_blocks_run(), before + 1) << "the fused block ran";
  expect_same(*be, s, fused.b, ops.b, s.label + " eager");

  // Against the CPU backend's ops (an independent f32 implementation).
  auto host = cpu();
  HostBuffers on_host(s, residual, delta);
  run_ops(*host, s, l, on_host.buffers());
  EXPECT_EQ(to_host(*be, fused.b.expert_ids, on_host.ids.size()), on_host.ids) << s.label << ": ids vs cpu";
  EXPECT_LT(report("moe_block", s.label + " output vs cpu",
                   to_host(*be, fused.b.delta, static_cast<size_t>(s.H)), ref::widen(on_host.delta)).normalised, kTol);

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
      plan->moe_block(static_cast<size_t>(i % 2), f2.b, nullptr);
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
    plan->moe_block(0, f3.b, nullptr);
    plan->moe_block(1, f3.b, nullptr);
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
  EXPECT_THROW(plan->moe_block(0, b.b, nullptr), std::logic_error);
}

// ---- the next layer's norm and input projection in the same kernel ------------------------

// The next layer's mixer input weights (model widths: Gated DeltaNet qkv | z | a | b, or
// attention q | k | v) and its input norm.
struct NextLayer {
  NextLayer(Rng& rng, LayerKind layer_kind, int64_t H) : kind(layer_kind) {
    const auto h = static_cast<uint64_t>(H);
    const std::vector<uint64_t> rows = kind == LayerKind::linear_attention
                                           ? std::vector<uint64_t>{8192, 4096, 32, 32}
                                           : std::vector<uint64_t>{8192, 512, 512};
    for (size_t t = 0; t < rows.size(); ++t) {
      w.push_back(std::make_unique<QuantWeight>(rng, 4, 1, rows[t], h, 0, "proj" + std::to_string(t)));
    }
    norm = std::make_unique<DenseTensor>(DType::BF16, std::vector<uint64_t>{h},
                                         rng.uniform_vector(static_cast<size_t>(H), 0.5f, 1.5f),
                                         "input_layernorm");
  }
  // `l` gets the weights (and keeps the MoE weights it has).
  void into(LayerWeights& l) const {
    l.kind = kind;
    l.input_norm = norm->view();
    if (kind == LayerKind::linear_attention) {
      l.gdn.in_proj_qkv = w[0]->view();
      l.gdn.in_proj_z = w[1]->view();
      l.gdn.in_proj_a = w[2]->view();
      l.gdn.in_proj_b = w[3]->view();
    } else {
      l.attn.q_proj = w[0]->view();
      l.attn.k_proj = w[1]->view();
      l.attn.v_proj = w[2]->view();
    }
  }
  LayerKind kind;
  std::vector<std::unique_ptr<QuantWeight>> w;
  std::unique_ptr<DenseTensor> norm;
};

// The targets of layer `l`'s input projection as the model passes them, into `ys`.
std::vector<MatmulTarget> next_targets(const LayerWeights& l, const std::vector<float*>& ys) {
  std::vector<const QuantView*> views;
  if (l.kind == LayerKind::linear_attention) {
    views = {&l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_a, &l.gdn.in_proj_b};
  } else {
    views = {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj};
  }
  std::vector<MatmulTarget> out;
  for (size_t t = 0; t < views.size(); ++t) {
    out.push_back(MatmulTarget{views[t], 0, static_cast<int64_t>(views[t]->rows()), ys[t]});
  }
  return out;
}

std::vector<float*> alloc_outputs(Backend& be, const LayerWeights& l) {
  std::vector<float*> ys;
  for (const MatmulTarget& t : next_targets(l, std::vector<float*>(4, nullptr))) {
    ys.push_back(be.alloc(static_cast<size_t>(t.rows)));
  }
  return ys;
}

// The op path: the MoE block, then the next layer's add_rms_norm and matmul_group.
void run_ops_then_next(Backend& be, const Shape& s, const LayerWeights& l, const LayerWeights& next,
                       const MoeBlockBuffers& b, const std::vector<float*>& ys) {
  run_ops(be, s, l, b);
  be.add_rms_norm(b.residual, b.delta, next.input_norm, 1, s.H, kEps, b.normed);
  be.matmul_group(next_targets(next, ys), b.normed, 1);
}

void expect_same_next(Backend& be, const Shape& s, const MoeBlockBuffers& got,
                      const std::vector<float*>& got_y, const MoeBlockBuffers& want,
                      const std::vector<float*>& want_y, const LayerWeights& next,
                      const std::string& label) {
  expect_same(be, s, got, want, label);
  const std::vector<MatmulTarget> targets = next_targets(next, got_y);
  for (size_t t = 0; t < targets.size(); ++t) {
    const auto n = static_cast<size_t>(targets[t].rows);
    EXPECT_TRUE(bit_equal(to_host(be, got_y[t], n), to_host(be, want_y[t], n)))
        << label << ": projection output " << t;
  }
}

// CUDA options with the next projection on (experimental, off by default: cuda_options.h).
CudaOptions with_next_projection() {
  CudaOptions options;
  options.next_projection = true;
  return options;
}

void check_block_with_next(LayerKind kind, uint64_t seed) {
  LILY_CUDA_BACKEND_WITH_OR_SKIP(be, with_next_projection());
  const Shape s{2048, 32, 512, 512, 8, 8, "H=2048 E=32 I=S=512 k=8"};
  const std::string label = s.label + (kind == LayerKind::linear_attention ? ", Gated DeltaNet next" : ", attention next");
  Rng rng(seed);
  const MoeLayer layer(rng, s.H, s.E, s.I, s.S, s.router_bits);
  const NextLayer next_weights(rng, kind, s.H);
  ModelWeights model;
  model.layers.push_back(layer.weights());
  model.layers.push_back(layer.weights());
  next_weights.into(model.layers[1]);
  const std::unique_ptr<DecodePlan> plan =
      be->make_decode_plan(model, DecodePlanShape{s.H, s.E, s.k, kEps});
  ASSERT_NE(plan, nullptr);
  std::printf("[plan] %s: %s\n", label.c_str(), plan->describe().c_str());
  ASSERT_TRUE(plan->fuses_next_projection(0)) << plan->describe();
  EXPECT_FALSE(plan->fuses_next_projection(1)) << "the last layer has no next one";
  const LayerWeights& l = model.layers[0];
  const LayerWeights& next = model.layers[1];

  const auto residual = rng.uniform_vector(static_cast<size_t>(s.H), -2.0f, 2.0f);
  const auto delta = rng.uniform_vector(static_cast<size_t>(s.H), -1.0f, 1.0f);
  Buffers ops(*be, s, residual, delta);
  Buffers fused(*be, s, residual, delta);
  const std::vector<float*> ops_y = alloc_outputs(*be, next);
  const std::vector<float*> fused_y = alloc_outputs(*be, next);
  run_ops_then_next(*be, s, l, next, ops.b, ops_y);
  const std::vector<MatmulTarget> targets = next_targets(next, fused_y);
  const NextProjection projection{targets.data(), targets.size(), &next.input_norm};
  const uint64_t blocks = plan->moe_blocks_run();
  const uint64_t projections = plan->next_projections_run();
  plan->moe_block(0, fused.b, &projection);
  EXPECT_EQ(plan->moe_blocks_run(), blocks + 1);
  EXPECT_EQ(plan->next_projections_run(), projections + 1) << "the fused next projection ran";
  expect_same_next(*be, s, fused.b, fused_y, ops.b, ops_y, next, label + " eager");

  // Against the CPU backend's ops: every target's outputs.
  auto host = cpu();
  HostBuffers on_host(s, residual, delta);
  std::vector<std::vector<float>> host_y;
  std::vector<float*> host_ptrs;
  for (const MatmulTarget& t : targets) host_y.emplace_back(static_cast<size_t>(t.rows));
  for (auto& y : host_y) host_ptrs.push_back(y.data());
  run_ops_then_next(*host, s, l, next, on_host.buffers(), host_ptrs);
  for (size_t t = 0; t < targets.size(); ++t) {
    EXPECT_LT(report("moe_block + next projection", label + " output " + std::to_string(t) + " vs cpu",
                     to_host(*be, fused_y[t], host_y[t].size()), ref::widen(host_y[t])).normalised, kTol);
  }

  // 20 launches in a row (the barrier counter grows by three a launch with the projection and
  // by two without it), then graph replays.
  {
    const auto r2 = rng.uniform_vector(static_cast<size_t>(s.H), -2.0f, 2.0f);
    const auto d2 = rng.uniform_vector(static_cast<size_t>(s.H), -1.0f, 1.0f);
    Buffers o2(*be, s, r2, d2);
    Buffers f2(*be, s, r2, d2);
    run_ops_then_next(*be, s, l, next, o2.b, ops_y);
    for (int i = 0; i < 20; ++i) {
      be->copy_from_host(r2.data(), r2.size(), f2.b.residual);
      be->copy_from_host(d2.data(), d2.size(), f2.b.delta);
      if (i % 3 == 1) plan->moe_block(1, f2.b, nullptr);  // a launch without it between
      be->copy_from_host(r2.data(), r2.size(), f2.b.residual);
      be->copy_from_host(d2.data(), d2.size(), f2.b.delta);
      plan->moe_block(0, f2.b, &projection);
    }
    expect_same_next(*be, s, f2.b, fused_y, o2.b, ops_y, next, label + " after 20 launches");
  }
  if (be->can_capture()) {
    const auto r3 = rng.uniform_vector(static_cast<size_t>(s.H), -2.0f, 2.0f);
    const auto d3 = rng.uniform_vector(static_cast<size_t>(s.H), -1.0f, 1.0f);
    Buffers o3(*be, s, r3, d3);
    Buffers f3(*be, s, r3, d3);
    run_ops_then_next(*be, s, l, next, o3.b, ops_y);
    be->begin_capture();
    plan->moe_block(0, f3.b, &projection);
    const int g = be->end_capture();
    for (int i = 0; i < 10; ++i) {
      be->copy_from_host(r3.data(), r3.size(), f3.b.residual);
      be->copy_from_host(d3.data(), d3.size(), f3.b.delta);
      be->replay(g);
    }
    expect_same_next(*be, s, f3.b, fused_y, o3.b, ops_y, next, label + " graph replays");
  }

  // What the plan refuses: the last layer's block with a next projection, another layer's
  // norm, a target that is not the planned weight.
  EXPECT_THROW(plan->moe_block(1, fused.b, &projection), std::logic_error);
  const NextProjection wrong_norm{targets.data(), targets.size(), &l.post_attention_norm};
  EXPECT_THROW(plan->moe_block(0, fused.b, &wrong_norm), std::invalid_argument);
  std::vector<MatmulTarget> swapped = targets;
  std::swap(swapped[0].w, swapped[1].w);
  const NextProjection wrong_target{swapped.data(), swapped.size(), &next.input_norm};
  EXPECT_THROW(plan->moe_block(0, fused.b, &wrong_target), std::invalid_argument);
  const NextProjection too_few{targets.data(), targets.size() - 1, &next.input_norm};
  EXPECT_THROW(plan->moe_block(0, fused.b, &too_few), std::invalid_argument);
}

TEST(CudaDecodePlan, MoeBlockThenDeltaNetProjectionEqualsTheOps) {
  check_block_with_next(LayerKind::linear_attention, 911);
}

TEST(CudaDecodePlan, MoeBlockThenAttentionProjectionEqualsTheOps) {
  check_block_with_next(LayerKind::full_attention, 912);
}

// A two-layer model of hidden width H (layer 1 with a `kind` mixer's input weights) planned on
// `be`: the block fuses, its next projection does not, and the plan's description says why
// (contains `why`).
void expect_next_projection_refused(Backend& be, Rng& rng, int64_t H, LayerKind kind, const std::string& why) {
  const MoeLayer layer(rng, H, 32, H / 4, H / 4, 8);
  const NextLayer next_weights(rng, kind, H);
  ModelWeights model;
  model.layers.push_back(layer.weights());
  model.layers.push_back(layer.weights());
  next_weights.into(model.layers[1]);
  const std::unique_ptr<DecodePlan> plan = be.make_decode_plan(model, DecodePlanShape{H, 32, 8, kEps});
  ASSERT_TRUE(plan->has_moe_block()) << plan->describe();
  EXPECT_FALSE(plan->fuses_next_projection(0));
  EXPECT_NE(plan->describe().find(why), std::string::npos) << plan->describe();
}

TEST(CudaDecodePlan, NextProjectionTurnedOffOrUnsupportedSaysWhy) {
  LILY_CUDA_BACKEND_WITH_OR_SKIP(be, with_next_projection());
  Rng rng(913);
  std::string why;
  const std::unique_ptr<Backend> off = cuda_backend_or_null(CudaOptions{}, &why);  // the default: off
  ASSERT_TRUE(off) << why;
  expect_next_projection_refused(*off, rng, 2048, LayerKind::linear_attention, "CudaOptions::next_projection");
  // H = 256 is not a multiple of 512.
  expect_next_projection_refused(*be, rng, 256, LayerKind::full_attention, "multiple of 512");
}

}  // namespace
}  // namespace lily::testing

// Kernel lab (not a test, not built by default): times the MoE block of one decode token on
// model-shaped random weights, as the op path's four launches and as moe_layer's one
// persistent launch, each in a CUDA graph over 8 layers, and prints moe_layer's phase timeline.
// Build: cmake -DLILY_BUILD_LAB=ON, target moe_layer_lab; run: build/tools/lab/moe_layer_lab.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "lab_support.cuh"

using namespace lily::cuda;
using namespace lily::cuda::lab;

namespace {

constexpr int64_t H = 2048, E = 256, I = 512, S = 512, K = 8;
constexpr int kLayers = 8;  // 8 x ~420 MB: each graph replay streams weights from DRAM, not L2

// Reads n floats (the L2 flush of the timeline states) and keeps the sum so it is not elided.
__global__ void sum_f32(const float* p, int64_t n, float* sink) {
  float acc = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    acc += p[i];
  }
  if (acc == 12345.0f) *sink = acc;
}

}  // namespace

int main() {
  cudaStream_t raw;
  LILY_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  const Stream s{raw, /*pdl=*/true, /*pdl_launches=*/nullptr};  // PDL on, as the backend on sm_90
  std::vector<MoeLayerParams> layers(kLayers);
  float* residual = dev<float>(H);
  float* delta = dev<float>(H);
  float* normed = dev<float>(H);
  float* logits = dev<float>(E);
  float* shared_logit = dev<float>(1);
  int32_t* ids = dev<int32_t>(K);
  float* weights = dev<float>(K);
  float* h = dev<float>(K * I);
  float* shared_h = dev<float>(S);
  auto* barrier = dev<unsigned long long>(1);
  cudaMemset(barrier, 0, 8);
  float* gain = dev<float>(H);
  fill_f32<<<8, 256>>>(residual, H, -1.0f, 0.02f);
  fill_f32<<<8, 256>>>(delta, H, -0.5f, 0.01f);
  fill_f32<<<8, 256>>>(gain, H, 0.8f, 0.004f);
  for (int l = 0; l < kLayers; ++l) {
    MoeLayerParams& p = layers[size_t(l)];
    p.hidden = H;
    p.experts = E;
    p.k = K;
    p.eps = 1e-6f;
    p.residual = residual;
    p.delta = delta;
    p.norm_gain = gain;
    p.normed = normed;
    const uint64_t seed = 1000u * uint64_t(l);
    p.router = matrix(8, 1, E, H, seed + 1, 0.002f);
    p.shared_expert_gate = matrix(8, 1, 1, H, seed + 2, 0.002f);
    p.gate = matrix(4, E, I, H, seed + 3, 0.01f);
    p.up = matrix(4, E, I, H, seed + 4, 0.01f);
    p.down = matrix(4, E, H, I, seed + 5, 0.01f);
    p.shared_gate = matrix(4, 1, S, H, seed + 6, 0.01f);
    p.shared_up = matrix(4, 1, S, H, seed + 7, 0.01f);
    p.shared_down = matrix(4, 1, H, S, seed + 8, 0.01f);
    p.router_logits = logits;
    p.shared_logit = shared_logit;
    p.ids = ids;
    p.weights = weights;
    p.h = h;
    p.shared_h = shared_h;
    p.out = delta;
    p.barrier = barrier;
  }
  LILY_CUDA_CHECK(cudaDeviceSynchronize());
  const int grid = moe_layer_grid(layers[0]);
  std::printf("moe_layer: grid %d blocks, %zu bytes of shared memory; unsupported: '%s'\n", grid,
              moe_layer_shared_bytes(layers[0]), moe_layer_unsupported(layers[0]).c_str());

  // The op path of one layer, as CudaBackend dispatches it for n = 1.
  const auto ops = [&](const MoeLayerParams& p) {
    add_rms_norm(p.residual, p.delta, p.norm_gain, 1, H, p.eps, p.normed, s);
    GemvTarget targets[2];
    targets[0].w = p.router;
    targets[0].rows = E;
    targets[0].y = p.router_logits;
    targets[1].w = p.shared_expert_gate;
    targets[1].rows = 1;
    targets[1].y = p.shared_logit;
    gemv_batch(targets, 2, p.normed, 1, s);
    route_expert_swiglu_gemv(p.router_logits, E, p.ids, p.weights, p.gate, p.up, K, p.h,
                             p.shared_gate, p.shared_up, p.shared_h, p.normed, 1, &p.down, s);
    expert_down_combine_gemv(p.down, p.h, p.ids, p.weights, 1, K, p.shared_down, p.shared_h,
                             p.shared_logit, p.out, s);
  };
  const cudaGraphExec_t op_graph = capture(s, [&] {
    for (const auto& p : layers) ops(p);
  });
  const cudaGraphExec_t fused_graph = capture(s, [&] {
    for (const auto& p : layers) moe_layer(p, grid, s);
  });
  for (int round = 0; round < 2; ++round) {
    const float op_us = time_graph(op_graph, s, 50);
    const float fused_us = time_graph(fused_graph, s, 50);
    std::printf("round %d: op path %.2f us per layer, moe_layer %.2f us per layer\n", round,
                op_us / kLayers, fused_us / kLayers);
  }

  // One launch with the timeline in three states of the memory system, the same layer and the
  // same inputs each time (residual and delta restored, so the routing picks the same experts):
  //   cold       another layer's launch first: the weights come from DRAM, and their pages may
  //              be missing from the TLBs;
  //   l2-flushed the same layer just ran, then a 256 MB read evicted L2: DRAM again, but the
  //              pages were translated a moment ago;
  //   l2-warm    the same layer just ran: its 16.5 MB are in L2.
  // If cold and l2-flushed differ, address translation costs; if l2-flushed and l2-warm
  // differ little, the phases wait on their own chains, not on DRAM.
  auto* timeline = dev<unsigned long long>(int64_t(grid) * kMoeLayerStamps);
  const char* names[kMoeLayerStamps] = {"wait", "norm", "router", "barrier1", "route",
                                        "swiglu", "barrier2", "stage", "down"};
  float* saved_residual = dev<float>(H);
  float* saved_delta = dev<float>(H);
  LILY_CUDA_CHECK(
      cudaMemcpy(saved_residual, residual, H * sizeof(float), cudaMemcpyDeviceToDevice));
  LILY_CUDA_CHECK(cudaMemcpy(saved_delta, delta, H * sizeof(float), cudaMemcpyDeviceToDevice));
  const int64_t flush_floats = int64_t(64) << 20;  // 256 MB, five times L2
  float* flush = dev<float>(flush_floats);
  float* sink = dev<float>(1);
  fill_f32<<<1024, 256>>>(flush, flush_floats, 0.0f, 1e-9f);
  const auto restore = [&] {
    LILY_CUDA_CHECK(cudaMemcpyAsync(residual, saved_residual, H * sizeof(float),
                                    cudaMemcpyDeviceToDevice, raw));
    LILY_CUDA_CHECK(
        cudaMemcpyAsync(delta, saved_delta, H * sizeof(float), cudaMemcpyDeviceToDevice, raw));
  };
  MoeLayerParams traced = layers[0];
  traced.timeline = timeline;
  for (const char* state : {"cold", "l2-flushed", "l2-warm", "cold", "l2-flushed", "l2-warm"}) {
    const std::string st = state;
    if (st == "cold") {
      moe_layer(layers[7], grid, s);
    } else {
      restore();
      moe_layer(layers[0], grid, s);
      if (st == "l2-flushed") sum_f32<<<1024, 256, 0, raw>>>(flush, flush_floats, sink);
    }
    restore();
    moe_layer(traced, grid, s);
    LILY_CUDA_CHECK(cudaStreamSynchronize(s));
    std::printf("%s: ", state);
    print_timeline(timeline, grid, kMoeLayerStamps, names);
  }
  return 0;
}

// Kernel lab (not a test, not built by default): times the Gated DeltaNet mixer of one decode
// token on model-shaped random weights, as the op path's five launches and as
// delta_net_layer's one persistent launch, each in a CUDA graph over 8 layers, and prints
// delta_net_layer's phase timeline; first it checks that one layer's outputs are bit-identical
// to the op path's. Build: cmake -DLILY_BUILD_LAB=ON, target delta_net_layer_lab.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "delta_net_layer.cuh"
#include "lab_support.cuh"

using namespace lily::cuda;
using namespace lily::cuda::lab;

namespace {

constexpr int64_t H = 2048;
constexpr int Hk = 16, Hv = 32, Dk = 128, Dv = 128, K = 4;
constexpr int64_t C = 2LL * Hk * Dk + int64_t(Hv) * Dv, Vw = int64_t(Hv) * Dv;
constexpr int kLayers = 8;  // 8 x ~19 MB: each graph replay streams weights from DRAM, not L2

}  // namespace

int main() {
  cudaStream_t raw;
  LILY_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  const Stream s{raw, /*pdl=*/true, /*pdl_launches=*/nullptr};  // PDL on, as the backend on sm_90
  std::vector<DeltaNetLayerParams> layers(kLayers);
  float* residual = dev<float>(H);
  float* delta = dev<float>(H);
  float* normed = dev<float>(H);
  float* mixed = dev<float>(C);
  float* z = dev<float>(Vw);
  float* a = dev<float>(Hv);
  float* b = dev<float>(Hv);
  float* core = dev<float>(Vw);
  float* gated = dev<float>(Vw);
  auto* barrier = dev<unsigned long long>(1);
  cudaMemset(barrier, 0, 8);
  auto* head_counts = dev<unsigned>(Hv);
  cudaMemset(head_counts, 0, Hv * sizeof(unsigned));
  float* gain = dev<float>(H);
  fill_f32<<<8, 256>>>(residual, H, -1.0f, 0.02f);
  fill_f32<<<8, 256>>>(delta, H, -0.5f, 0.01f);
  fill_f32<<<8, 256>>>(gain, H, 0.8f, 0.004f);
  for (int l = 0; l < kLayers; ++l) {
    DeltaNetLayerParams& p = layers[size_t(l)];
    p.hidden = H;
    p.shape = DeltaNetShape{Hk, Hv, Dk, Dv, K};
    p.eps = 1e-6f;
    p.q_scale = 1.0f / std::sqrt(float(Dk));
    p.add_norm = true;
    p.residual = residual;
    p.delta = delta;
    p.norm_gain = gain;
    p.normed = normed;
    const uint64_t seed = 1000u * uint64_t(l);
    p.in_qkv = matrix(4, 1, C, H, seed + 1, 0.01f);
    p.in_z = matrix(4, 1, Vw, H, seed + 2, 0.01f);
    p.in_a = matrix(4, 1, Hv, H, seed + 3, 0.01f);
    p.in_b = matrix(4, 1, Hv, H, seed + 4, 0.01f);
    p.out_proj = matrix(4, 1, H, Vw, seed + 5, 0.01f);
    p.mixed = mixed;
    p.z = z;
    p.a = a;
    p.b = b;
    float* conv_weight = dev<float>(C * K);
    float* a_log = dev<float>(Hv);
    float* dt_bias = dev<float>(Hv);
    float* gated_gain = dev<float>(Dv);
    float* window = dev<float>((K - 1) * C);
    float* state = dev<float>(int64_t(Hv) * Dk * Dv);
    fill_f32<<<64, 256>>>(conv_weight, C * K, -0.3f, 0.006f);
    fill_f32<<<1, 32>>>(a_log, Hv, 0.0f, 0.05f);
    fill_f32<<<1, 32>>>(dt_bias, Hv, -0.5f, 0.03f);
    fill_f32<<<1, 128>>>(gated_gain, Dv, 0.8f, 0.004f);
    fill_f32<<<64, 256>>>(window, (K - 1) * C, -0.5f, 0.01f);
    fill_f32<<<256, 256>>>(state, int64_t(Hv) * Dk * Dv, -0.1f, 0.002f);
    p.conv_weight = conv_weight;
    p.a_log = a_log;
    p.dt_bias = dt_bias;
    p.window = window;
    p.state = state;
    p.core_out = core;
    p.gated_norm_gain = gated_gain;
    p.gated = gated;
    p.head_counts = head_counts;
    p.out = delta;
    p.barrier = barrier;
  }
  LILY_CUDA_CHECK(cudaDeviceSynchronize());
  const int grid = delta_net_layer_grid(layers[0]);
  std::printf("delta_net_layer: grid %d blocks; unsupported: '%s'\n", grid,
              delta_net_layer_unsupported(layers[0]).c_str());

  // The op path of one layer, as CudaBackend dispatches it for n = 1 (fused conv on).
  const auto ops = [&](const DeltaNetLayerParams& p) {
    add_rms_norm(p.residual, p.delta, p.norm_gain, 1, H, p.eps, p.normed, s);
    GemvTarget in[4];
    const QuantMatrix* w[4] = {&p.in_qkv, &p.in_z, &p.in_a, &p.in_b};
    float* y[4] = {p.mixed, p.z, p.a, p.b};
    for (int i = 0; i < 4; ++i) {
      in[i].w = *w[i];
      in[i].rows = w[i]->out;
      in[i].y = y[i];
    }
    gemv_batch(in, 4, p.normed, 1, s);
    gated_delta_step(p.mixed, p.window, p.conv_weight, p.a, p.b, p.a_log, p.dt_bias, p.state,
                     p.shape, p.core_out, s);
    gated_rms_norm(p.core_out, p.z, p.gated_norm_gain, Hv, Dv, p.eps, p.gated, s);
    const GemvTarget out{p.out_proj, 0, H, p.out};
    gemv_batch(&out, 1, p.gated, 1, s, WindowShift{p.mixed, p.window, C, K});
  };

  // Bit identity: layer 0 on two copies of every buffer, the op path on one, the kernel on the
  // other, twice in a row (the window and the state carry).
  {
    using Field = float* DeltaNetLayerParams::*;
    struct Buffer {
      Field field;
      int64_t count;
      const char* name;
    };
    const Buffer buffers[] = {{&DeltaNetLayerParams::residual, H, "residual"},
                              {&DeltaNetLayerParams::normed, H, "normed"},
                              {&DeltaNetLayerParams::mixed, C, "mixed"},
                              {&DeltaNetLayerParams::z, Vw, "z"},
                              {&DeltaNetLayerParams::a, Hv, "a"},
                              {&DeltaNetLayerParams::b, Hv, "b"},
                              {&DeltaNetLayerParams::window, (K - 1) * C, "window"},
                              {&DeltaNetLayerParams::state, int64_t(Hv) * Dk * Dv, "state"},
                              {&DeltaNetLayerParams::core_out, Vw, "core_out"},
                              {&DeltaNetLayerParams::gated, Vw, "gated"},
                              {&DeltaNetLayerParams::out, H, "out"}};
    DeltaNetLayerParams copies[2] = {layers[0], layers[0]};
    for (DeltaNetLayerParams& c : copies) {
      for (const Buffer& buf : buffers) {
        float* fresh = dev<float>(buf.count);
        cudaMemcpy(fresh, layers[0].*buf.field, size_t(buf.count) * 4, cudaMemcpyDeviceToDevice);
        c.*buf.field = fresh;
      }
      c.delta = c.out;  // the model's in/out buffer
    }
    for (int step = 0; step < 2; ++step) {
      ops(copies[0]);
      delta_net_layer(copies[1], grid, s);
    }
    LILY_CUDA_CHECK(cudaStreamSynchronize(s));
    const char* differs = nullptr;
    for (const Buffer& buf : buffers) {
      std::vector<float> x(size_t(buf.count)), y(size_t(buf.count));
      cudaMemcpy(x.data(), copies[0].*buf.field, x.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(y.data(), copies[1].*buf.field, y.size() * 4, cudaMemcpyDeviceToHost);
      if (differs == nullptr && std::memcmp(x.data(), y.data(), x.size() * 4) != 0) differs = buf.name;
    }
    std::printf("two tokens of layer 0: %s\n", differs == nullptr ? "bit-identical to the op path"
                                                               : "DIFFERS from the op path in");
    if (differs != nullptr) std::printf("  %s\n", differs);
  }
  const cudaGraphExec_t op_graph = capture(s, [&] {
    for (const auto& p : layers) ops(p);
  });
  const cudaGraphExec_t fused_graph = capture(s, [&] {
    for (const auto& p : layers) delta_net_layer(p, grid, s);
  });
  for (int round = 0; round < 2; ++round) {
    const float op_us = time_graph(op_graph, s, 50);
    const float fused_us = time_graph(fused_graph, s, 50);
    std::printf("round %d: op path %.2f us per layer, delta_net_layer %.2f us per layer\n", round,
                op_us / kLayers, fused_us / kLayers);
  }

  // One launch with the timeline, after a launch of another layer (cold weights).
  auto* timeline = dev<unsigned long long>(int64_t(grid) * kDeltaNetLayerStamps);
  const char* names[kDeltaNetLayerStamps] = {"wait", "norm", "proj", "barrier1",
                                             "delta", "barrier2", "gated", "out"};
  for (int rep = 0; rep < 2; ++rep) {
    DeltaNetLayerParams p = layers[0];
    p.timeline = timeline;
    delta_net_layer(layers[7], grid, s);
    delta_net_layer(p, grid, s);
    LILY_CUDA_CHECK(cudaStreamSynchronize(s));
    print_timeline(timeline, grid, kDeltaNetLayerStamps, names);
  }
  return 0;
}

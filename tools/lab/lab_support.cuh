// Shared helpers of the kernel lab's harnesses (tools/lab/): device buffers filled with
// deterministic values, model-shaped random MLX matrices, and the time of a replayed graph.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

// (One translation unit per lab executable: the kernels need no inline.)
namespace lily::cuda::lab {

__global__ void fill_words(uint32_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (seed + uint64_t(i)) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    p[i] = uint32_t(z >> 32);
  }
}
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16(v);
  }
}
__global__ void fill_f32(float* p, int64_t n, float lo, float step) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    p[i] = lo + step * float(i % 97);
  }
}

template <typename T>
T* dev(int64_t count) {
  void* p = nullptr;
  LILY_CUDA_CHECK(cudaMalloc(&p, size_t(count) * sizeof(T)));
  return static_cast<T*>(p);
}

inline QuantMatrix matrix(int bits, int64_t experts, int64_t out, int64_t in, uint64_t seed, float scale) {
  QuantMatrix m;
  m.bits = bits;
  m.experts = experts;
  m.out = out;
  m.in = in;
  const int64_t words = experts * out * in * bits / 32;
  const int64_t groups = experts * out * in / 64;
  auto* codes = dev<uint32_t>(words);
  auto* scales = dev<__nv_bfloat16>(groups);
  auto* biases = dev<__nv_bfloat16>(groups);
  fill_words<<<1024, 256>>>(codes, words, seed);
  fill_bf16<<<1024, 256>>>(scales, groups, scale);
  fill_bf16<<<1024, 256>>>(biases, groups, -scale * float((1 << bits) - 1) / 2);
  m.codes = codes;
  m.scales = scales;
  m.biases = biases;
  return m;
}

inline float time_graph(cudaGraphExec_t g, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) cudaGraphLaunch(g, s);
  cudaEventRecord(a, s);
  for (int i = 0; i < reps; ++i) cudaGraphLaunch(g, s);
  cudaEventRecord(b, s);
  LILY_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.0f / float(reps);
}

// The graph of what record() launches on s.
template <typename Record>
cudaGraphExec_t capture(cudaStream_t s, Record record) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LILY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  record();
  LILY_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  LILY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  return exec;
}

// Prints a kernel's phase timeline, [grid, stamps] u64 %globaltimer values in device memory
// (phase 0 = each block's start): per phase the earliest and the latest block, in us after the
// first block's start.
inline void print_timeline(const unsigned long long* device_timeline, int grid, int stamps,
                           const char* const* names) {
  std::vector<unsigned long long> t(size_t(grid) * size_t(stamps));
  LILY_CUDA_CHECK(cudaMemcpy(t.data(), device_timeline, t.size() * 8, cudaMemcpyDeviceToHost));
  unsigned long long t0 = ~0ull;
  for (int b = 0; b < grid; ++b) t0 = std::min(t0, t[size_t(b) * size_t(stamps)]);
  std::printf("timeline (us from the first block's start; min / max over blocks):");
  for (int ph = 0; ph < stamps; ++ph) {
    unsigned long long lo = ~0ull, hi = 0;
    for (int b = 0; b < grid; ++b) {
      lo = std::min(lo, t[size_t(b) * size_t(stamps) + size_t(ph)]);
      hi = std::max(hi, t[size_t(b) * size_t(stamps) + size_t(ph)]);
    }
    std::printf(" %s %.2f/%.2f", names[ph], double(lo - t0) / 1000.0, double(hi - t0) / 1000.0);
  }
  std::printf("\n");
}

}  // namespace lily::cuda::lab

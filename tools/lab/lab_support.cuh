// Shared helpers of the kernel lab's harnesses (tools/lab/): device buffers filled with
// deterministic values, model-shaped random MLX matrices, and the time of a replayed graph.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

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

}  // namespace lily::cuda::lab

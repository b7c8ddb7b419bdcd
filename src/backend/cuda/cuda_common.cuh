// Shared device helpers of the CUDA backend: error checks, MLX affine dequantisation, warp sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace lily::cuda {

// Throws std::runtime_error naming the call, file and line when a CUDA API call fails.
#define LILY_CUDA_CHECK(call)                                                              \
  do {                                                                                     \
    const cudaError_t lily_status_ = (call);                                               \
    if (lily_status_ != cudaSuccess) {                                                     \
      throw std::runtime_error(std::string("CUDA error: ") + #call + ": " +                \
                               cudaGetErrorString(lily_status_) + " at " + __FILE__ + ":" + \
                               std::to_string(__LINE__));                                  \
    }                                                                                      \
  } while (0)

// After a kernel launch: a bad configuration shows up here, not at a later sync.
#define LILY_CUDA_LAUNCH_CHECK() LILY_CUDA_CHECK(cudaGetLastError())

inline constexpr int kGroupSize = 64;  // MLX affine group size, the only one the model uses

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Element j (0..7) of a Q4 word: MLX packs element 8w+j into bits 4j..4j+3 of word w.
__device__ __forceinline__ float q4_at(uint32_t word, int j) {
  return static_cast<float>((word >> (4 * j)) & 0xFu);
}

// Element j (0..3) of a Q8 word: bits 8j..8j+7.
__device__ __forceinline__ float q8_at(uint32_t word, int j) {
  return static_cast<float>((word >> (8 * j)) & 0xFFu);
}

// Dequantised value exactly as MLX (and the CPU backend) computes it in f32: the product
// rounded, then the sum rounded. Not fused: an FMA would differ in the last bit.
__device__ __forceinline__ float dequant(float q, float scale, float bias) {
  return __fadd_rn(__fmul_rn(scale, q), bias);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }

}  // namespace lily::cuda

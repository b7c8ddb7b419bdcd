// The add + RMSNorm at the start of a persistent decode kernel: every block forms residual +
// delta and its RMSNorm for itself, with the op path's arithmetic (norms.cu), so the result is
// bit-identical to add_rms_norm. The lab's tools/lab/delta_net_layer.cu uses residual_norm;
// moe_layer.cu only the block sum and the scale (its norm is written out: see stage_norm).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace lily::cuda {

inline constexpr int kPersistentThreads = 256;  // the register-resident norm's block size (norms.cu)
inline constexpr int kPersistentWarps = kPersistentThreads / 32;

// Block sum as norms.cu's block_sum: warp sums, then every thread adds the 8 partials in order.
__device__ __forceinline__ float norm_block_sum(float v, float* partial) {
  v = warp_sum(v);
  __syncthreads();  // partial may still be read from an earlier call
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kPersistentWarps; ++w) total += partial[w];
  return total;
}

// What the norm reads and writes (f32, H = hidden).
struct ResidualNormArgs {
  const float* residual = nullptr;  // [H] read only here: the caller writes `sums` back later
  const float* delta = nullptr;     // [H]
  const float* gain = nullptr;      // [H]
  float* normed = nullptr;          // [H] written by block 0
  int64_t hidden = 0;
  float eps = 0.0f;
};

// sums[0, H) = residual + delta and its RMSNorm, handed to store(q, float4) quad by quad (q < H/4);
// block 0 also writes normed. Same arithmetic as norm_warp_kernel<add> (H <= 256, one warp;
// `sums` then needs 2H floats) or norm_vec_kernel<add, V> (H > 256, thread t holds float4s t,
// t + 256, ...; H <= 1024 V). Every thread of the block calls it; stores are done on return
// except for what store() itself defers.
template <int V, typename Store>
__device__ void residual_norm(const ResidualNormArgs& a, float* sums, float* partial, Store store) {
  const int64_t H = a.hidden;
  if (H <= 256) {
    // norm_warp_kernel: lane l holds values l + 32c; warp 0 does it, the others wait.
    if (threadIdx.x < 32) {
      const int lane = static_cast<int>(threadIdx.x);
      float v[8];
      float sum_sq = 0.0f;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int64_t i = lane + 32 * c;
        v[c] = 0.0f;
        if (i < H) {
          v[c] = a.residual[i] + a.delta[i];
          sum_sq = fmaf(v[c], v[c], sum_sq);
        }
      }
      const float inv = rms_scale(warp_sum(sum_sq), H, a.eps);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int64_t i = lane + 32 * c;
        if (i < H) sums[i] = v[c];
        if (i < H) v[c] = v[c] * inv * a.gain[i];
        if (i < H && blockIdx.x == 0) a.normed[i] = v[c];
      }
      __syncwarp();
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int64_t i = lane + 32 * c;
        if (i < H) sums[H + i] = v[c];  // the normed row, after the sums
      }
    }
    __syncthreads();
    for (int64_t q = threadIdx.x; q < H / 4; q += kPersistentThreads) {
      const float* o = sums + H + 4 * q;
      store(q, make_float4(o[0], o[1], o[2], o[3]));
    }
    return;
  }
  const int64_t quads = H / 4;
  const auto* r = reinterpret_cast<const float4*>(a.residual);
  const auto* d = reinterpret_cast<const float4*>(a.delta);
  float4 sum[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * kPersistentThreads;
    sum[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (q < quads) {
      const float4 x = r[q];
      const float4 y = d[q];
      sum[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      reinterpret_cast<float4*>(sums)[q] = sum[i];
    }
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    sum_sq = fmaf(sum[i].x, sum[i].x, sum_sq);
    sum_sq = fmaf(sum[i].y, sum[i].y, sum_sq);
    sum_sq = fmaf(sum[i].z, sum[i].z, sum_sq);
    sum_sq = fmaf(sum[i].w, sum[i].w, sum_sq);
  }
  const float inv = rms_scale(norm_block_sum(sum_sq, partial), H, a.eps);
  const auto* g = reinterpret_cast<const float4*>(a.gain);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * kPersistentThreads;
    if (q >= quads) continue;
    const float4 gq = g[q];
    const float4 o = make_float4(sum[i].x * inv * gq.x, sum[i].y * inv * gq.y,
                                 sum[i].z * inv * gq.z, sum[i].w * inv * gq.w);
    store(q, o);
    if (blockIdx.x == 0) reinterpret_cast<float4*>(a.normed)[q] = o;
  }
}

// residual_norm for any H the persistent kernels take (<= 4096): V = 2 up to 2048, else 4.
template <typename Store>
__device__ void residual_norm_any(const ResidualNormArgs& a, float* sums, float* partial, Store store) {
  if (a.hidden <= 2048) {
    residual_norm<2>(a, sums, partial, store);
  } else {
    residual_norm<4>(a, sums, partial, store);
  }
}

}  // namespace lily::cuda

// RMSNorm kernels: plain, fused residual add, and the gated per-head norm of the DeltaNet output.
//
// Rows of up to kWarpRowMax values (the gated norm's 128 per value head, head norms) take one
// warp per row; longer rows (the 2048 hidden) one 256-thread block per row. The sum of squares
// is an f32 tree sum (the CPU's is sequential: both are within ~1e-7 of the f64 reference), the
// scale is 1 / sqrtf(mean + eps) with IEEE sqrt and division like the CPU, and each output is
// (x * inv) * gain [* silu(z)] in that order.
//
// Every norm lets the next launch start right after its own dependency wait (not after its
// main loop, as the larger kernels do): a norm is one block (a few for the gated norm) of
// latency, and the launch after it is a GEMV whose blocks load their weights before their
// own wait, so they should be loading while the norm runs rather than after it. Triggering
// after the wait, not before it, keeps the launch contract's rule that a kernel has waited
// for its predecessor before the next one launches (cuda_common.cuh).
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace lily::cuda {

namespace {

constexpr int kWarpRowMax = 256;  // rows this long or shorter: one warp per row
constexpr int kBlockThreads = 256;
constexpr int kWarpsPerBlock = kBlockThreads / 32;

enum class NormKind { plain, add, gated };

// One warp per row. For kind == add, x is the residual (updated in place with delta).
template <NormKind kKind>
__global__ void __launch_bounds__(kBlockThreads)
    norm_warp_kernel(float* x, const float* delta, const float* z, const float* gain,
                     int64_t rows, int64_t dim, float eps, float* out) {
  constexpr int kPer = kWarpRowMax / 32;
  const int lane = threadIdx.x & 31;
  // The gain is a weight: read before the wait, so that its device-memory round trip is not in
  // the norm's path (the launch before has long evicted it from L2).
  float g[kPer];
#pragma unroll
  for (int c = 0; c < kPer; ++c) g[c] = lane + 32 * c < dim ? gain[lane + 32 * c] : 0.0f;
  grid_dependency_wait();
  allow_dependent_launch();  // see the top of this file
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  float* xr = x + row * dim;
  float v[kPer];
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    const int64_t i = lane + 32 * c;
    v[c] = 0.0f;
    if (i < dim) {
      float value = xr[i];
      if constexpr (kKind == NormKind::add) {
        value += delta[row * dim + i];
        xr[i] = value;
      }
      v[c] = value;
      sum_sq = fmaf(value, value, sum_sq);
    }
  }
  const float inv = rms_scale(warp_sum(sum_sq), dim, eps);
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    const int64_t i = lane + 32 * c;
    if (i < dim) {
      float o = v[c] * inv * g[c];
      if constexpr (kKind == NormKind::gated) {
        const float zi = z[row * dim + i];
        o *= zi * sigmoidf_(zi);  // silu as the CPU forms it: z * sigmoid(z)
      }
      out[row * dim + i] = o;
    }
  }
}

// One block per row (any dim). The updated residual is re-read from global memory (L1/L2).
template <NormKind kKind>
__global__ void __launch_bounds__(kBlockThreads)
    norm_block_kernel(float* x, const float* delta, const float* z, const float* gain,
                      int64_t dim, float eps, float* out) {
  grid_dependency_wait();
  allow_dependent_launch();  // see the top of this file
  __shared__ float partial[kWarpsPerBlock];
  __shared__ float total;
  const int64_t row = blockIdx.x;
  float* xr = x + row * dim;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kBlockThreads) {
    float value = xr[i];
    if constexpr (kKind == NormKind::add) {
      value += delta[row * dim + i];
      xr[i] = value;  // each thread re-reads only what it wrote itself below
    }
    sum_sq = fmaf(value, value, sum_sq);
  }
  sum_sq = warp_sum(sum_sq);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum_sq;
  __syncthreads();
  if (threadIdx.x < 32) {
    float p = threadIdx.x < kWarpsPerBlock ? partial[threadIdx.x] : 0.0f;
    p = warp_sum(p);
    if (threadIdx.x == 0) total = p;
  }
  __syncthreads();
  const float inv = rms_scale(total, dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += kBlockThreads) {
    float o = xr[i] * inv * gain[i];
    if constexpr (kKind == NormKind::gated) {
      const float zi = z[row * dim + i];
      o *= zi * sigmoidf_(zi);
    }
    out[row * dim + i] = o;
  }
}

// Block sum of one value per thread; every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[kWarpsPerBlock];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarpsPerBlock; ++w) total += partial[w];  // same order in every thread
  return total;
}

// One block per row of dim <= 4 * kBlockThreads * V, dim % 4 == 0, 16-byte aligned rows: each
// thread keeps its V float4s in registers, so the row is read once, with every load issued
// before the first use (the generic kernel's loop serialises a load, add and store per value,
// and re-reads the row).
template <NormKind kKind, int V>
__global__ void __launch_bounds__(kBlockThreads)
    norm_vec_kernel(float* x, const float* __restrict__ delta, const float* __restrict__ z,
                    const float* __restrict__ gain, int64_t dim, float eps, float* out) {
  const int64_t quads = dim / 4;
  float4 g[V];  // the gain before the wait, as in norm_warp_kernel
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * kBlockThreads;
    g[i] = q < quads ? reinterpret_cast<const float4*>(gain)[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  grid_dependency_wait();
  allow_dependent_launch();  // see the top of this file
  const int64_t row = blockIdx.x;
  auto* xr = reinterpret_cast<float4*>(x + row * dim);
  float4 v[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * kBlockThreads;
    v[i] = q < quads ? xr[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (kKind == NormKind::add) {
      if (q < quads) {
        const float4 d = reinterpret_cast<const float4*>(delta + row * dim)[q];
        v[i].x += d.x;
        v[i].y += d.y;
        v[i].z += d.z;
        v[i].w += d.w;
      }
    }
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    sum_sq = fmaf(v[i].x, v[i].x, sum_sq);
    sum_sq = fmaf(v[i].y, v[i].y, sum_sq);
    sum_sq = fmaf(v[i].z, v[i].z, sum_sq);
    sum_sq = fmaf(v[i].w, v[i].w, sum_sq);
  }
  const float inv = rms_scale(block_sum(sum_sq), dim, eps);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * kBlockThreads;
    if (q >= quads) continue;
    if constexpr (kKind == NormKind::add) xr[q] = v[i];
    float4 o = make_float4(v[i].x * inv * g[i].x, v[i].y * inv * g[i].y, v[i].z * inv * g[i].z,
                           v[i].w * inv * g[i].w);
    if constexpr (kKind == NormKind::gated) {
      const float4 zq = reinterpret_cast<const float4*>(z + row * dim)[q];
      o.x *= zq.x * sigmoidf_(zq.x);
      o.y *= zq.y * sigmoidf_(zq.y);
      o.z *= zq.z * sigmoidf_(zq.z);
      o.w *= zq.w * sigmoidf_(zq.w);
    }
    reinterpret_cast<float4*>(out + row * dim)[q] = o;
  }
}

template <NormKind kKind>
void launch_norm(float* x, const float* delta, const float* z, const float* gain, int64_t rows,
            int64_t dim, float eps, float* out, Stream s) {
  if (rows <= 0 || dim <= 0) return;
  const bool vec = dim % 4 == 0 && aligned16(x) && aligned16(delta) && aligned16(z) &&
                   aligned16(gain) && aligned16(out);
  const auto row_blocks = static_cast<unsigned>(rows);
  if (dim <= kWarpRowMax) {
    const auto blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    launch(norm_warp_kernel<kKind>, blocks, kBlockThreads, 0, s, x, delta, z, gain, rows, dim, eps,
           out);
  } else if (vec && dim <= 4 * kBlockThreads * 2) {
    launch(norm_vec_kernel<kKind, 2>, row_blocks, kBlockThreads, 0, s, x, delta, z, gain, dim, eps,
           out);
  } else if (vec && dim <= 4 * kBlockThreads * 4) {
    launch(norm_vec_kernel<kKind, 4>, row_blocks, kBlockThreads, 0, s, x, delta, z, gain, dim, eps,
           out);
  } else {
    launch(norm_block_kernel<kKind>, row_blocks, kBlockThreads, 0, s, x, delta, z, gain, dim, eps,
           out);
  }
}

}  // namespace

void rms_norm(const float* x, const float* gain, int64_t n, int64_t dim, float eps, float* out,
              Stream s) {
  // The plain kernel never writes x (only the add kind does).
  launch_norm<NormKind::plain>(const_cast<float*>(x), nullptr, nullptr, gain, n, dim, eps, out, s);
}

void add_rms_norm(float* residual, const float* delta, const float* gain, int64_t n, int64_t dim,
                  float eps, float* out, Stream s) {
  launch_norm<NormKind::add>(residual, delta, nullptr, gain, n, dim, eps, out, s);
}

void gated_rms_norm(const float* x, const float* z, const float* gain, int64_t rows, int64_t dim,
                    float eps, float* out, Stream s) {
  launch_norm<NormKind::gated>(const_cast<float*>(x), nullptr, z, gain, rows, dim, eps, out, s);
}

}  // namespace lily::cuda

// CUDA MoE routing: softmax over the router logits, top-k by probability (equal probabilities:
// lower expert id first), weights renormalised over the k chosen. Mirrors CpuBackend::moe_route
// (src/backend/cpu/cpu_backend.cpp): p_e = exp(l_e - max), total = sum p, top_total = sum over
// the chosen in rank order of p/total, weight = p/total/top_total. Only the order of the f32 sum
// `total` differs (a warp tree instead of a sequential loop), and expf may differ from the
// host's exp by an ulp, so ids agree exactly unless two probabilities are within an ulp or two.
//
// One warp per row (4 rows per block of 128 threads): lane l holds the probabilities of experts
// l, l+32, ...; k rounds of a warp arg-max (value, then lower id) pick the winners, each masked
// with -inf once chosen. Supports experts <= 1024 and k <= min(experts, 32) (CudaBackend checks;
// the launcher throws std::invalid_argument). Graph-capturable: one launch, nothing else.
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace lily::cuda {

namespace {

constexpr int kRowsPerBlock = 4;
constexpr int kMaxExperts = 1024;

template <int M>  // experts per lane: experts <= 32 * M
__global__ void __launch_bounds__(kRowsPerBlock * 32, 1)
    moe_route_kernel(const float* __restrict__ logits, int64_t n, int E, int k,
                     int32_t* __restrict__ ids, float* __restrict__ weights) {
  grid_dependency_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= n) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x & 31);
  const float* l = logits + row * E;

  float p[M];
  float top = -INFINITY;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int e = lane + 32 * m;
    p[m] = e < E ? l[e] : -INFINITY;
    top = fmaxf(top, p[m]);
  }
  top = warp_max(top);
  float total = 0.0f;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int e = lane + 32 * m;
    // Padding gets -1: below every probability (>= 0), so it is never picked while k <= E.
    p[m] = e < E ? expf(p[m] - top) : -1.0f;
    if (e < E) total += p[m];
  }
  total = warp_sum(total);

  float top_total = 0.0f;
  int32_t my_id = 0;
  float my_p = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int best_id = INT_MAX;
#pragma unroll
    for (int m = 0; m < M; ++m) {  // ascending ids within the lane: strict > keeps the lower
      if (p[m] > best) {
        best = p[m];
        best_id = lane + 32 * m;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (other > best || (other == best && other_id < best_id)) {
        best = other;
        best_id = other_id;
      }
    }
    // Every lane now holds the same winner (a total order, reduced by a butterfly).
    if ((best_id & 31) == lane) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (lane + 32 * m == best_id) p[m] = -INFINITY;
      }
    }
    top_total += best / total;  // the CPU's order: rank 0 first
    if (lane == j) {
      my_id = best_id;
      my_p = best;
    }
  }
  if (lane < k) {
    ids[row * k + lane] = my_id;
    weights[row * k + lane] = my_p / total / top_total;
  }
}

template <int M>
void launch_route(const float* logits, int64_t n, int64_t E, int64_t k, int32_t* ids,
                  float* weights, cudaStream_t s) {
  const auto blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  launch(moe_route_kernel<M>, blocks, kRowsPerBlock * 32, 0, s, logits, n, static_cast<int>(E),
         static_cast<int>(k), ids, weights);
}

}  // namespace

void moe_route(const float* logits, int64_t n, int64_t experts, int64_t k, int32_t* ids,
               float* weights, cudaStream_t s) {
  if (n <= 0) return;
  if (experts < 1 || experts > kMaxExperts || k < 1 || k > experts || k > 32) {
    throw std::invalid_argument("cuda::moe_route: needs 1 <= k <= min(experts, 32), experts <= 1024");
  }
  if (experts <= 32) return launch_route<1>(logits, n, experts, k, ids, weights, s);
  if (experts <= 64) return launch_route<2>(logits, n, experts, k, ids, weights, s);
  if (experts <= 128) return launch_route<4>(logits, n, experts, k, ids, weights, s);
  if (experts <= 256) return launch_route<8>(logits, n, experts, k, ids, weights, s);
  if (experts <= 512) return launch_route<16>(logits, n, experts, k, ids, weights, s);
  return launch_route<32>(logits, n, experts, k, ids, weights, s);
}

}  // namespace lily::cuda

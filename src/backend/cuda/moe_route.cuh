// The warp routing step shared by the routing kernel (moe_route.cu) and the decode SwiGLU
// kernel that fuses it (moe_gemv.cu): softmax over one row of router logits, top-k, weights
// renormalised over the k chosen. See moe_route.cu for the order of operations and how it
// matches the CPU backend.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace lily::cuda {

// One warp routes one row: l [E] f32 logits, E <= 32 * M, k <= min(E, 32). Lane j < k
// returns the rank-j expert id in *id and its weight in *weight (other lanes: unchanged).
// Every lane of the warp must call it.
template <int M>
__device__ __forceinline__ void route_row(const float* l, int E, int k, int lane, int32_t* id,
                                          float* weight) {
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
    *id = my_id;
    *weight = my_p / total / top_total;
  }
}

}  // namespace lily::cuda

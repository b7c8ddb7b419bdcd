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

  // Top-k by warp reductions on integer keys: a probability p >= 0 has order-preserving
  // bits, so key = bits(p) + 1 ranks the candidates and 0 marks what cannot be picked (taken,
  // padding, NaN). Each rank takes two redux.sync (the largest key, then the lowest id holding
  // it) instead of a 5-step shuffle butterfly of (value, id) pairs: the k rounds are one
  // dependent chain, so its length is what counts. The winner and its order are exactly
  // those of "larger p first, equal p: lower id first".
  uint32_t key[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    key[m] = (lane + 32 * m < E && p[m] >= 0.0f) ? __float_as_uint(p[m]) + 1u : 0u;
  }
  float top_total = 0.0f;
  int32_t my_id = 0;
  float my_p = 0.0f;
  for (int j = 0; j < k; ++j) {
    uint32_t best = 0;
    int best_m = 0;
#pragma unroll
    for (int m = 0; m < M; ++m) {  // ascending ids within the lane: strict > keeps the lower
      if (key[m] > best) {
        best = key[m];
        best_m = m;
      }
    }
    const uint32_t winner_key = __reduce_max_sync(0xffffffffu, best);
    const uint32_t candidate =
        best == winner_key ? static_cast<uint32_t>(lane + 32 * best_m) : 0xffffffffu;
    const int32_t best_id = static_cast<int32_t>(__reduce_min_sync(0xffffffffu, candidate));
    if ((best_id & 31) == lane) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m == best_m) key[m] = 0;
      }
    }
    const float winner_p = __uint_as_float(winner_key - 1u);
    top_total += winner_p / total;  // the CPU's order: rank 0 first
    if (lane == j) {
      my_id = best_id;
      my_p = winner_p;
    }
  }
  if (lane < k) {
    *id = my_id;
    *weight = my_p / total / top_total;
  }
}

}  // namespace lily::cuda

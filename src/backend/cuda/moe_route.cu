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
#include "backend/cuda/moe_route.cuh"

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
  int32_t id = 0;
  float weight = 0.0f;
  route_row<M>(logits + row * E, E, k, lane, &id, &weight);
  if (lane < k) {
    ids[row * k + lane] = id;
    weights[row * k + lane] = weight;
  }
}

template <int M>
void launch_route(const float* logits, int64_t n, int64_t E, int64_t k, int32_t* ids,
                  float* weights, Stream s) {
  const auto blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  launch(moe_route_kernel<M>, blocks, kRowsPerBlock * 32, 0, s, logits, n, static_cast<int>(E),
         static_cast<int>(k), ids, weights);
}

}  // namespace

void moe_route(const float* logits, int64_t n, int64_t experts, int64_t k, int32_t* ids,
               float* weights, Stream s) {
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

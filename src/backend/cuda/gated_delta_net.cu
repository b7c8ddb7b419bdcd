// CUDA Gated DeltaNet: the causal depthwise conv1d + SiLU with its carried window, and the gated
// delta rule recurrence with its carried state (CPU twin: src/backend/cpu/gated_delta_net.cpp,
// whose arithmetic order these kernels mirror; FMA contraction and the summation order of the
// dot products are the only differences).
//
// Supported shapes (CudaBackend must check them; the launchers throw std::invalid_argument):
//   conv1d_silu:      conv_kernel 2..8, any channel count.
//   gated_delta_rule: key_dim 32, 64 or 128; value_dim a multiple of 8; value_heads a
//                     multiple of key_heads; a 16-byte aligned state.
//   gated_delta_step: the one-token delta rule with the conv fused in front: conv_kernel 4,
//                     key_dim 32, 64 or 128; the window is read, not updated (WindowShift).
//                     With the gated norm after it (DeltaGatedNorm): value_dim <= 256 and
//                     code built for compute capability 9.0 (thread-block clusters).
// The conv reads its window, and a one-token delta rule its state, before grid_dependency_wait
// (see the kernels): they must not have been written by the launch immediately before (the
// model always has other ops in between; the launch after next sees them).
// Every launch is graph-capturable: no allocation, no host synchronisation, no attribute calls.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cooperative_groups.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/delta_rule_decode.cuh"

namespace lily::cuda {

namespace {

using namespace delta_detail;

// ---- conv1d_silu ----------------------------------------------------------------------------
// One thread per (channel, tile of kConvTile tokens) keeps the K-1 previous inputs in registers.
// A tile primes them from the carried window (tile 0) or from the previous tile's inputs.
// Window update without a race: when the whole chunk is one tile (every decode step), the thread
// that read a channel's window writes it back at the end; otherwise (n > kConvTile >= K-1 so
// the new window is the last K-1 inputs of `mixed` alone) a second kernel writes it after the
// first one has finished reading (stream order is the grid-wide barrier).
constexpr int kConvThreads = 128;
constexpr int kConvTile = 32;
constexpr int kConvMaxKernel = 8;

template <int K>
__global__ void __launch_bounds__(kConvThreads, 1)
    conv1d_silu_kernel(const float* __restrict__ mixed, float* __restrict__ window,
                       const float* __restrict__ weight, int64_t C, int n, bool write_window,
                       float* __restrict__ out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int t0 = static_cast<int>(blockIdx.y) * kConvTile;
  const int t1 = min(n, t0 + kConvTile);
  float taps[K];
  // hist[j] = input at time t - (K-1) + j for the token t about to be computed.
  float hist[K - 1];
  // The taps and the carried window do not come from the kernels just before (the window was
  // last written by this op's previous call): read them before the wait, the inputs after.
  if (c < C) {
#pragma unroll
    for (int j = 0; j < K; ++j) taps[j] = weight[c * K + j];
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
      const int u = t0 - (K - 1) + j;
      if (u < 0) hist[j] = window[static_cast<int64_t>(K - 1 + u) * C + c];
    }
  }
  grid_dependency_wait();
  if (c >= C) return;
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    const int u = t0 - (K - 1) + j;
    if (u >= 0) hist[j] = mixed[static_cast<int64_t>(u) * C + c];
  }
#pragma unroll 4
  for (int t = t0; t < t1; ++t) {
    const float x = mixed[static_cast<int64_t>(t) * C + c];
    float acc = 0.0f;  // the CPU's order: tap 0 (oldest) first
#pragma unroll
    for (int j = 0; j < K - 1; ++j) acc += taps[j] * hist[j];
    acc += taps[K - 1] * x;
    out[static_cast<int64_t>(t) * C + c] = silu_cpu(acc);
#pragma unroll
    for (int j = 0; j < K - 2; ++j) hist[j] = hist[j + 1];
    hist[K - 2] = x;
  }
  // After the last token hist holds the last K-1 inputs of window ++ mixed (also when n < K-1).
  if (write_window) {
#pragma unroll
    for (int j = 0; j < K - 1; ++j) window[static_cast<int64_t>(j) * C + c] = hist[j];
  }
}

// Only for n > kConvTile (>= K-1): the new window row j is input n-(K-1)+j, all from mixed.
template <int K>
__global__ void __launch_bounds__(kConvThreads, 1)
    conv1d_window_kernel(const float* __restrict__ mixed, float* __restrict__ window, int64_t C,
                         int n) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  if (c >= C) return;
#pragma unroll
  for (int j = 0; j < K - 1; ++j)
    window[static_cast<int64_t>(j) * C + c] = mixed[static_cast<int64_t>(n - (K - 1) + j) * C + c];
}

template <int K>
void launch_conv(const float* mixed, float* window, const float* weight, int64_t C, int64_t n,
                 float* out, Stream s) {
  const auto tiles = static_cast<unsigned>((n + kConvTile - 1) / kConvTile);
  const auto col_blocks = static_cast<unsigned>((C + kConvThreads - 1) / kConvThreads);
  const bool single = tiles == 1;
  launch(conv1d_silu_kernel<K>, dim3(col_blocks, tiles), kConvThreads, 0, s, mixed, window,
         weight, C, static_cast<int>(n), single, out);
  if (!single) {
    launch_serial(conv1d_window_kernel<K>, col_blocks, kConvThreads, 0, s, mixed, window, C,
                  static_cast<int>(n));
  }
}

// ---- gated_delta_rule -----------------------------------------------------------------------
// Grid (value head h, group of CG value columns); block CG * L threads. The value columns of a
// head are independent given the token's q, k, beta and decay, so each column j runs the whole
// recurrence on its own: L = kLanesPerColumn (8) consecutive lanes own column j, lane g holding
// the Dk/L state rows i(r) = (r/4)*4L + 4g + r%4 of S[:, j] in registers (loaded once, stored
// once per launch, through a padded shared tile so that the global accesses are coalesced; the
// 4g + r%4 layout makes each lane's q/k rows float4 loads). A warp covers 32/L columns; the dot
// products over the Dk rows reduce over the L lanes with log2(L) xor-shuffles.
//
// Tokens are staged kChunk at a time, double-buffered in shared memory: while the warps run the
// recurrence over chunk c, cp.async brings chunk c+1's raw q, k (key head kh = h / (Hv/Hk)) and
// the block's v columns; then each warp L2-normalises the q/k vectors it loaded itself (warp
// sum; 1/sqrt(sum + 1e-6), q then times 1/sqrt(Dk), as the CPU) and one warp computes the gates
// (beta = sigmoid(b), alpha = exp(-exp(A_log) softplus(a + dt_bias))); one barrier per chunk.
// The normalisation is recomputed by every block of a key head (Hv/Hk * Dv/CG blocks): with a
// workspace (kWsGdn) a first kernel could do it once per token.
//
// Per token, column j, exactly the CPU's order: S = alpha S; m = S^T k (decayed state);
// delta = beta (v_j - m); S += k delta; o_j = S^T q (updated state).
constexpr int kChunk = 8;  // tokens per pipeline stage
// Lanes per value column. Measured on an H200 (Dk = Dv = 128, 32 heads): 8 lanes give decode
// 6.3 us and prefill n=4096 1.61 ms per call; 16 lanes (twice the warps) 7.8 us and 1.56 ms.
// Both are bound by the shared-memory/shuffle pipe: every column's lanes read the token's whole
// q and k (31 columns x 1 KB per SM per token) and reduce over shuffles.
constexpr int kLanesPerColumn = 8;

__device__ __forceinline__ void cp_async4(float* smem_dst, const float* gmem_src) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

template <int L>  // sum over the L lanes of a column (lane groups of L consecutive lanes)
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = 1; offset < L; offset <<= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <int Dk, int CG, int L>
__global__ void __launch_bounds__(CG * L, 1)
    gated_delta_rule_kernel(const float* __restrict__ conv, const float* __restrict__ a_in,
                            const float* __restrict__ b_in, const float* __restrict__ a_log,
                            const float* __restrict__ dt_bias, float* __restrict__ state, int Hk,
                            int Hv, int Dv, int n, float q_scale, float* __restrict__ out) {
  grid_dependency_wait();
  constexpr int kThreads = CG * L;
  constexpr int kWarps = kThreads / 32;
  constexpr int R = Dk / L;          // state rows per lane
  constexpr int kPerLane = Dk / 32;  // elements per lane of a q/k vector
  static_assert(Dk % 32 == 0 && R % 4 == 0 && 32 % L == 0 && CG % (32 / L) == 0,
                "unsupported Gated DeltaNet tile");

  __shared__ __align__(16) float q_s[2][kChunk][Dk];    // normalised, scaled q per token
  __shared__ __align__(16) float k_s[2][kChunk][Dk];    // normalised k
  __shared__ __align__(16) float raw_s[2][kChunk][Dk];  // [0] q, [1] k of the chunk in flight
  __shared__ float v_s[2][kChunk][CG];
  __shared__ float2 gate_s[2][kChunk];                  // (alpha, beta)
  __shared__ float tile[Dk][CG + 1];                    // odd row stride: no bank conflicts

  const int h = static_cast<int>(blockIdx.x);
  const int c0 = static_cast<int>(blockIdx.y) * CG;
  const int kh = h / (Hv / Hk);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane % L;                          // row group of this lane
  const int jl = warp * (32 / L) + lane / L;       // this lane's column in the block
  const int64_t C = 2LL * Hk * Dk + static_cast<int64_t>(Hv) * Dv;
  const float* q_src = conv + static_cast<int64_t>(kh) * Dk;
  const float* k_src = conv + static_cast<int64_t>(Hk) * Dk + static_cast<int64_t>(kh) * Dk;
  const float* v_src = conv + 2LL * Hk * Dk + static_cast<int64_t>(h) * Dv + c0;
  float* S = state + static_cast<int64_t>(h) * Dk * Dv + c0;
  const float decay_rate = expf(a_log[h]);
  const float bias = dt_bias[h];

  // Stage 1 of a chunk: asynchronous copies. Vector vi = 2 tt + (0: q, 1: k) belongs to warp
  // vi % kWarps, which later normalises it, so only a __syncwarp separates copy and use.
  float a_raw = 0.0f;
  float b_raw = 0.0f;
  auto issue = [&](int t0, int buf) {
    for (int vi = warp; vi < 2 * kChunk; vi += kWarps) {
      const int tt = vi >> 1;
      const int is_k = vi & 1;
      if (t0 + tt >= n) continue;
      const float* src = (is_k ? k_src : q_src) + static_cast<int64_t>(t0 + tt) * C;
#pragma unroll
      for (int m = 0; m < kPerLane; ++m) cp_async4(&raw_s[is_k][tt][lane + 32 * m], src + lane + 32 * m);
    }
    for (int e = tid; e < kChunk * CG; e += kThreads) {
      const int tt = e / CG;
      const int col = e % CG;
      if (t0 + tt < n) cp_async4(&v_s[buf][tt][col], v_src + static_cast<int64_t>(t0 + tt) * C + col);
    }
    cp_async_commit();
    if (warp == kWarps - 1 && lane < kChunk && t0 + lane < n) {
      a_raw = a_in[static_cast<int64_t>(t0 + lane) * Hv + h];
      b_raw = b_in[static_cast<int64_t>(t0 + lane) * Hv + h];
    }
  };
  // Stage 2: normalise the own q/k vectors into buffer buf, gates; the caller then syncs.
  auto finish = [&](int t0, int buf) {
    cp_async_wait_all();
    __syncwarp();
    for (int vi = warp; vi < 2 * kChunk; vi += kWarps) {
      const int tt = vi >> 1;
      const int is_k = vi & 1;
      if (t0 + tt >= n) continue;
      float x[kPerLane];
      float sum_sq = 0.0f;
#pragma unroll
      for (int m = 0; m < kPerLane; ++m) {
        x[m] = raw_s[is_k][tt][lane + 32 * m];
        sum_sq += x[m] * x[m];
      }
      sum_sq = warp_sum(sum_sq);
      const float inv = inv_l2_norm(sum_sq);
      float* dst = is_k ? k_s[buf][tt] : q_s[buf][tt];
#pragma unroll
      for (int m = 0; m < kPerLane; ++m) {
        float y = x[m] * inv;
        if (!is_k) y *= q_scale;
        dst[lane + 32 * m] = y;
      }
    }
    if (warp == kWarps - 1 && lane < kChunk && t0 + lane < n) {
      gate_s[buf][lane] = delta_gates(a_raw, b_raw, decay_rate, bias);
    }
  };

  issue(0, 0);  // the first chunk's copies overlap the state load
  for (int e = tid; e < Dk * CG; e += kThreads) {
    const int row = e / CG;
    const int col = e % CG;
    tile[row][col] = S[static_cast<int64_t>(row) * Dv + col];
  }
  __syncthreads();
  float s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = tile[(r >> 2) * 4 * L + 4 * g + (r & 3)][jl];
  finish(0, 0);
  __syncthreads();

  int buf = 0;
  auto step = [&](int t) {  // token t of the chunk in buffer buf
    const float4* k4 = reinterpret_cast<const float4*>(k_s[buf][t]);
    const float4* q4 = reinterpret_cast<const float4*>(q_s[buf][t]);
    float kk[R];
    float qq[R];
#pragma unroll
    for (int r4 = 0; r4 < R / 4; ++r4) {
      const float4 kx = k4[r4 * L + g];
      const float4 qx = q4[r4 * L + g];
      kk[4 * r4 + 0] = kx.x;
      kk[4 * r4 + 1] = kx.y;
      kk[4 * r4 + 2] = kx.z;
      kk[4 * r4 + 3] = kx.w;
      qq[4 * r4 + 0] = qx.x;
      qq[4 * r4 + 1] = qx.y;
      qq[4 * r4 + 2] = qx.z;
      qq[4 * r4 + 3] = qx.w;
    }
    const float2 gate = gate_s[buf][t];
    const float vj = v_s[buf][t][jl];
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < R; ++r) {
      s[r] *= gate.x;  // decay first: the retrieval reads the decayed state
      part[r & 3] = fmaf(s[r], kk[r], part[r & 3]);
    }
    const float kv = group_sum<L>((part[0] + part[1]) + (part[2] + part[3]));
    const float delta = gate.y * (vj - kv);
    float opart[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < R; ++r) {
      s[r] = fmaf(kk[r], delta, s[r]);
      opart[r & 3] = fmaf(s[r], qq[r], opart[r & 3]);
    }
    const float o = group_sum<L>((opart[0] + opart[1]) + (opart[2] + opart[3]));
    return o;
  };

  const int chunks = (n + kChunk - 1) / kChunk;
  for (int c = 0; c < chunks; ++c) {
    const int t0 = c * kChunk;
    const bool more = c + 1 < chunks;
    if (more) issue(t0 + kChunk, buf ^ 1);
    float* out_col = out + (static_cast<int64_t>(t0) * Hv + h) * Dv + c0 + jl;
    const int64_t out_stride = static_cast<int64_t>(Hv) * Dv;
    if (t0 + kChunk <= n) {
#pragma unroll
      for (int t = 0; t < kChunk; ++t) {
        const float o = step(t);
        if (g == 0) out_col[t * out_stride] = o;
      }
    } else {
      for (int t = 0; t < n - t0; ++t) {
        const float o = step(t);
        if (g == 0) out_col[t * out_stride] = o;
      }
    }
    if (more) finish(t0 + kChunk, buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }

  // The tile is not touched after the register load (behind a barrier): write back through it.
#pragma unroll
  for (int r = 0; r < R; ++r) tile[(r >> 2) * 4 * L + 4 * g + (r & 3)][jl] = s[r];
  __syncthreads();
  for (int e = tid; e < Dk * CG; e += kThreads) {
    const int row = e / CG;
    const int col = e % CG;
    S[static_cast<int64_t>(row) * Dv + col] = tile[row][col];
  }
}

template <int Dk, int CG, int L>
void launch_delta(const float* conv, const float* a, const float* b, const float* a_log,
                  const float* dt_bias, float* state, const DeltaNetShape& d, int64_t n,
                  float q_scale, float* out, Stream s) {
  const dim3 grid(static_cast<unsigned>(d.value_heads), static_cast<unsigned>(d.value_dim / CG));
  launch(gated_delta_rule_kernel<Dk, CG, L>, grid, CG * L, 0, s, conv, a, b, a_log, dt_bias, state,
         d.key_heads, d.value_heads, d.value_dim, static_cast<int>(n), q_scale, out);
}

// ---- gated_delta_rule, one token (decode) ------------------------------------------------------
// Grid (value head h, group of kDecodeCols value columns); one delta_rule_decode.cuh tile per
// block. The state only changes in this kernel, one launch per step, so it is loaded *before*
// grid_dependency_wait: under programmatic dependent launch the 2 MB per layer stream in while
// the projections and the conv still run, and what is left after the wait is the arithmetic.
template <int Dk, int K>
__global__ void __launch_bounds__(kDecodeThreads) gated_delta_decode_kernel(DeltaDecodeArgs args) {
  delta_decode_tile<Dk, K, false>(
      args, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
      [] { grid_dependency_wait(); }, [] { allow_dependent_launch(); });
}

// ---- the one-token delta rule with the gated RMSNorm after it ---------------------------------
// Why: the gated norm was a launch of its own in every Gated DeltaNet layer, a chain of its own
// (wait, read, warp sum, write) for 16 KB. Here the T = ceil(Dv / 32) tiles of a value head form
// one thread-block cluster: each tile puts its outputs in shared memory, and after a cluster
// barrier warp 0 of every tile reads the head's Dv outputs through distributed shared memory and
// forms the norm exactly as norm_warp_kernel<gated> does (lane l sums the squares of values
// l, l + 32, ... in that order, then the same warp_sum; (x * inv) * gain * silu(z)), so `normed`
// has the bits the two launches give. The tiles' grid is (Hv, T) with clusters of (1, T): a
// tile's rank in its cluster is its column group.
constexpr int kGatedNormMaxTiles = 8;  // the portable cluster size: value_dim <= 256

template <int Dk, int K>
__global__ void __launch_bounds__(kDecodeThreads)
    gated_delta_norm_decode_kernel(DeltaDecodeArgs args, DeltaGatedNorm norm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  __shared__ float4 tile_out[kDecodeCols / 4];  // this tile's outputs, [32] f32
  const int h = static_cast<int>(blockIdx.x);
  const int tile = static_cast<int>(blockIdx.y);
  const int Dv = args.value_dim;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const bool norms = threadIdx.x < 32;  // warp 0 forms the norm of the tile's columns
  const int col = tile * kDecodeCols + lane;
  const float gain = norms && col < Dv ? norm.gain[col] : 0.0f;  // a weight: before the wait
  const float4 o = delta_decode_tile<Dk, K, false>(
      args, h, tile,
      [] {
        grid_dependency_wait();
        // As the norms do: the output projection after this launch loads its weights while the
        // delta rule and the norm run. (After the arithmetic, as the plain delta kernel lets it
        // launch, it measured 1.1% slower: the projection's weights then came after the norm.)
        allow_dependent_launch();
      },
      [] {});
  if (threadIdx.x < kDecodeCols / 4) tile_out[threadIdx.x] = o;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every tile of the head has its outputs in shared memory
  if (norms) {
    const float* own = reinterpret_cast<const float*>(tile_out);
    float sum_sq = 0.0f;
    for (int c = 0; c < static_cast<int>(gridDim.y); ++c) {
      if (lane + kDecodeCols * c < Dv) {
        const float v = cluster.map_shared_rank(own, c)[lane];
        sum_sq = fmaf(v, v, sum_sq);
      }
    }
    const float inv = rms_scale(warp_sum(sum_sq), Dv, norm.eps);
    if (col < Dv) {
      float y = own[lane] * inv * gain;
      const float zi = norm.z[static_cast<int64_t>(h) * Dv + col];
      y *= zi * sigmoidf_(zi);  // silu as the CPU forms it: z * sigmoid(z)
      norm.out[static_cast<int64_t>(h) * Dv + col] = y;
    }
  }
  cluster.sync();  // no tile exits while another may still read its shared memory
#else
  (void)args;
  (void)norm;
  __trap();  // never launched: gated_delta_norm_built_for_device() is false for this code
#endif
}

// The one-token delta rule; with `norm` (the fused conv only, K > 0), the kernel that also forms
// the gated norm, its grid's column tiles of a value head as one cluster.
template <int Dk, int K = 0>
void launch_delta_decode(const float* conv, const float* a, const float* b, const float* a_log,
                         const float* dt_bias, float* state, const DeltaNetShape& d, float q_scale,
                         float* out, Stream s, const FusedConv& fused = FusedConv{},
                         const DeltaGatedNorm* norm = nullptr) {
  const dim3 grid(static_cast<unsigned>(d.value_heads),
                  static_cast<unsigned>((d.value_dim + kDecodeCols - 1) / kDecodeCols));
  const DeltaDecodeArgs args{conv, fused, a, b, a_log, dt_bias, state, d.key_heads,
                             d.value_heads, d.value_dim, q_scale, out};
  if constexpr (K > 0) {
    if (norm != nullptr) {
      return launch_cluster(gated_delta_norm_decode_kernel<Dk, K>, grid, dim3(1, grid.y, 1),
                            kDecodeThreads, 0, s, args, *norm);
    }
  }
  launch(gated_delta_decode_kernel<Dk, K>, grid, kDecodeThreads, 0, s, args);
}

// One token: the decode kernel above. A few tokens: 8 columns per block for more, smaller blocks
// over the SMs. Prefill:
// 32 columns per block (8 warps) so the per-block q/k normalisation is shared more widely.
template <int Dk>
void dispatch_delta(const float* conv, const float* a, const float* b, const float* a_log,
                    const float* dt_bias, float* state, const DeltaNetShape& d, int64_t n,
                    float q_scale, float* out, Stream s) {
  if (n == 1) {
    launch_delta_decode<Dk>(conv, a, b, a_log, dt_bias, state, d, q_scale, out, s);
  } else if (n > kChunk && d.value_dim % 32 == 0) {
    launch_delta<Dk, 32, kLanesPerColumn>(conv, a, b, a_log, dt_bias, state, d, n, q_scale, out, s);
  } else {
    launch_delta<Dk, 8, kLanesPerColumn>(conv, a, b, a_log, dt_bias, state, d, n, q_scale, out, s);
  }
}

}  // namespace

void conv1d_silu(const float* mixed, float* window, const float* weight, const DeltaNetShape& d,
                 int64_t n, float* out, Stream s) {
  const int64_t C = d.channels();
  if (n <= 0 || C <= 0) return;
  switch (d.conv_kernel) {
    case 2: return launch_conv<2>(mixed, window, weight, C, n, out, s);
    case 3: return launch_conv<3>(mixed, window, weight, C, n, out, s);
    case 4: return launch_conv<4>(mixed, window, weight, C, n, out, s);
    case 5: return launch_conv<5>(mixed, window, weight, C, n, out, s);
    case 6: return launch_conv<6>(mixed, window, weight, C, n, out, s);
    case 7: return launch_conv<7>(mixed, window, weight, C, n, out, s);
    case kConvMaxKernel: return launch_conv<kConvMaxKernel>(mixed, window, weight, C, n, out, s);
    default:
      throw std::invalid_argument("cuda::conv1d_silu: conv_kernel " + std::to_string(d.conv_kernel) +
                                  " unsupported (2..8)");
  }
}

namespace {
void check_delta_shape(const DeltaNetShape& d, const char* op) {
  if (d.key_heads <= 0 || d.value_heads % d.key_heads != 0 || d.value_dim <= 0 ||
      d.value_dim % 8 != 0) {
    throw std::invalid_argument(std::string("cuda::") + op +
                                ": value_dim must be a multiple of 8 and value_heads a multiple "
                                "of key_heads");
  }
}
float query_scale(const DeltaNetShape& d) {
  return 1.0f / std::sqrt(static_cast<float>(d.key_dim));  // as the CPU
}
}  // namespace

bool gated_delta_step_supports(const DeltaNetShape& d) {
  return d.conv_kernel == kFusedConvKernel &&
         (d.key_dim == 32 || d.key_dim == 64 || d.key_dim == 128);
}

bool gated_delta_norm_built_for_device() {
  cudaFuncAttributes attributes{};
  LILY_CUDA_CHECK(cudaFuncGetAttributes(&attributes,
                                        gated_delta_norm_decode_kernel<128, kFusedConvKernel>));
  return attributes.ptxVersion >= 90;  // 80: the JIT-compiled compute_80 PTX, no clusters
}

bool gated_delta_norm_supports(const DeltaNetShape& d) {
  return gated_delta_step_supports(d) && d.value_dim <= kGatedNormMaxTiles * kDecodeCols;
}

void gated_delta_step(const float* mixed, const float* window, const float* conv_weight,
                      const float* a, const float* b, const float* a_log, const float* dt_bias,
                      float* state, const DeltaNetShape& d, float* out, Stream s,
                      const DeltaGatedNorm* norm) {
  check_delta_shape(d, "gated_delta_step");
  if (!gated_delta_step_supports(d)) {
    throw std::invalid_argument("cuda::gated_delta_step: needs conv_kernel " +
                                std::to_string(kFusedConvKernel) +
                                " and key_dim 32, 64 or 128; got " + std::to_string(d.conv_kernel) +
                                " and " + std::to_string(d.key_dim));
  }
  const FusedConv fused{mixed, window, conv_weight};
  const float q_scale = query_scale(d);
  if (norm != nullptr && !gated_delta_norm_supports(d)) {
    throw std::invalid_argument("cuda::gated_delta_step: the gated norm inside needs value_dim <= " +
                                std::to_string(kGatedNormMaxTiles * kDecodeCols) + ", got " +
                                std::to_string(d.value_dim));
  }
  switch (d.key_dim) {
    case 32:
      return launch_delta_decode<32, kFusedConvKernel>(nullptr, a, b, a_log, dt_bias, state, d,
                                                       q_scale, out, s, fused, norm);
    case 64:
      return launch_delta_decode<64, kFusedConvKernel>(nullptr, a, b, a_log, dt_bias, state, d,
                                                       q_scale, out, s, fused, norm);
    default:
      return launch_delta_decode<128, kFusedConvKernel>(nullptr, a, b, a_log, dt_bias, state, d,
                                                        q_scale, out, s, fused, norm);
  }
}

void gated_delta_rule(const float* conv, const float* a, const float* b, const float* a_log,
                      const float* dt_bias, float* state, const DeltaNetShape& d, int64_t n,
                      float* out, Stream s) {
  if (n <= 0) return;
  check_delta_shape(d, "gated_delta_rule");
  const float q_scale = query_scale(d);
  switch (d.key_dim) {
    case 32: return dispatch_delta<32>(conv, a, b, a_log, dt_bias, state, d, n, q_scale, out, s);
    case 64: return dispatch_delta<64>(conv, a, b, a_log, dt_bias, state, d, n, q_scale, out, s);
    case 128: return dispatch_delta<128>(conv, a, b, a_log, dt_bias, state, d, n, q_scale, out, s);
    default:
      throw std::invalid_argument("cuda::gated_delta_rule: key_dim " + std::to_string(d.key_dim) +
                                  " unsupported (32, 64, 128)");
  }
}

}  // namespace lily::cuda

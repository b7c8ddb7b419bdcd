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
// The conv reads its window, and a one-token delta rule its state, before grid_dependency_wait
// (see the kernels): they must not have been written by the launch immediately before (the
// model always has other ops in between; the launch after next sees them).
// Every launch is graph-capturable: no allocation, no host synchronisation, no attribute calls.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace lily::cuda {

namespace {

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

__device__ __forceinline__ float silu_cpu(float x) { return x * sigmoidf_(x); }  // cpu::silu

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
    conv1d_window_kernel<K><<<col_blocks, kConvThreads, 0, s>>>(mixed, window, C, static_cast<int>(n));
    LILY_CUDA_LAUNCH_CHECK();
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

__device__ __forceinline__ float softplus_cpu(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The per-token gates of value head h, as the CPU forms them: alpha = exp(-exp(A_log)
// softplus(a + dt_bias)) (decay_rate = exp(A_log)), beta = sigmoid(b).
__device__ __forceinline__ float2 delta_gates(float a, float b, float decay_rate, float dt_bias) {
  return make_float2(expf(-decay_rate * softplus_cpu(a + dt_bias)), sigmoidf_(b));
}

// 1 / L2 norm of a q or k vector from its sum of squares, with the CPU's epsilon.
__device__ __forceinline__ float inv_l2_norm(float sum_sq) { return 1.0f / sqrtf(sum_sq + 1e-6f); }

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
// Grid (value head h, group of kDecodeCols value columns); 256 threads. Thread t owns the
// column quad cq = t % 8 (columns c0 + 4 cq .. + 3) of the state rows rg, rg + 32, ... < Dk,
// rg = t / 8, in registers (float4 loads: a warp reads 4 rows x 128 contiguous bytes).
// The state only changes in this kernel, one launch per step, so it is loaded *before*
// grid_dependency_wait: under programmatic dependent launch the 2 MB per layer stream in while
// the projections and the conv still run, and what is left after the wait is the arithmetic.
// The dot products over the Dk rows reduce over the 4 row groups of a warp (2 xor-shuffles)
// and then over the 8 warps through shared memory, in a fixed order.
// Same per-token order as the chunked kernel: S = alpha S; m = S^T k; delta = beta (v - m);
// S += k delta; o = S^T q.
constexpr int kDecodeCols = 32;
constexpr int kDecodeThreads = 256;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeRowGroups = kDecodeThreads / (kDecodeCols / 4);  // 32

// The conv fused in front (K > 0, gated_delta_step): the block forms the conv1d + SiLU of the
// channels it reads (its key head's q and k, its value columns' v) from `mixed`, the carried
// window and the taps, exactly as conv1d_silu_kernel does, into shared memory. Taps and window
// are read before the wait (the window only changes in a later launch: WindowShift on the
// output projection, once every block of this one has read it). K == 0: `conv` holds the conv
// output (gated_delta_rule).
struct FusedConv {
  const float* mixed = nullptr;   // [C] the projection of this token
  const float* window = nullptr;  // [K-1, C] the previous inputs, oldest first (read only)
  const float* weight = nullptr;  // [C, K] taps
};

// Conv + SiLU of one channel: taps[0..K-1], hist = the K-1 previous inputs, x = this token's.
template <int K>
__device__ __forceinline__ float conv_silu_one(const float (&taps)[K], const float (&hist)[K - 1],
                                               float x) {
  float acc = 0.0f;  // conv1d_silu_kernel's order: tap 0 (oldest) first
#pragma unroll
  for (int j = 0; j < K - 1; ++j) acc += taps[j] * hist[j];
  acc += taps[K - 1] * x;
  return silu_cpu(acc);
}

template <int Dk, int K>
__global__ void __launch_bounds__(kDecodeThreads)
    gated_delta_decode_kernel(const float* __restrict__ conv, FusedConv fused,
                              const float* __restrict__ a_in, const float* __restrict__ b_in,
                              const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                              float* __restrict__ state, int Hk, int Hv, int Dv, float q_scale,
                              float* __restrict__ out) {
  static_assert(Dk % kDecodeRowGroups == 0 && Dk <= 128, "unsupported key_dim");
  static_assert(2 * Dk <= kDecodeThreads, "one q/k channel per thread");
  constexpr int R = Dk / kDecodeRowGroups;  // state rows per thread
  constexpr int kPerLane = Dk / 32;         // q/k elements per lane for the norms
  __shared__ float4 red[kDecodeWarps][kDecodeCols / 4];
  // K > 0: the conv outputs this block reads: q | k of its key head, then its value columns.
  __shared__ float conv_s[K > 0 ? 2 * Dk + kDecodeCols : 1];

  const int h = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int cq = tid % (kDecodeCols / 4);
  const int rg = tid / (kDecodeCols / 4);
  const int c = static_cast<int>(blockIdx.y) * kDecodeCols + 4 * cq;  // first column of the quad
  const bool live = c < Dv;  // Dv % 4 == 0: a quad is all in or all out
  float4* S = reinterpret_cast<float4*>(state + static_cast<int64_t>(h) * Dk * Dv + c);
  const int64_t row_quads = Dv / 4;

  float4 s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = live ? S[(rg + kDecodeRowGroups * r) * row_quads] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const float decay_rate = expf(a_log[h]);
  const float bias = dt_bias[h];
  const int kh = h / (Hv / Hk);
  const float* q_src;  // [Dk] this key head's q, k; v_src: this thread's 4 value columns
  const float* k_src;
  const float* v_src;
  if constexpr (K > 0) {
    // Thread t < 2 Dk: q/k channel t of the key head; thread t < kDecodeCols also value
    // column blockIdx.y * kDecodeCols + t (when < Dv).
    const int64_t C = 2LL * Hk * Dk + static_cast<int64_t>(Hv) * Dv;
    const int v_col = static_cast<int>(blockIdx.y) * kDecodeCols + tid;
    const bool has_qk = tid < 2 * Dk;
    const bool has_v = tid < kDecodeCols && v_col < Dv;
    const int64_t qk_ch = tid < Dk ? static_cast<int64_t>(kh) * Dk + tid
                                    : static_cast<int64_t>(Hk) * Dk + static_cast<int64_t>(kh) * Dk + (tid - Dk);
    const int64_t v_ch = 2LL * Hk * Dk + static_cast<int64_t>(h) * Dv + v_col;
    float qk_taps[K], v_taps[K];
    float qk_hist[K - 1], v_hist[K - 1];
#pragma unroll
    for (int j = 0; j < K; ++j) {
      qk_taps[j] = has_qk ? fused.weight[qk_ch * K + j] : 0.0f;
      v_taps[j] = has_v ? fused.weight[v_ch * K + j] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
      qk_hist[j] = has_qk ? fused.window[j * C + qk_ch] : 0.0f;
      v_hist[j] = has_v ? fused.window[j * C + v_ch] : 0.0f;
    }
    grid_dependency_wait();
    if (has_qk) conv_s[tid] = conv_silu_one<K>(qk_taps, qk_hist, fused.mixed[qk_ch]);
    if (has_v) conv_s[2 * Dk + tid] = conv_silu_one<K>(v_taps, v_hist, fused.mixed[v_ch]);
    __syncthreads();
    q_src = conv_s;
    k_src = conv_s + Dk;
    v_src = conv_s + 2 * Dk + 4 * cq;
  } else {
    q_src = conv + static_cast<int64_t>(kh) * Dk;
    k_src = conv + static_cast<int64_t>(Hk) * Dk + static_cast<int64_t>(kh) * Dk;
    v_src = conv + 2LL * Hk * Dk + static_cast<int64_t>(h) * Dv + c;
    grid_dependency_wait();
  }

  // q and k of the key head, L2-normalised (every warp forms the norms itself).
  float qsq = 0.0f;
  float ksq = 0.0f;
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    const float qv = q_src[lane + 32 * m];
    const float kv = k_src[lane + 32 * m];
    qsq += qv * qv;
    ksq += kv * kv;
  }
  const float q_inv = inv_l2_norm(warp_sum(qsq));
  const float k_inv = inv_l2_norm(warp_sum(ksq));
  float qq[R];
  float kk[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = rg + kDecodeRowGroups * r;
    qq[r] = q_src[i] * q_inv * q_scale;  // as the CPU: normalised, then scaled
    kk[r] = k_src[i] * k_inv;
  }
  const float2 gates = delta_gates(a_in[h], b_in[h], decay_rate, bias);
  const float alpha = gates.x;
  const float beta = gates.y;

  // Sum over the block's row groups of one float4 per thread; every thread gets its quad's.
  const auto column_sum = [&](float4 v) {
#pragma unroll
    for (int offset = kDecodeCols / 4; offset < 32; offset *= 2) {
      v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
      v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
      v.z += __shfl_xor_sync(0xffffffffu, v.z, offset);
      v.w += __shfl_xor_sync(0xffffffffu, v.w, offset);
    }
    __syncthreads();  // red may still be read from the previous sum
    if (lane < kDecodeCols / 4) red[warp][lane] = v;
    __syncthreads();
    float4 total = red[0][cq];
#pragma unroll
    for (int w = 1; w < kDecodeWarps; ++w) {
      const float4 p = red[w][cq];
      total = make_float4(total.x + p.x, total.y + p.y, total.z + p.z, total.w + p.w);
    }
    return total;
  };

  float4 part = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = make_float4(s[r].x * alpha, s[r].y * alpha, s[r].z * alpha, s[r].w * alpha);
    part.x = fmaf(s[r].x, kk[r], part.x);
    part.y = fmaf(s[r].y, kk[r], part.y);
    part.z = fmaf(s[r].z, kk[r], part.z);
    part.w = fmaf(s[r].w, kk[r], part.w);
  }
  const float4 kv = column_sum(part);
  float4 delta = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (live) {
    delta = make_float4(beta * (v_src[0] - kv.x), beta * (v_src[1] - kv.y),
                        beta * (v_src[2] - kv.z), beta * (v_src[3] - kv.w));
  }
  float4 opart = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r].x = fmaf(kk[r], delta.x, s[r].x);
    s[r].y = fmaf(kk[r], delta.y, s[r].y);
    s[r].z = fmaf(kk[r], delta.z, s[r].z);
    s[r].w = fmaf(kk[r], delta.w, s[r].w);
    opart.x = fmaf(s[r].x, qq[r], opart.x);
    opart.y = fmaf(s[r].y, qq[r], opart.y);
    opart.z = fmaf(s[r].z, qq[r], opart.z);
    opart.w = fmaf(s[r].w, qq[r], opart.w);
  }
  const float4 o = column_sum(opart);
  allow_dependent_launch();
  if (!live) return;
#pragma unroll
  for (int r = 0; r < R; ++r) S[(rg + kDecodeRowGroups * r) * row_quads] = s[r];
  if (rg == 0) {
    float* o_col = out + static_cast<int64_t>(h) * Dv + c;
    o_col[0] = o.x;
    o_col[1] = o.y;
    o_col[2] = o.z;
    o_col[3] = o.w;
  }
}

template <int Dk, int K = 0>
void launch_delta_decode(const float* conv, const float* a, const float* b, const float* a_log,
                         const float* dt_bias, float* state, const DeltaNetShape& d, float q_scale,
                         float* out, Stream s, const FusedConv& fused = FusedConv{}) {
  const dim3 grid(static_cast<unsigned>(d.value_heads),
                  static_cast<unsigned>((d.value_dim + kDecodeCols - 1) / kDecodeCols));
  launch(gated_delta_decode_kernel<Dk, K>, grid, kDecodeThreads, 0, s, conv, fused, a, b, a_log,
         dt_bias, state, d.key_heads, d.value_heads, d.value_dim, q_scale, out);
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

void gated_delta_step(const float* mixed, const float* window, const float* conv_weight,
                      const float* a, const float* b, const float* a_log, const float* dt_bias,
                      float* state, const DeltaNetShape& d, float* out, Stream s) {
  check_delta_shape(d, "gated_delta_step");
  if (!gated_delta_step_supports(d)) {
    throw std::invalid_argument("cuda::gated_delta_step: needs conv_kernel " +
                                std::to_string(kFusedConvKernel) +
                                " and key_dim 32, 64 or 128; got " + std::to_string(d.conv_kernel) +
                                " and " + std::to_string(d.key_dim));
  }
  const FusedConv fused{mixed, window, conv_weight};
  const float q_scale = query_scale(d);
  switch (d.key_dim) {
    case 32:
      return launch_delta_decode<32, kFusedConvKernel>(nullptr, a, b, a_log, dt_bias, state, d,
                                                       q_scale, out, s, fused);
    case 64:
      return launch_delta_decode<64, kFusedConvKernel>(nullptr, a, b, a_log, dt_bias, state, d,
                                                       q_scale, out, s, fused);
    default:
      return launch_delta_decode<128, kFusedConvKernel>(nullptr, a, b, a_log, dt_bias, state, d,
                                                        q_scale, out, s, fused);
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

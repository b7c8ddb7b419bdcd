// The one-token gated delta rule on one (value head, 32 columns) tile of the state, shared by
// the op path's decode kernel (gated_delta_net.cu) and the kernel lab's persistent Gated
// DeltaNet kernel (tools/lab/delta_net_layer.cu), so that both give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace lily::cuda::delta_detail {

__device__ __forceinline__ float silu_cpu(float x) { return x * sigmoidf_(x); }  // cpu::silu

__device__ __forceinline__ float softplus_cpu(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The per-token gates of value head h, as the CPU forms them: alpha = exp(-exp(A_log)
// softplus(a + dt_bias)) (decay_rate = exp(A_log)), beta = sigmoid(b).
__device__ __forceinline__ float2 delta_gates(float a, float b, float decay_rate, float dt_bias) {
  return make_float2(expf(-decay_rate * softplus_cpu(a + dt_bias)), sigmoidf_(b));
}

// 1 / L2 norm of a q or k vector from its sum of squares, with the CPU's epsilon.
__device__ __forceinline__ float inv_l2_norm(float sum_sq) { return 1.0f / sqrtf(sum_sq + 1e-6f); }

// A tile is (value head h, group of kDecodeCols value columns), worked by 256 threads. Thread t
// owns the column quad cq = t % 8 (columns c0 + 4 cq .. + 3) of the state rows rg, rg + 32, ...
// < Dk, rg = t / 8, in registers (float4 loads: a warp reads 4 rows x 128 contiguous bytes).
// The dot products over the Dk rows reduce over the 4 row groups of a warp (2 xor-shuffles)
// and then over the 8 warps through shared memory, in a fixed order.
// Per token, the CPU's order: S = alpha S; m = S^T k; delta = beta (v - m); S += k delta;
// o = S^T q.
inline constexpr int kDecodeCols = 32;
inline constexpr int kDecodeThreads = 256;
inline constexpr int kDecodeWarps = kDecodeThreads / 32;
inline constexpr int kDecodeRowGroups = kDecodeThreads / (kDecodeCols / 4);  // 32

// The conv fused in front (K > 0): the block forms the conv1d + SiLU of the channels it reads
// (its key head's q and k, its value columns' v) from `mixed`, the carried window and the taps,
// exactly as conv1d_silu_kernel does, into shared memory. Taps and window are read before the
// wait: the window only changes after every tile has read it (the op path's WindowShift on the
// output projection; the lab's persistent kernel's shift after its second barrier). K == 0: `conv`
// holds the conv output.
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

// What a tile reads and writes (f32). C = 2 Hk Dk + Hv Dv channels.
struct DeltaDecodeArgs {
  const float* conv = nullptr;     // [C] the conv output (K == 0), else unused
  FusedConv fused;                 // K > 0
  const float* a = nullptr;        // [Hv]
  const float* b = nullptr;        // [Hv]
  const float* a_log = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  float* state = nullptr;          // [Hv, Dk, Dv] in/out, 16-byte aligned
  int key_heads = 0;
  int value_heads = 0;
  int value_dim = 0;
  float q_scale = 0.0f;
  float* out = nullptr;            // [Hv, Dv]
};

// Loads of what the previous phase produced: kCoherent (written by other blocks of the same
// launch) through L2, else through the read-only path (written by an earlier launch, as the op
// kernel's __restrict__ parameters were read).
template <bool kCoherent>
__device__ __forceinline__ float load_input(const float* p) {
  if constexpr (kCoherent) {
    return __ldcg(p);
  } else {
    return __ldg(p);
  }
}
// The same for the projection a conv reads: kCoherent through L2, else a plain load.
template <bool kCoherent>
__device__ __forceinline__ float load_conv_input(const float* p) {
  if constexpr (kCoherent) {
    return __ldcg(p);
  } else {
    return *p;
  }
}

// Tile (h, tile) of the delta rule for one token. Every thread of the 256-thread block calls
// it. Before wait() it reads only what the previous phase does not write (the state, the
// taps, the window, the per-head constants), so those loads overlap whatever wait() waits
// for; after_compute() runs once the arithmetic is done, before the stores. Returns the
// thread's quad of outputs (threads t < kDecodeCols / 4 hold the tile's columns 4t..4t+3; zero
// past value_dim), which it has also stored to p.out.
template <int Dk, int K, bool kCoherent, typename Wait, typename AfterCompute>
__device__ __forceinline__ float4 delta_decode_tile(const DeltaDecodeArgs p, int h, int tile,
                                                  Wait wait, AfterCompute after_compute) {
  static_assert(Dk % kDecodeRowGroups == 0 && Dk <= 128, "unsupported key_dim");
  static_assert(2 * Dk <= kDecodeThreads, "one q/k channel per thread");
  constexpr int R = Dk / kDecodeRowGroups;  // state rows per thread
  constexpr int kPerLane = Dk / 32;         // q/k elements per lane for the norms
  __shared__ float4 red[kDecodeWarps][kDecodeCols / 4];
  // K > 0: the conv outputs this block reads: q | k of its key head, then its value columns.
  __shared__ float conv_s[K > 0 ? 2 * Dk + kDecodeCols : 1];

  const int Hk = p.key_heads;
  const int Hv = p.value_heads;
  const int Dv = p.value_dim;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int cq = tid % (kDecodeCols / 4);
  const int rg = tid / (kDecodeCols / 4);
  const int c = tile * kDecodeCols + 4 * cq;  // first column of the quad
  const bool live = c < Dv;  // Dv % 4 == 0: a quad is all in or all out
  float4* S = reinterpret_cast<float4*>(p.state + static_cast<int64_t>(h) * Dk * Dv + c);
  const int64_t row_quads = Dv / 4;

  float4 s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = live ? S[(rg + kDecodeRowGroups * r) * row_quads] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const float decay_rate = expf(__ldg(p.a_log + h));  // weights: the read-only path
  const float bias = __ldg(p.dt_bias + h);
  const int kh = h / (Hv / Hk);
  const float* q_src;  // [Dk] this key head's q, k; v_src: this thread's 4 value columns
  const float* k_src;
  const float* v_src;
  if constexpr (K > 0) {
    // Thread t < 2 Dk: q/k channel t of the key head; thread t < kDecodeCols also value
    // column tile * kDecodeCols + t (when < Dv).
    const int64_t C = 2LL * Hk * Dk + static_cast<int64_t>(Hv) * Dv;
    const int v_col = tile * kDecodeCols + tid;
    const bool has_qk = tid < 2 * Dk;
    const bool has_v = tid < kDecodeCols && v_col < Dv;
    const int64_t qk_ch = tid < Dk ? static_cast<int64_t>(kh) * Dk + tid
                                    : static_cast<int64_t>(Hk) * Dk + static_cast<int64_t>(kh) * Dk + (tid - Dk);
    const int64_t v_ch = 2LL * Hk * Dk + static_cast<int64_t>(h) * Dv + v_col;
    float qk_taps[K], v_taps[K];
    float qk_hist[K - 1], v_hist[K - 1];
#pragma unroll
    for (int j = 0; j < K; ++j) {
      qk_taps[j] = has_qk ? p.fused.weight[qk_ch * K + j] : 0.0f;
      v_taps[j] = has_v ? p.fused.weight[v_ch * K + j] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
      qk_hist[j] = has_qk ? p.fused.window[j * C + qk_ch] : 0.0f;
      v_hist[j] = has_v ? p.fused.window[j * C + v_ch] : 0.0f;
    }
    wait();
    if (has_qk) conv_s[tid] = conv_silu_one<K>(qk_taps, qk_hist, load_conv_input<kCoherent>(p.fused.mixed + qk_ch));
    if (has_v) conv_s[2 * Dk + tid] = conv_silu_one<K>(v_taps, v_hist, load_conv_input<kCoherent>(p.fused.mixed + v_ch));
    __syncthreads();
    q_src = conv_s;
    k_src = conv_s + Dk;
    v_src = conv_s + 2 * Dk + 4 * cq;
  } else {
    static_assert(K > 0 || !kCoherent, "the conv output comes from an earlier launch");
    q_src = p.conv + static_cast<int64_t>(kh) * Dk;
    k_src = p.conv + static_cast<int64_t>(Hk) * Dk + static_cast<int64_t>(kh) * Dk;
    v_src = p.conv + 2LL * Hk * Dk + static_cast<int64_t>(h) * Dv + c;
    wait();
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
    qq[r] = q_src[i] * q_inv * p.q_scale;  // as the CPU: normalised, then scaled
    kk[r] = k_src[i] * k_inv;
  }
  const float2 gates = delta_gates(load_input<kCoherent>(p.a + h), load_input<kCoherent>(p.b + h),
                                   decay_rate, bias);
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
      const float4 q = red[w][cq];
      total = make_float4(total.x + q.x, total.y + q.y, total.z + q.z, total.w + q.w);
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
  after_compute();
  if (!live) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int r = 0; r < R; ++r) S[(rg + kDecodeRowGroups * r) * row_quads] = s[r];
  if (rg == 0) {
    float* o_col = p.out + static_cast<int64_t>(h) * Dv + c;
    o_col[0] = o.x;
    o_col[1] = o.y;
    o_col[2] = o.z;
    o_col[3] = o.w;
  }
  return o;
}

}  // namespace lily::cuda::delta_detail

// Gated full attention: q/k head norm + partial NeoX RoPE (attention_prepare), KV cache writes
// and causal softmax attention (split-K flash decoding for one token, tiled flash attention
// for a prefill chunk), all f32 arithmetic on CUDA cores over an f32 or bf16 KV cache.
//
// KV caches [capacity, kv_heads, head_dim], keys and values of one element type KV: float, or
// __nv_bfloat16 (half the bytes; written with round-to-nearest-even, widened exactly to f32
// when read, 16-byte loads of 8 values). Every kernel attends over the keys and values as the
// cache holds them, including the row the launch itself writes: a bf16 cache's decode step
// rounds the new token's k and v as it reads them, so prefill, decode and a reference over
// the bf16-rounded rows agree to f32 rounding.
//
// Supported: head_dim in {64, 128, 256}; rotary_dim even, <= head_dim and <= 256; any
// q_heads that is a multiple of kv_heads (query groups of 2, 4 or 8 share every K/V row read
// in decode; other group sizes run one query head per block). Positions: 0 <= pos and
// pos + n <= capacity (the backend validates the host position; a device position outside
// [0, capacity) writes nothing to the caches and NaN to the output).
//
// Numerics mirror the CPU backend (src/backend/cpu/attention.cpp): the RoPE angle is the f32
// product of an f32 inv_freq (formed on the host exactly as transformers / the reference do)
// and the f32 position, and its cos/sin are taken in double and rounded to f32; scores are
// (q . k) * (1/sqrt(D)) in f32, weights expf(s - max) (expf, not __expf), and the output is
// (sum p v) / (sum p) * sigmoid(gate).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_fp16.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/ptx.cuh"

namespace lily::cuda {

namespace {

constexpr float kNegInf = -INFINITY;

// exp(x - m) where m may be -inf (then every x is -inf too, and the weight is 0, not NaN).
__device__ __forceinline__ float exp_shifted(float x, float m) {
  return expf(x - (m == kNegInf ? 0.0f : m));
}

// ---- KV cache elements -------------------------------------------------------------------

template <typename KV>
constexpr bool kIsBf16 = std::is_same_v<KV, __nv_bfloat16>;
// int8 caches (int8_t codes) carry a scale per (token, kv head) row beside them; the rows are
// written by store_int8_rows_kernel before the attention kernel reads them, except a decode
// step's row in decode_tc_int8_kernel, which quantises it itself (int8_row_in_decode_kernel).
template <typename KV>
constexpr bool kIsInt8 = std::is_same_v<KV, int8_t>;

// Four int8 codes of a word (element 0 in the low byte), exactly as f32: the code + 128 as the
// low byte of 2^23's mantissa, minus 2^23 + 128.
__device__ __forceinline__ void int8x4_to_f32(uint32_t w, float (&f)[4]) {
  const uint32_t u = w ^ 0x80808080u;
#pragma unroll
  for (int j = 0; j < 4; ++j) f[j] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u + j)) - 8388736.0f;
}

// One warp quantises one cache row of 32 * kPer values, lane l holding values l * kPer ..
// (x), as quantize_kv_row (backend.h) does on the CPU, with the same f32 operations: max |x|,
// codes rint(x * (127 / max)) clamped to [-127, 127], scale max / 127; an all-zero row scale
// 0, a row with a non-finite value scale NaN, codes 0. Writes the lane's codes at codes + l *
// kPer and lane 0 the scale. Every lane of the warp must call it.
template <int kPer>
__device__ __forceinline__ void quantize_row_warp(const float (&x)[kPer], int lane, int8_t* codes, float* scale) {
  float m = 0.0f;
  bool finite = true;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    finite = finite && isfinite(x[i]);
    m = fmaxf(m, fabsf(x[i]));
  }
  m = warp_max(m);
  finite = __all_sync(0xffffffffu, finite);
  uint32_t words[(kPer + 3) / 4] = {};
  if (finite && m > 0.0f) {
    const float inv = __fdiv_rn(127.0f, m);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const float q = fminf(fmaxf(rintf(__fmul_rn(x[i], inv)), -127.0f), 127.0f);
      words[i / 4] |= (static_cast<uint32_t>(static_cast<int>(q)) & 0xffu) << (8 * (i % 4));
    }
  }
  int8_t* dst = codes + lane * kPer;
  if constexpr (kPer == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
  } else if constexpr (kPer == 4) {
    *reinterpret_cast<uint32_t*>(dst) = words[0];
  } else {
    static_assert(kPer == 2, "head_dim 64, 128 or 256");
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(words[0]);
  }
  if (lane == 0) *scale = finite ? (m > 0.0f ? __fdiv_rn(m, 127.0f) : 0.0f) : __int_as_float(0x7fc00000);
}

// x as a KV cache element (bf16: round-to-nearest-even).
template <typename KV>
__device__ __forceinline__ KV to_cache(float x) {
  if constexpr (kIsBf16<KV>) {
    return __float2bfloat16_rn(x);
  } else {
    return x;
  }
}

// The value x becomes once stored in a KV cache of KV (exact for f32, RNE bf16 otherwise).
template <typename KV>
__device__ __forceinline__ float as_cached(float x) {
  if constexpr (kIsBf16<KV>) {
    return __bfloat162float(__float2bfloat16_rn(x));
  } else {
    return x;
  }
}

// The two bf16 halves of a 32-bit word, widened (element 0 is the low half: little-endian).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Values one thread stages into shared memory per 16-byte load: 4 f32, 8 bf16 or 16 int8.
template <typename KV>
constexpr int kStageVec = kIsInt8<KV> ? 16 : (kIsBf16<KV> ? 8 : 4);

// kStageVec<KV> cache values at src (16-byte aligned) as f32 into dst (16-byte aligned).
// (int8: code * row_scale, the CPU's widening; the scale is ignored for the other types.)
template <typename KV>
__device__ __forceinline__ void stage_row_piece(const KV* src, float row_scale, float* dst) {
  if constexpr (kIsInt8<KV>) {
    const uint4 w = *reinterpret_cast<const uint4*>(src);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float f[4];
      int8x4_to_f32(words[i], f);
      reinterpret_cast<float4*>(dst)[i] = make_float4(f[0] * row_scale, f[1] * row_scale, f[2] * row_scale, f[3] * row_scale);
    }
  } else if constexpr (kIsBf16<KV>) {
    const uint4 w = *reinterpret_cast<const uint4*>(src);
    reinterpret_cast<float4*>(dst)[0] = make_float4(bf16_lo(w.x), bf16_hi(w.x), bf16_lo(w.y), bf16_hi(w.y));
    reinterpret_cast<float4*>(dst)[1] = make_float4(bf16_lo(w.z), bf16_hi(w.z), bf16_lo(w.w), bf16_hi(w.w));
  } else {
    *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src);
  }
}
template <typename KV>
__device__ __forceinline__ void stage_zero(float* dst) {
#pragma unroll
  for (int i = 0; i < kStageVec<KV> / 4; ++i) reinterpret_cast<float4*>(dst)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

__device__ __forceinline__ int64_t read_position(int64_t pos_host, const int32_t* pos_device) {
  return pos_device != nullptr ? static_cast<int64_t>(*pos_device) : pos_host;
}

// ============================== attention_prepare =======================================

constexpr int kMaxRotaryHalf = 128;
struct RopeFreqs {
  float inv_freq[kMaxRotaryHalf];
};

constexpr int kPrepareWarps = 8;

// One warp per (token, head): heads 0..q_heads-1 are the query halves of qg, then the k heads.
template <int D>
__global__ void __launch_bounds__(kPrepareWarps * 32)
    prepare_kernel(float* qg, float* k, const float* q_norm, const float* k_norm, int q_heads,
                   int kv_heads, int rotary_dim, RopeFreqs freqs, int64_t pos_host,
                   const int32_t* pos_device, int64_t n, float eps) {
  constexpr int kPer = D / 32;
  __shared__ float buf[kPrepareWarps][D];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int heads = q_heads + kv_heads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kPrepareWarps + warp;
  const bool live = item < n * heads;
  const int64_t t = item / heads;
  const int h = static_cast<int>(item % heads);
  const bool is_q = h < q_heads;
  // The norm's gain is a weight: read before the wait (norms.cu does the same).
  float g[kPer];
  const float* gain = is_q ? q_norm : k_norm;
#pragma unroll
  for (int c = 0; c < kPer; ++c) g[c] = live ? gain[lane + 32 * c] : 0.0f;
  grid_dependency_wait();
  // A few blocks of latency: the split kernel's blocks may land while they run (as the norms,
  // norms.cu). After the wait, so that the split kernel may still read what came before.
  allow_dependent_launch();
  if (!live) return;
  float* x = is_q ? qg + (t * q_heads + h) * 2 * D : k + (t * kv_heads + (h - q_heads)) * D;

  float v[kPer];
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    v[c] = x[lane + 32 * c];
    sum_sq = fmaf(v[c], v[c], sum_sq);
  }
  const float inv = 1.0f / sqrtf(warp_sum(sum_sq) / static_cast<float>(D) + eps);
  float* s = buf[warp];
#pragma unroll
  for (int c = 0; c < kPer; ++c) s[lane + 32 * c] = v[c] * inv * g[c];
  __syncwarp();

  const int64_t position = read_position(pos_host, pos_device) + t;
  const float fpos = static_cast<float>(position);
  const int half = rotary_dim / 2;
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    const int e = lane + 32 * c;
    float o = s[e];
    if (e < rotary_dim) {
      const int i = e < half ? e : e - half;
      const float angle = __fmul_rn(freqs.inv_freq[i], fpos);  // the f32 product, never fused
      double sd, cd;
      sincos(static_cast<double>(angle), &sd, &cd);
      const float cs = static_cast<float>(cd);
      const float sn = static_cast<float>(sd);
      o = e < half ? s[e] * cs - s[e + half] * sn : s[e] * cs + s[i] * sn;
    }
    x[e] = o;
  }
}

// ============================== decode (n == 1) =========================================

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeMaxSplits = 128;  // per unit (kv head or query head)
constexpr int kDecodeMinKeys = 32;     // fewest keys a split takes
constexpr int kDecodeTile = 4;         // keys a warp scores at once

// Keys per split for `keys` keys over `splits` splits; the device and the combine agree.
__device__ __forceinline__ int64_t keys_per_split(int64_t keys, int splits) {
  const int64_t even = (keys + splits - 1) / splits;
  return even > kDecodeMinKeys ? even : kDecodeMinKeys;
}

// The key range [begin, end) of decode split `split` when the new token sits at position P
// (keys 0..P); false when the position is outside the cache or the split is empty (the
// combine never reads an empty split's partial).
struct DecodeSplit {
  int64_t P = 0, begin = 0, end = 0;
};
__device__ __forceinline__ bool decode_split_range(int64_t pos_host, const int32_t* pos_device,
                                                   int64_t capacity, int split, int splits,
                                                   DecodeSplit& r) {
  r.P = read_position(pos_host, pos_device);
  if (r.P < 0 || r.P >= capacity) return false;
  const int64_t keys = r.P + 1;
  const int64_t kps = keys_per_split(keys, splits);
  r.begin = static_cast<int64_t>(split) * kps;
  if (r.begin >= keys) return false;
  r.end = r.begin + kps < keys ? r.begin + kps : keys;
  return true;
}

// The lane's share of a D-vector: kVec contiguous values at c * 32 * kVec + lane * kVec, so
// that one load per chunk reads 16 bytes of a cache row (4 f32 or 8 bf16) where D allows.
// Queries, keys, values and the accumulators all use the cache type's layout.
template <int D, typename KV>
struct LaneSlice {
  static constexpr int kPer = D / 32;
  static constexpr int kMaxVec = (kIsBf16<KV> || kIsInt8<KV>) ? 8 : 4;
  static constexpr int kVec = kPer >= kMaxVec ? kMaxVec : kPer;
  static constexpr int kChunks = kPer / kVec;
  __device__ static int index(int lane, int c, int w) { return c * 32 * kVec + lane * kVec + w; }
  // kVec f32 values (queries, the new token's k/v).
  __device__ static void load(const float* p, int lane, float (&dst)[kPer]) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const float* at = p + c * 32 * kVec + lane * kVec;
      if constexpr (kVec >= 4) {
#pragma unroll
        for (int h = 0; h < kVec / 4; ++h) {
          const float4 q = reinterpret_cast<const float4*>(at)[h];
          dst[c * kVec + 4 * h + 0] = q.x;
          dst[c * kVec + 4 * h + 1] = q.y;
          dst[c * kVec + 4 * h + 2] = q.z;
          dst[c * kVec + 4 * h + 3] = q.w;
        }
      } else if constexpr (kVec == 2) {
        const float2 q = *reinterpret_cast<const float2*>(at);
        dst[c * 2 + 0] = q.x;
        dst[c * 2 + 1] = q.y;
      } else {
        dst[c] = *at;
      }
    }
  }
  // A cache row's share, widened to f32 (bf16: 8, 4 or 2 values per load for D 256, 128, 64;
  // int8: as many codes, times the row's scale).
  __device__ static void load_cached(const KV* p, float row_scale, int lane, float (&dst)[kPer]) {
    if constexpr (kIsInt8<KV>) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const KV* at = p + c * 32 * kVec + lane * kVec;
        uint32_t words[2] = {0u, 0u};
        if constexpr (kVec == 8) {
          const uint2 w = *reinterpret_cast<const uint2*>(at);
          words[0] = w.x;
          words[1] = w.y;
        } else if constexpr (kVec == 4) {
          words[0] = *reinterpret_cast<const uint32_t*>(at);
        } else {
          static_assert(kVec == 2, "head_dim 64, 128 or 256");
          words[0] = *reinterpret_cast<const uint16_t*>(at);
        }
#pragma unroll
        for (int h = 0; h < (kVec + 3) / 4; ++h) {
          float f[4];
          int8x4_to_f32(words[h], f);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (4 * h + i < kVec) dst[c * kVec + 4 * h + i] = f[i] * row_scale;
          }
        }
      }
    } else if constexpr (kIsBf16<KV>) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const KV* at = p + c * 32 * kVec + lane * kVec;
        if constexpr (kVec == 8) {
          const uint4 w = *reinterpret_cast<const uint4*>(at);
          const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            dst[c * 8 + 2 * i] = bf16_lo(words[i]);
            dst[c * 8 + 2 * i + 1] = bf16_hi(words[i]);
          }
        } else if constexpr (kVec == 4) {
          const uint2 w = *reinterpret_cast<const uint2*>(at);
          dst[c * 4 + 0] = bf16_lo(w.x);
          dst[c * 4 + 1] = bf16_hi(w.x);
          dst[c * 4 + 2] = bf16_lo(w.y);
          dst[c * 4 + 3] = bf16_hi(w.y);
        } else {
          static_assert(kVec == 2, "head_dim 64, 128 or 256");
          const uint32_t w = *reinterpret_cast<const uint32_t*>(at);
          dst[c * 2 + 0] = bf16_lo(w);
          dst[c * 2 + 1] = bf16_hi(w);
        }
      }
    } else {
      load(p, lane, dst);
    }
  }
  // The new token's k or v (f32, not yet in the cache) as the cache will hold it.
  __device__ static void load_as_cached(const float* p, int lane, float (&dst)[kPer]) {
    load(p, lane, dst);
#pragma unroll
    for (int e = 0; e < kPer; ++e) dst[e] = as_cached<KV>(dst[e]);
  }
};

// Reduce-scatter of N partial sums (N a power of two <= 32) over the warp: on return, lane l
// holds the warp's total of value l >> (5 - log2 N) (every lane sharing those high bits holds
// the same total). Each halving step sends the half of the values this lane gives away and
// adds the partner's copy of the half it keeps, so N values cost N - 1 shuffles in all,
// where a warp_sum per value would cost 5 N.
__host__ __device__ constexpr int log2_of_pow2(int n) { return n <= 1 ? 0 : 1 + log2_of_pow2(n / 2); }

template <int N>
__device__ __forceinline__ float warp_reduce_scatter(float (&v)[N], int lane) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N: a power of two <= 32");
  constexpr int kSteps = log2_of_pow2(N);
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int half = N >> (step + 1);
    const bool upper = (lane & (16 >> step)) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      if (i >= half) break;
      const float send = upper ? v[i] : v[i + half];
      const float keep = upper ? v[i + half] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16 >> step);
    }
  }
  float total = v[0];
#pragma unroll
  for (int offset = 16 / N; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  return total;
}

// Grid (units, splits). A unit is a kv head with its G query heads (grouped) or, when G == 1,
// one query head (unit = query head, kv head = unit / group). Each warp takes tiles of
// kDecodeTile keys (begin + (i * warps + warp) * kDecodeTile, ...) and runs an online softmax
// over them; the block then merges its warps into one partial (max, sum, unnormalised
// weighted value sum) per query head.
// Per tile, lane l holds dims LaneSlice(l) of the tile's K and V rows and of every query
// head. Its partial dots (tile key t, head g) are reduce-scattered so that lane l owns the
// score of value n = l >> kShift, n = t * G + g; that lane forms p = exp(s - m) for its
// (t, g), and the p's are then broadcast for the value sum. Against one warp_sum per key and
// head this is about 2.5x fewer instructions per key, which at long contexts is the
// difference between issue-bound and bandwidth-bound.
// The cache row P (this token) is read from k/v directly (rounded as the cache stores it), and
// written to the caches by the block whose range holds it, so no block reads a row another
// block of this launch writes.
template <int D, int G, typename KV>
__global__ void __launch_bounds__(kDecodeThreads, 2)
    decode_split_kernel(const float* qg, const float* k, const float* v, KV* k_cache,
                        KV* v_cache, const float* k_scales, const float* v_scales,
                        int64_t capacity, int q_heads, int kv_heads, int group,
                        int64_t pos_host, const int32_t* pos_device, int splits, float scale,
                        float* part_o, float* part_ml) {
  grid_dependency_wait();
  using Slice = LaneSlice<D, KV>;
  constexpr int kPer = Slice::kPer;
  constexpr int T = kDecodeTile;
  constexpr int N = T * G;  // scores per tile
  constexpr int kShift = 5 - log2_of_pow2(N);  // lane l holds score l >> kShift
  __shared__ float s_m[kDecodeWarps][G];
  __shared__ float s_l[kDecodeWarps][G];
  __shared__ __align__(16) float s_acc[G][D];

  DecodeSplit range;
  const int split = blockIdx.y;
  if (!decode_split_range(pos_host, pos_device, capacity, split, splits, range)) return;
  const int64_t P = range.P, begin = range.begin, end = range.end;

  const int unit = blockIdx.x;
  const int kvh = G > 1 ? unit : unit / group;
  const int q0 = G > 1 ? unit * G : unit;
  const int64_t row = static_cast<int64_t>(kv_heads) * D;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;

  if constexpr (!kIsInt8<KV>) {  // an int8 row P is already in the cache
    if (begin <= P && P < end && (G > 1 || unit % group == 0)) {
      for (int i = threadIdx.x; i < D; i += kDecodeThreads) {
        k_cache[P * row + kvh * D + i] = to_cache<KV>(k[kvh * D + i]);
        v_cache[P * row + kvh * D + i] = to_cache<KV>(v[kvh * D + i]);
      }
    }
  }

  float q[G][kPer];
#pragma unroll
  for (int g = 0; g < G; ++g) Slice::load(qg + static_cast<int64_t>(q0 + g) * 2 * D, lane, q[g]);

  // This lane's score slot (tile key t_own, head g_own); m_own and l_own are head g_own's
  // running max and sum (equal on every lane of that head).
  const int n_own = lane >> kShift;
  const int t_own = n_own / G;
  float m_own = kNegInf;
  float l_own = 0.0f;
  float acc[G][kPer];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[g][e] = 0.0f;
  }

  for (int64_t j0 = begin + warp * T; j0 < end; j0 += kDecodeWarps * T) {
    float kt[T][kPer], vt[T][kPer];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const int64_t j = j0 + t;
      if (j < end) {
        if constexpr (kIsInt8<KV>) {
          const int64_t r = j * kv_heads + kvh;  // (token, kv head) row of the scales
          Slice::load_cached(k_cache + j * row + kvh * D, k_scales[r], lane, kt[t]);
          Slice::load_cached(v_cache + j * row + kvh * D, v_scales[r], lane, vt[t]);
        } else if (j == P) {
          Slice::load_as_cached(k + kvh * D, lane, kt[t]);
          Slice::load_as_cached(v + kvh * D, lane, vt[t]);
        } else {
          Slice::load_cached(k_cache + j * row + kvh * D, 0.0f, lane, kt[t]);
          Slice::load_cached(v_cache + j * row + kvh * D, 0.0f, lane, vt[t]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < kPer; ++e) kt[t][e] = vt[t][e] = 0.0f;
      }
    }
    float dots[N];
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < kPer; ++e) d = fmaf(q[g][e], kt[t][e], d);
        dots[t * G + g] = d;
      }
    }
    const float total = warp_reduce_scatter<N>(dots, lane);  // every lane: it shuffles
    const float s = j0 + t_own < end ? total * scale : kNegInf;
    // The tile's max for head g_own: over the lanes of the same head (the t bits of n).
    float tile_max = s;
#pragma unroll
    for (int offset = G << kShift; offset < 32; offset *= 2) {
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
    }
    const float m_new = fmaxf(m_own, tile_max);
    const float corr = exp_shifted(m_own, m_new);
    const float p = exp_shifted(s, m_new);
    float p_sum = p;
#pragma unroll
    for (int offset = G << kShift; offset < 32; offset *= 2) {
      p_sum += __shfl_xor_sync(0xffffffffu, p_sum, offset);
    }
    l_own = fmaf(l_own, corr, p_sum);
    m_own = m_new;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float c = __shfl_sync(0xffffffffu, corr, g << kShift);  // tile key 0's lane of head g
#pragma unroll
      for (int e = 0; e < kPer; ++e) acc[g][e] *= c;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float pt = __shfl_sync(0xffffffffu, p, (t * G + g) << kShift);
#pragma unroll
        for (int e = 0; e < kPer; ++e) acc[g][e] = fmaf(pt, vt[t][e], acc[g][e]);
      }
    }
  }

  // Every head's running max and sum, from that head's lanes.
  float m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = __shfl_sync(0xffffffffu, m_own, g << kShift);
    l[g] = __shfl_sync(0xffffffffu, l_own, g << kShift);
  }

  // Merge the warps: common max, rescaled sums, then the value sums added warp by warp
  // (fixed order: deterministic).
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l[g];
    }
  }
  __syncthreads();
  float block_m[G], block_l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float mx = kNegInf;
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, s_m[w][g]);
    float sum = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float mw = s_m[w][g];
      sum += mw == kNegInf ? 0.0f : s_l[w][g] * expf(mw - mx);
    }
    block_m[g] = mx;
    block_l[g] = sum;
    const float f = m[g] == kNegInf ? 0.0f : expf(m[g] - mx);
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[g][e] *= f;
  }
  for (int w = 0; w < kDecodeWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int c = 0; c < Slice::kChunks; ++c) {
#pragma unroll
          for (int x = 0; x < Slice::kVec; ++x) {
            const int idx = Slice::index(lane, c, x);
            const float val = acc[g][c * Slice::kVec + x];
            s_acc[g][idx] = w == 0 ? val : s_acc[g][idx] + val;
          }
        }
      }
    }
    __syncthreads();
  }
  // Partial layout: o [units, splits, G, D]; ml [units, splits, G, 2].
  const int64_t base = (static_cast<int64_t>(unit) * splits + split) * G;
  for (int i = threadIdx.x; i < G * D; i += kDecodeThreads) part_o[base * D + i] = (&s_acc[0][0])[i];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      part_ml[(base + g) * 2 + 0] = block_m[g];
      part_ml[(base + g) * 2 + 1] = block_l[g];
    }
  }
}

// The partials query head h's combine merges: how many splits hold keys (0 when the position
// is outside the cache: the output is NaN then) and the index of split sp's partial,
// o [units, splits, G, D] and ml [units, splits, G, 2] (decode_split_kernel's layout).
struct CombineRange {
  int valid, splits, G, unit, g;
  __device__ __forceinline__ int64_t at(int sp) const {
    return (static_cast<int64_t>(unit) * splits + sp) * G + g;
  }
};
__device__ __forceinline__ CombineRange combine_range(int64_t capacity, int G, int64_t pos_host,
                                                      const int32_t* pos_device, int splits,
                                                      int h) {
  CombineRange r{0, splits, G, h / G, h % G};
  const int64_t P = read_position(pos_host, pos_device);
  if (P < 0 || P >= capacity) return r;
  const int64_t keys = P + 1;
  const int64_t kps = keys_per_split(keys, splits);
  r.valid = static_cast<int>((keys + kps - 1) / kps);
  return r;
}

// The split combine: one block per query head, one thread per dim. It merges the valid
// splits, normalises and applies sigmoid(gate). Its arithmetic is a fixed sequence per dim
// (max over the splits, weights w = exp(m - max), total = sum w * l and acc = sum w * o, both
// in split order), so the result does not depend on timing or on the grid. What it must not
// do is walk the splits with one load in flight at a time: at 128 splits that took 11.7 us a
// layer (the int8 cache at 131,072 keys, tools/lab/attention_lab.cu on an H100), about one L2
// round trip a split. So the splits' (m, l) pairs are loaded by as many threads as there are
// splits, and each thread keeps kCombineBatch value partials in flight, the first batch issued
// right after the wait, before the weights are known.
constexpr int kCombineMaxSplits = 512;  // shared memory for the weights: 4 KB
constexpr int kCombineBatch = 16;       // value partials in flight per thread
static_assert(kDecodeMaxSplits <= kCombineMaxSplits, "the combine holds every split's weight");

template <int D>
__global__ void __launch_bounds__(D)
    decode_combine_kernel(const float* qg, int64_t capacity, int G, int64_t pos_host,
                          const int32_t* pos_device, int splits, const float* part_o,
                          const float* part_ml, float* out) {
  static_assert(D % 32 == 0 && D <= 1024, "one thread per dim, whole warps");
  __shared__ float w_s[kCombineMaxSplits];  // m, then the weight exp(m - max), per split
  __shared__ float l_s[kCombineMaxSplits];  // the split's sum of exp
  __shared__ float warp_max[D / 32];
  const int h = blockIdx.x;
  const int d = threadIdx.x;
  // The gate comes from q/k norm + RoPE, two launches back: the split kernel waited for it
  // before it let this launch start, so it may be read before the wait.
  const float gate = qg[(static_cast<int64_t>(h) * 2 + 1) * D + d];
  grid_dependency_wait();
  // One block a head: the output projection's blocks load their weights while it runs.
  allow_dependent_launch();
  float* o = out + static_cast<int64_t>(h) * D;
  const CombineRange r = combine_range(capacity, G, pos_host, pos_device, splits, h);
  if (r.valid == 0) {
    o[d] = NAN;
    return;
  }
  const int valid = r.valid;
  auto at = [&](int sp) { return r.at(sp); };
  float batch[kCombineBatch];
#pragma unroll
  for (int i = 0; i < kCombineBatch; ++i) batch[i] = i < valid ? part_o[at(i) * D + d] : 0.0f;
  float m_own = kNegInf;
  for (int sp = d; sp < valid; sp += D) {
    const float m = part_ml[at(sp) * 2];
    w_s[sp] = m;
    l_s[sp] = part_ml[at(sp) * 2 + 1];
    m_own = fmaxf(m_own, m);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    m_own = fmaxf(m_own, __shfl_xor_sync(0xffffffffu, m_own, off));
  if (d % 32 == 0) warp_max[d / 32] = m_own;
  __syncthreads();
  float mx = warp_max[0];  // a max is exact in any order
#pragma unroll
  for (int w = 1; w < D / 32; ++w) mx = fmaxf(mx, warp_max[w]);
  for (int sp = d; sp < valid; sp += D) {
    const float ms = w_s[sp];
    w_s[sp] = ms == kNegInf ? 0.0f : expf(ms - mx);
  }
  __syncthreads();
  float total = 0.0f;
  for (int sp = 0; sp < valid; ++sp) total += w_s[sp] * l_s[sp];
  float acc = 0.0f;
  for (int base = 0; base < valid; base += kCombineBatch) {
    float next[kCombineBatch];
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i) {
      const int sp = base + kCombineBatch + i;
      next[i] = sp < valid ? part_o[at(sp) * D + d] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i) {
      if (base + i < valid) acc += w_s[base + i] * batch[i];
    }
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i) batch[i] = next[i];
  }
  o[d] = acc / total * sigmoidf_(gate);
}

// ============================== decode on tensor cores (bf16 cache) =====================
// For the model's shape (head_dim 256, query groups of 8) over a bf16 cache: the same split-K
// partials as decode_split_kernel, but both products on mma.sync m16n8k16 (bf16 x bf16 -> f32).
// At long contexts the CUDA-core kernel is bound by instruction issue once the cache is bf16
// (every key costs each lane 64 FMAs per product plus the widening); here a 16-key tile costs a
// warp 64 MMAs.
//
// Exactness: the keys and values are bf16 already (exact MMA inputs). The queries and the
// softmax weights are not, so each is split into two bf16 terms, x = hi + lo (hi = bf16(x),
// lo = bf16(x - hi): together ~2^-17 relative), and the two terms fill the two halves of the
// MMA's 16 rows: rows 0-7 are the 8 query heads' hi terms, rows 8-15 their lo terms. A thread's
// accumulator fragment holds row g and row g + 8, so it adds the halves itself. Scores are
// (sum of the halves) * scale, weights expf(s - max) as in the CUDA-core kernel; results match
// it to f32 rounding, not bit for bit (the MMA's summation order is its own).
//
// Fragments (thread (g, t) = (lane / 4, lane % 4); PTX ISA, "mma.m16n8k16" for .bf16):
//   S = Q K^T per tile: M = 16 (q hi | q lo), N = 8 keys (two n-tiles: keys 0-7, 8-15), K = 256
//   dims in 16 k-steps. A dot product does not care in which order the dims are summed, so the
//   k index is permuted to make every B load one 16-byte read: in k-steps 2p and 2p + 1 thread t
//   holds dims 32p + 8t .. +7 of its key (key g of the n-tile), as b = (x, y) for step 2p and
//   (z, w) for step 2p + 1; the query fragments use the same permutation.
//   O += P V per tile: M = 16 (p hi | p lo), K = the tile's 16 keys (one k-step, natural order:
//   the score fragment of a thread, keys 2t, 2t+1, 8+2t, 9+2t of head g, is exactly the A
//   fragment it needs), N = 256 dims in 32 n-tiles. The output dims are permuted too: n-tile
//   8q + i, column n is dim 64q + 8n + i, so thread (g, t) reads 16 bytes of each of its keys'
//   rows (dims 64q + 8g .. +7) and packs pairs of keys with one byte permute per register.
// Staging: each warp streams its own tiles (keys begin + 16 (warp + 4i) ..) through a ring of
// kTcStages buffers with cp.async (rows past the split's end are zero-filled, their scores
// -inf), so no block-wide barrier runs in the main loop. Key rows are padded to 576 bytes and
// value rows to 528 so that the 16-byte fragment reads of a quarter warp hit distinct banks.
// The new row P: the block whose range holds it writes it to the cache before any staging
// (then reads it back like every other row), so no block reads a row another block writes.
constexpr int kTcD = 256;
constexpr int kTcG = 8;
constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcKeys = 16;                        // keys per tile: one k-step of P V
constexpr int kTcStages = 2;                       // tiles in flight per warp
constexpr int kTcKStride = kTcD * 2 + 64;          // bytes per staged key row
constexpr int kTcVStride = kTcD * 2 + 16;          // bytes per staged value row
constexpr int kTcStageBytes = kTcKeys * (kTcKStride + kTcVStride);
constexpr int kTcKSteps = kTcD / 16;               // 16 k-steps of Q K^T
constexpr int kTcQBytes = kTcKSteps * 32 * 16;     // query fragments: [k-step][lane] uint4
constexpr int kTcNTiles = kTcD / 8;                // 32 n-tiles of P V
constexpr size_t kTcSmemBytes =
    static_cast<size_t>(kTcWarps) * kTcStages * kTcStageBytes + kTcQBytes;
static_assert(static_cast<size_t>(kTcG) * kTcD * sizeof(float) <=
                  static_cast<size_t>(kTcWarps) * kTcStages * kTcStageBytes,
              "the block merge reuses the staging buffers");

// Whether the tensor-core decode kernel takes this shape and cache type.
template <int D, int G, typename KV>
constexpr bool kTensorCoreDecode = kIsBf16<KV> && D == kTcD && G == kTcG;

// Grid (kv_heads, splits), kTcThreads threads, kTcSmemBytes of dynamic shared memory. Partials
// as decode_split_kernel: o [kv_heads, splits, 8, 256], ml [kv_heads, splits, 8, 2].
// One tile's online softmax in a tensor-core decode kernel: s holds this thread's 4 scores of
// head g (-inf past the end); the tile's max over the head's 4 threads moves m_run, the
// weights p = exp(s - m) are returned, l_run (this thread's share of the sum) and the value
// sums acc are rescaled to the new max (acc only when some head's max moved: after the first
// tiles, rarely).
__device__ __forceinline__ void tc_online_softmax(const float (&s)[4], float& m_run, float& l_run,
                                                  float (&acc)[kTcNTiles][4], float (&p)[4]) {
  float tile_max = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  const float m_new = fmaxf(m_run, tile_max);
  const float corr = exp_shifted(m_run, m_new);
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = exp_shifted(s[i], m_new);
  l_run = fmaf(l_run, corr, (p[0] + p[1]) + (p[2] + p[3]));
  m_run = m_new;
  if (__any_sync(0xffffffffu, corr != 1.0f)) {
#pragma unroll
    for (int n = 0; n < kTcNTiles; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[n][c] *= corr;
    }
  }
}

// The end of a tensor-core decode block (decode_tc_kernel, decode_tc_int8_kernel): head g's
// running sum over its 4 threads, then the warps merged as decode_split_kernel does (common max,
// rescaled sums, value sums added warp by warp in a fixed order) into the split's partials
// o [kv_heads, splits, 8, 256], ml [kv_heads, splits, 8, 2]. The value sums are multiplied by
// `unit` (the int8 kernel's value-scale units; 1 for bf16). `merge` is the block's staging
// memory (8 x 256 floats), free once every warp is past its ring.
__device__ __forceinline__ void tc_merge_store(const float (&acc)[kTcNTiles][4], float m_run, float l_run,
                                               float unit, float (&s_m)[kTcWarps][kTcG],
                                               float (&s_l)[kTcWarps][kTcG], unsigned char* merge,
                                               int kvh, int split, int splits, float* part_o,
                                               float* part_ml) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  float l_head = l_run + __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_head += __shfl_xor_sync(0xffffffffu, l_head, 2);
  if (t == 0) {
    s_m[warp][g] = m_run;
    s_l[warp][g] = l_head;
  }
  __syncthreads();  // also: every warp is done with its ring, which now holds the merge
  float mx = kNegInf;
  for (int w = 0; w < kTcWarps; ++w) mx = fmaxf(mx, s_m[w][g]);
  const float f = m_run == kNegInf ? 0.0f : expf(m_run - mx) * unit;
  float* s_acc = reinterpret_cast<float*>(merge);  // [8][256]
  for (int w = 0; w < kTcWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int n = 0; n < kTcNTiles; ++n) {
        // n-tile 8q + i: columns 2t, 2t+1 are dims 64q + 16t + i and 64q + 16t + 8 + i.
        const int d0 = 64 * (n >> 3) + 16 * t + (n & 7);
        const float o0 = (acc[n][0] + acc[n][2]) * f;
        const float o1 = (acc[n][1] + acc[n][3]) * f;
        float* at = s_acc + g * kTcD;
        at[d0] = w == 0 ? o0 : at[d0] + o0;
        at[d0 + 8] = w == 0 ? o1 : at[d0 + 8] + o1;
      }
    }
    __syncthreads();
  }
  const int64_t base = (static_cast<int64_t>(kvh) * splits + split) * kTcG;
  for (int i = threadIdx.x; i < kTcG * kTcD; i += kTcThreads) part_o[base * kTcD + i] = s_acc[i];
  if (threadIdx.x < kTcG) {
    const int h = threadIdx.x;
    float m = kNegInf;
    for (int w = 0; w < kTcWarps; ++w) m = fmaxf(m, s_m[w][h]);
    float sum = 0.0f;
    for (int w = 0; w < kTcWarps; ++w) {
      const float mw = s_m[w][h];
      sum += mw == kNegInf ? 0.0f : s_l[w][h] * expf(mw - m);
    }
    part_ml[(base + h) * 2 + 0] = m;
    part_ml[(base + h) * 2 + 1] = sum;
  }
}

__global__ void __launch_bounds__(kTcThreads, 1)
    decode_tc_kernel(const float* qg, const float* k, const float* v, __nv_bfloat16* k_cache,
                     __nv_bfloat16* v_cache, int64_t capacity, int kv_heads, int64_t pos_host,
                     const int32_t* pos_device, int splits, float scale, float* part_o,
                     float* part_ml) {
  extern __shared__ __align__(16) unsigned char tc_smem[];
  __shared__ float s_m[kTcWarps][kTcG];
  __shared__ float s_l[kTcWarps][kTcG];
  grid_dependency_wait();
  DecodeSplit range;
  const int split = blockIdx.y;
  if (!decode_split_range(pos_host, pos_device, capacity, split, splits, range)) return;
  const int64_t P = range.P, begin = range.begin, end = range.end;
  const int kvh = blockIdx.x;
  const int64_t row = static_cast<int64_t>(kv_heads) * kTcD;  // cache elements per position
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;  // fragment row group: query head g (hi in row g, lo in row g + 8)
  const int t = lane & 3;

  if (begin <= P && P < end) {
    for (int i = threadIdx.x; i < kTcD; i += kTcThreads) {
      k_cache[P * row + kvh * kTcD + i] = to_cache<__nv_bfloat16>(k[kvh * kTcD + i]);
      v_cache[P * row + kvh * kTcD + i] = to_cache<__nv_bfloat16>(v[kvh * kTcD + i]);
    }
  }
  // Query fragments, [k-step][lane] (the permuted dims above), split hi | lo; warp w forms
  // k-steps w, w + 4, ...
  uint4* q_frag = reinterpret_cast<uint4*>(tc_smem + kTcWarps * kTcStages * kTcStageBytes);
  {
    const float* q = qg + static_cast<int64_t>(kvh * kTcG + g) * 2 * kTcD;
    for (int ks = warp; ks < kTcKSteps; ks += kTcWarps) {
      const int d = 32 * (ks >> 1) + 8 * t + 4 * (ks & 1);
      const float4 x = *reinterpret_cast<const float4*>(q + d);
      const float h0 = __bfloat162float(__float2bfloat16_rn(x.x));
      const float h1 = __bfloat162float(__float2bfloat16_rn(x.y));
      const float h2 = __bfloat162float(__float2bfloat16_rn(x.z));
      const float h3 = __bfloat162float(__float2bfloat16_rn(x.w));
      q_frag[ks * 32 + lane] = make_uint4(ptx::pack_bf16(h0, h1), ptx::pack_bf16(x.x - h0, x.y - h1),
                                          ptx::pack_bf16(h2, h3), ptx::pack_bf16(x.z - h2, x.w - h3));
    }
  }
  __threadfence_block();  // row P's stores before any thread stages it
  __syncthreads();

  const int64_t tiles = (end - begin + kTcKeys - 1) / kTcKeys;
  unsigned char* ring = tc_smem + warp * kTcStages * kTcStageBytes;
  const __nv_bfloat16* k_head = k_cache + kvh * kTcD;
  const __nv_bfloat16* v_head = v_cache + kvh * kTcD;
  // Stage the tile's 16 key rows and 16 value rows (32 chunks of 16 bytes each): one row per
  // warp instruction, rows at or past `end` zero-filled without a read.
  auto stage = [&](int64_t tile, int buffer) {
    unsigned char* kb = ring + buffer * kTcStageBytes;
    unsigned char* vb = kb + kTcKeys * kTcKStride;
    const int64_t first = begin + tile * kTcKeys;
#pragma unroll 4
    for (int r = 0; r < kTcKeys; ++r) {
      const int64_t j = first + r;
      const bool live = j < end;
      const int64_t at = (live ? j : begin) * row + lane * 8;
      ptx::cp_async16(ptx::smem_u32(kb + r * kTcKStride + lane * 16), k_head + at, live ? 16 : 0);
      ptx::cp_async16(ptx::smem_u32(vb + r * kTcVStride + lane * 16), v_head + at, live ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < kTcStages; ++s) {
    const int64_t tile = warp + static_cast<int64_t>(s) * kTcWarps;
    if (tile < tiles) stage(tile, s);
    ptx::cp_async_commit();  // empty groups too: the wait below counts groups
  }

  float m_run = kNegInf;  // head g's running max (equal on its 4 threads)
  float l_run = 0.0f;     // this thread's share of head g's running sum (its 4 keys a tile)
  float acc[kTcNTiles][4];
#pragma unroll
  for (int n = 0; n < kTcNTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  int buffer = 0;
  for (int64_t tile = warp; tile < tiles; tile += kTcWarps) {
    ptx::cp_async_wait<kTcStages - 1>();
    __syncwarp();
    const unsigned char* kb = ring + buffer * kTcStageBytes;
    const unsigned char* vb = kb + kTcKeys * kTcKStride;

    // S = Q K^T: n-tile 0 holds keys 0-7 (this thread loads key g), n-tile 1 keys 8-15.
    float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int p = 0; p < kTcKSteps / 2; ++p) {
      const uint4 k0 = *reinterpret_cast<const uint4*>(kb + g * kTcKStride + 64 * p + 16 * t);
      const uint4 k1 = *reinterpret_cast<const uint4*>(kb + (g + 8) * kTcKStride + 64 * p + 16 * t);
      const uint4 qa = q_frag[(2 * p) * 32 + lane];
      const uint4 qb = q_frag[(2 * p + 1) * 32 + lane];
      const uint32_t a0[4] = {qa.x, qa.y, qa.z, qa.w};
      const uint32_t a1[4] = {qb.x, qb.y, qb.z, qb.w};
      ptx::mma_bf16(sc[0], a0, k0.x, k0.y);
      ptx::mma_bf16(sc[1], a0, k1.x, k1.y);
      ptx::mma_bf16(sc[0], a1, k0.z, k0.w);
      ptx::mma_bf16(sc[1], a1, k1.z, k1.w);
    }
    // Head g's scores of keys 2t, 2t+1 (n-tile 0) and 8+2t, 9+2t (n-tile 1): hi row + lo row.
    // (Two accumulators per n-tile, for a dependent chain of 8 MMAs instead of 16, measured no
    // faster at 256: 425.0 tok/s either way.)
    const int64_t first = begin + tile * kTcKeys;
    float s[4] = {sc[0][0] + sc[0][2], sc[0][1] + sc[0][3], sc[1][0] + sc[1][2], sc[1][1] + sc[1][3]};
    const int key_of[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = first + key_of[i] < end ? s[i] * scale : kNegInf;
    float p[4];
    tc_online_softmax(s, m_run, l_run, acc, p);
    // P as hi | lo rows: a[0] row g keys 2t, 2t+1; a[1] row g+8; a[2], a[3] keys 8+2t, 9+2t.
    float ph[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) ph[i] = __bfloat162float(__float2bfloat16_rn(p[i]));
    const uint32_t pa[4] = {ptx::pack_bf16(ph[0], ph[1]), ptx::pack_bf16(p[0] - ph[0], p[1] - ph[1]),
                            ptx::pack_bf16(ph[2], ph[3]), ptx::pack_bf16(p[2] - ph[2], p[3] - ph[3])};
    // O += P V: this thread's B columns are dims 64q + 8g + i of keys 2t, 2t+1, 8+2t, 9+2t.
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = 128 * q + 16 * g;
      const uint4 r0 = *reinterpret_cast<const uint4*>(vb + (2 * t) * kTcVStride + col);
      const uint4 r1 = *reinterpret_cast<const uint4*>(vb + (2 * t + 1) * kTcVStride + col);
      const uint4 r2 = *reinterpret_cast<const uint4*>(vb + (2 * t + 8) * kTcVStride + col);
      const uint4 r3 = *reinterpret_cast<const uint4*>(vb + (2 * t + 9) * kTcVStride + col);
      const uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w};
      const uint32_t w1[4] = {r1.x, r1.y, r1.z, r1.w};
      const uint32_t w2[4] = {r2.x, r2.y, r2.z, r2.w};
      const uint32_t w3[4] = {r3.x, r3.y, r3.z, r3.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {  // dims 2w (low halves) and 2w + 1 (high halves)
        ptx::mma_bf16(acc[8 * q + 2 * w], pa, __byte_perm(w0[w], w1[w], 0x5410),
                      __byte_perm(w2[w], w3[w], 0x5410));
        ptx::mma_bf16(acc[8 * q + 2 * w + 1], pa, __byte_perm(w0[w], w1[w], 0x7632),
                      __byte_perm(w2[w], w3[w], 0x7632));
      }
    }
    __syncwarp();  // every lane's reads of this buffer before it is staged again
    const int64_t next = tile + static_cast<int64_t>(kTcStages) * kTcWarps;
    if (next < tiles) stage(next, buffer);
    ptx::cp_async_commit();
    buffer = buffer + 1 == kTcStages ? 0 : buffer + 1;
  }
  ptx::cp_async_wait_all();

  tc_merge_store(acc, m_run, l_run, 1.0f, s_m, s_l, tc_smem, kvh, split, splits, part_o, part_ml);
}

// ============================== decode on tensor cores, int8 cache =========================
// The model's shape (head_dim 256, 8 query heads per KV head) over an int8 cache, grid
// (kv_heads, splits), kT8Threads threads, one block an SM (decode_tc_splits). The cache rows
// are int8 codes with an f32 scale per (token, kv head) row; the new row P is quantised by the
// block whose split holds it (quantize_row_warp, as store_int8_rows_kernel writes the
// prefill's rows).
//   S = Q K^T on mma.sync m16n8k32 s8 x s8 -> s32, exact: the 16 rows are the 8 heads' query
//   codes in two planes, q = s_q (hi + lo / 256) with s_q = max |q| / 127 of the head (the
//   planes keep about 15 bits of q where bf16 hi + lo keeps 16); N = 8 keys per n-tile, K = 256
//   dims in 8 k-steps of 32, the dims permuted as in decode_tc_kernel so that thread (g, t)
//   reads 8 bytes of a key row per k-step (dims 32p + 8t .. +7: k = 4t.. in b0, 16 + 4t.. in
//   b1). A score is s_q s_k (hi + lo / 256) / sqrt(256).
//   O += P V on m16n8k16 f16 -> f32, in units of the split's largest value-row scale S: each
//   weight times its row's scale over S (at most 1) split into f16 hi | lo, the value codes
//   exactly as f16 (two byte permutes and an f16 subtraction per pair of keys, against four
//   int -> f32 conversions and a pack for bf16); the merged sums are multiplied back by S.
// Each warp streams its own tiles of 16 keys (codes and both scales) through a 2-stage
// cp.async ring, as decode_tc_kernel. (Measured and not kept, tools/lab/attention_lab.cu on an
// H100: 3 or 4 stages, 5% slower alone at 66 splits; the score's k-steps in two integer
// chains, within 0.3%.)
constexpr int kT8Threads = kTcWarps * 32;
constexpr int kT8KStride = kTcD + 32;  // bytes per staged key row: 8-byte fragment reads of a
                                       // half warp (rows g, offsets 8t) hit distinct banks
constexpr int kT8VStride = kTcD + 16;  // bytes per staged value row (rows 2t.., offsets 8g)
constexpr int kT8ScaleBytes = 2 * kTcKeys * 4;  // the tile's 16 key and 16 value scales
constexpr int kT8StageBytes = kTcKeys * (kT8KStride + kT8VStride) + kT8ScaleBytes;
constexpr int kT8KSteps = kTcD / 32;
constexpr int kT8QBytes = kT8KSteps * 32 * 16;  // query planes: [k-step][lane] uint4
// Dynamic shared memory of decode_tc_int8_kernel: each warp's ring, then the query planes.
constexpr size_t kT8SmemBytes = static_cast<size_t>(kTcWarps) * kTcStages * kT8StageBytes + kT8QBytes;
static_assert(static_cast<size_t>(kTcG) * kTcD * sizeof(float) <=
                  static_cast<size_t>(kTcWarps) * kTcStages * kT8StageBytes,
              "the block merge reuses the staging buffers");

// Four int8 values (element 0 in the low byte) packed into a word.
__device__ __forceinline__ uint32_t pack_s8x4(int a, int b, int c, int d) {
  return (static_cast<uint32_t>(a) & 0xffu) | ((static_cast<uint32_t>(b) & 0xffu) << 8) |
         ((static_cast<uint32_t>(c) & 0xffu) << 16) | (static_cast<uint32_t>(d) << 24);
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Dims i = 0..3 of two value rows as f16 pairs {row a dim i, row b dim i}, exactly: ua, ub are
// four codes each (dims 0..3) with 128 added (x ^ 0x80808080); the bytes are interleaved, put
// under f16's 1024 (0x64 in the high byte: 1024 + byte), and 1152 = 1024 + 128 subtracted.
__device__ __forceinline__ void value_pairs_f16(uint32_t ua, uint32_t ub, uint32_t (&out)[4]) {
  constexpr uint32_t kMagic = 0x64646464u;
  const uint32_t z0 = __byte_perm(ua, ub, 0x5140);  // a0 b0 a1 b1
  const uint32_t z1 = __byte_perm(ua, ub, 0x7362);  // a2 b2 a3 b3
  const uint32_t w[4] = {__byte_perm(z0, kMagic, 0x7150), __byte_perm(z0, kMagic, 0x7352),
                         __byte_perm(z1, kMagic, 0x7150), __byte_perm(z1, kMagic, 0x7352)};
#pragma unroll
  for (int i = 0; i < 4; ++i) asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(out[i]) : "r"(w[i]), "r"(0x64806480u));
}

__global__ void __launch_bounds__(kT8Threads, 2)
    decode_tc_int8_kernel(const float* qg, const float* k, const float* v, int8_t* k_cache,
                          int8_t* v_cache, float* k_scales, float* v_scales, int64_t capacity,
                          int kv_heads, int64_t pos_host, const int32_t* pos_device, int splits,
                          float scale, float* part_o, float* part_ml) {
  extern __shared__ __align__(16) unsigned char tc_smem[];
  __shared__ float s_m[kTcWarps][kTcG];
  __shared__ float s_l[kTcWarps][kTcG];
  __shared__ float s_q[kTcG];         // each head's query scale
  __shared__ float s_vmax[kTcWarps];  // the warps' largest value-row scales
  grid_dependency_wait();
  DecodeSplit range;
  const int split = blockIdx.y;
  if (!decode_split_range(pos_host, pos_device, capacity, split, splits, range)) return;
  const int64_t P = range.P, begin = range.begin, end = range.end;
  const int kvh = blockIdx.x;
  const int64_t row = static_cast<int64_t>(kv_heads) * kTcD;  // cache bytes per position
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  // Row P: the block whose range holds it quantises it into the cache (warp 0 the key, warp 1
  // the value) before anything is staged, so no block reads a row another block writes.
  if (begin <= P && P < end && warp < 2) {
    const float* src = (warp == 0 ? k : v) + kvh * kTcD + lane * 8;
    const float4 a = *reinterpret_cast<const float4*>(src);
    const float4 b = *reinterpret_cast<const float4*>(src + 4);
    const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    quantize_row_warp<8>(x, lane, (warp == 0 ? k_cache : v_cache) + P * row + kvh * kTcD,
                         (warp == 0 ? k_scales : v_scales) + P * kv_heads + kvh);
    __threadfence_block();
  }
  __syncthreads();

  // Each head's max |q| (warp w: heads 2w, 2w + 1), and the largest value-row scale of the
  // split: the value sum runs in units of it, so that each weight times its row's scale is at
  // most 1 and fits f16.
  for (int h = 2 * warp; h < 2 * warp + 2; ++h) {
    const float* q = qg + static_cast<int64_t>(kvh * kTcG + h) * 2 * kTcD;
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < kTcD / 32; ++i) m = fmaxf(m, fabsf(q[lane + 32 * i]));
    m = warp_max(m);
    if (lane == 0) s_q[h] = m / 127.0f;
  }
  {
    float m = 0.0f;  // fmaxf skips a NaN scale: its row still reads NaN below
    for (int64_t j = begin + threadIdx.x; j < end; j += kT8Threads) m = fmaxf(m, v_scales[j * kv_heads + kvh]);
    m = warp_max(m);
    if (lane == 0) s_vmax[warp] = m;
  }
  __syncthreads();
  uint4* q_frag = reinterpret_cast<uint4*>(tc_smem + kTcWarps * kTcStages * kT8StageBytes);
  {
    const float* q = qg + static_cast<int64_t>(kvh * kTcG + g) * 2 * kTcD;
    const float sq = s_q[g];
    const float inv = sq > 0.0f ? 1.0f / sq : 0.0f;
    for (int p = warp; p < kT8KSteps; p += kTcWarps) {
      const int d = 32 * p + 8 * t;
      const float4 x0 = *reinterpret_cast<const float4*>(q + d);
      const float4 x1 = *reinterpret_cast<const float4*>(q + d + 4);
      const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      int hi[8], lo[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float y = x[i] * inv;  // in [-127, 127]
        const float h = rintf(y);
        hi[i] = static_cast<int>(h);
        lo[i] = static_cast<int>(fminf(fmaxf(rintf((y - h) * 256.0f), -127.0f), 127.0f));
      }
      q_frag[p * 32 + lane] = make_uint4(pack_s8x4(hi[0], hi[1], hi[2], hi[3]), pack_s8x4(lo[0], lo[1], lo[2], lo[3]),
                                         pack_s8x4(hi[4], hi[5], hi[6], hi[7]), pack_s8x4(lo[4], lo[5], lo[6], lo[7]));
    }
  }
  __syncthreads();
  const float sq_g = s_q[g] * scale;
  const float vmax = fmaxf(fmaxf(s_vmax[0], s_vmax[1]), fmaxf(s_vmax[2], s_vmax[3]));
  const float inv_vmax = vmax > 0.0f ? 1.0f / vmax : 0.0f;

  const int64_t tiles = (end - begin + kTcKeys - 1) / kTcKeys;
  unsigned char* ring = tc_smem + warp * kTcStages * kT8StageBytes;
  const int8_t* k_head = k_cache + kvh * kTcD;
  const int8_t* v_head = v_cache + kvh * kTcD;
  // The tile's 16 key and 16 value rows (16 pieces of 16 bytes each: two rows per warp
  // instruction) and their scales (lanes 0-15 the keys', 16-31 the values'); rows at or past
  // `end` zero-filled without a read.
  auto stage = [&](int64_t tile, int buffer) {
    unsigned char* kb = ring + buffer * kT8StageBytes;
    unsigned char* vb = kb + kTcKeys * kT8KStride;
    unsigned char* sb = vb + kTcKeys * kT8VStride;
    const int64_t first = begin + tile * kTcKeys;
    const int half = lane >> 4;
    const int piece = lane & 15;
#pragma unroll 4
    for (int r2 = 0; r2 < kTcKeys; r2 += 2) {
      const int r = r2 + half;
      const int64_t j = first + r;
      const bool live = j < end;
      const int64_t at = (live ? j : begin) * row + piece * 16;
      ptx::cp_async16(ptx::smem_u32(kb + r * kT8KStride + piece * 16), k_head + at, live ? 16 : 0);
      ptx::cp_async16(ptx::smem_u32(vb + r * kT8VStride + piece * 16), v_head + at, live ? 16 : 0);
    }
    const int64_t j = first + piece;
    const bool live = j < end;
    const float* src = (half == 0 ? k_scales : v_scales) + (live ? j : begin) * kv_heads + kvh;
    ptx::cp_async4(ptx::smem_u32(sb + lane * 4), src, live ? 4 : 0);
  };
#pragma unroll
  for (int st = 0; st < kTcStages; ++st) {
    const int64_t tile = warp + static_cast<int64_t>(st) * kTcWarps;
    if (tile < tiles) stage(tile, st);
    ptx::cp_async_commit();
  }

  float m_run = kNegInf;
  float l_run = 0.0f;
  float acc[kTcNTiles][4];
#pragma unroll
  for (int n = 0; n < kTcNTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  int buffer = 0;
  for (int64_t tile = warp; tile < tiles; tile += kTcWarps) {
    ptx::cp_async_wait<kTcStages - 1>();
    __syncwarp();
    const unsigned char* kb = ring + buffer * kT8StageBytes;
    const unsigned char* vb = kb + kTcKeys * kT8KStride;
    const float* sk = reinterpret_cast<const float*>(vb + kTcKeys * kT8VStride);
    const float* sv = sk + kTcKeys;

    // S = Q K^T in integers: n-tile 0 keys 0-7 (this thread loads key g), n-tile 1 keys 8-15.
    int sc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
    for (int p = 0; p < kT8KSteps; ++p) {
      const uint2 k0 = *reinterpret_cast<const uint2*>(kb + g * kT8KStride + 32 * p + 8 * t);
      const uint2 k1 = *reinterpret_cast<const uint2*>(kb + (g + 8) * kT8KStride + 32 * p + 8 * t);
      const uint4 qa = q_frag[p * 32 + lane];
      const uint32_t a[4] = {qa.x, qa.y, qa.z, qa.w};
      ptx::mma_s8(sc[0], a, k0.x, k0.y);
      ptx::mma_s8(sc[1], a, k1.x, k1.y);
    }
    const int64_t first = begin + tile * kTcKeys;
    const int key_of[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
    const int hi_of[4] = {sc[0][0], sc[0][1], sc[1][0], sc[1][1]};
    const int lo_of[4] = {sc[0][2], sc[0][3], sc[1][2], sc[1][3]};
    float s[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float dot = static_cast<float>(hi_of[i]) + static_cast<float>(lo_of[i]) * (1.0f / 256.0f);
      s[i] = first + key_of[i] < end ? dot * (sq_g * sk[key_of[i]]) : kNegInf;
    }
    float p[4];
    tc_online_softmax(s, m_run, l_run, acc, p);
    // The weights times their value rows' scales over the split's largest (<= 1; 0 for rows
    // past the end), as f16 hi | lo.
    float pv[4], ph[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      pv[i] = first + key_of[i] < end ? p[i] * (sv[key_of[i]] * inv_vmax) : 0.0f;
      ph[i] = __half2float(__float2half_rn(pv[i]));
    }
    const uint32_t pa[4] = {pack_f16(ph[0], ph[1]), pack_f16(pv[0] - ph[0], pv[1] - ph[1]),
                            pack_f16(ph[2], ph[3]), pack_f16(pv[2] - ph[2], pv[3] - ph[3])};
    // O += P V: this thread's B columns are dims 64q + 8g + i of keys 2t, 2t+1, 8+2t, 9+2t,
    // the codes exactly as f16.
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = 64 * q + 8 * g;
      uint2 w[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        w[r] = *reinterpret_cast<const uint2*>(vb + key_of[r] * kT8VStride + col);
        w[r].x ^= 0x80808080u;
        w[r].y ^= 0x80808080u;
      }
      uint32_t b0[8], b1[8];  // dim i: keys 2t, 2t+1 | keys 8+2t, 9+2t
      value_pairs_f16(w[0].x, w[1].x, *reinterpret_cast<uint32_t(*)[4]>(&b0[0]));
      value_pairs_f16(w[0].y, w[1].y, *reinterpret_cast<uint32_t(*)[4]>(&b0[4]));
      value_pairs_f16(w[2].x, w[3].x, *reinterpret_cast<uint32_t(*)[4]>(&b1[0]));
      value_pairs_f16(w[2].y, w[3].y, *reinterpret_cast<uint32_t(*)[4]>(&b1[4]));
#pragma unroll
      for (int i = 0; i < 8; ++i) ptx::mma_f16(acc[8 * q + i], pa, b0[i], b1[i]);
    }
    __syncwarp();
    const int64_t next = tile + static_cast<int64_t>(kTcStages) * kTcWarps;
    if (next < tiles) stage(next, buffer);
    ptx::cp_async_commit();
    buffer = buffer + 1 == kTcStages ? 0 : buffer + 1;
  }
  ptx::cp_async_wait_all();

  tc_merge_store(acc, m_run, l_run, vmax, s_m, s_l, tc_smem, kvh, split, splits, part_o, part_ml);  // back from vmax's units
}

// ============================== prefill (n > 1) =========================================
// Grid (query tiles of kBq tokens, q_heads), 128 threads. Per key tile of kBk keys:
//   S = Q K^T over D in chunks of kDc dims (K chunk staged in shared memory), masked, online
//   softmax per row; P to shared memory; O += P V over chunks of kVk keys (V staged).
// Thread (ty, tx) = (tid / 16, tid % 16) owns rows ty + 8i (i < 4), keys tx + 16j (j < 4) of
// S and dims tx + 16c (c < D/16) of O. All in f32: a bf16 cache is widened as it is staged
// (16-byte loads of 8 values), so shared memory and the arithmetic are those of the f32 path.

constexpr int kBq = 32;
constexpr int kBk = 64;
constexpr int kDc = 64;  // dims per K chunk
constexpr int kVk = 16;  // keys per V chunk
constexpr int kPrefillThreads = 128;

template <int D>
struct PrefillSmem {
  static constexpr int kQStride = D + 4;    // float4-aligned, rows in different banks
  static constexpr int kKStride = kDc + 4;  // float4-aligned
  static constexpr int kPStride = kBk + 1;
  static constexpr int kKFloats = kBk * kKStride;
  static constexpr int kVFloats = kVk * D;
  static constexpr int kBufFloats = kKFloats > kVFloats ? kKFloats : kVFloats;
  static constexpr int kFloats = kBq * kQStride + kBq * kPStride + kBufFloats;
  static constexpr size_t kBytes = sizeof(float) * kFloats;
};

template <int D, typename KV>
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_kernel(const float* qg, const KV* k_cache, const KV* v_cache, const float* k_scales,
                   const float* v_scales, int q_heads, int kv_heads, int group, int64_t pos,
                   int64_t n, float scale, float* out) {
  using Smem = PrefillSmem<D>;
  constexpr int kC = D / 16;  // O columns per thread
  constexpr int kDChunk = D < kDc ? D : kDc;
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;
  float* Ps = Qs + kBq * Smem::kQStride;
  float* buf = Ps + kBq * Smem::kPStride;

  const int tid = threadIdx.x;
  const int ty = tid >> 4;
  const int tx = tid & 15;
  const int qtile = gridDim.x - 1 - blockIdx.x;  // the longest (last) tiles start first
  const int h = blockIdx.y;
  const int kvh = h / group;
  const int64_t t0 = static_cast<int64_t>(qtile) * kBq;
  const int64_t rows_here = n - t0 < kBq ? n - t0 : kBq;
  const int64_t kv_end = pos + t0 + rows_here;  // keys 0..kv_end-1 are needed (and written)
  const int64_t row_stride = static_cast<int64_t>(kv_heads) * D;

  // Q tile (rows past n are zero; their outputs are not written).
  for (int idx = tid; idx < kBq * D / 4; idx += kPrefillThreads) {
    const int r = idx / (D / 4);
    const int d4 = idx % (D / 4);
    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < rows_here) {
      val = *reinterpret_cast<const float4*>(qg + ((t0 + r) * q_heads + h) * 2 * D + d4 * 4);
    }
    *reinterpret_cast<float4*>(Qs + r * Smem::kQStride + d4 * 4) = val;
  }

  float o[4][kC];
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = kNegInf;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kC; ++c) o[i][c] = 0.0f;
  }

  for (int64_t kb = 0; kb < kv_end; kb += kBk) {
    // ---- S = Q K^T ----
    float sacc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) sacc[i][j] = 0.0f;
    for (int d0 = 0; d0 < D; d0 += kDChunk) {
      __syncthreads();  // the buffer is free (previous chunk / V chunk done)
      constexpr int kV = kStageVec<KV>;
      for (int idx = tid; idx < kBk * kDChunk / kV; idx += kPrefillThreads) {
        const int key = idx / (kDChunk / kV);
        const int dv = idx % (kDChunk / kV);
        float* dst = buf + key * Smem::kKStride + dv * kV;
        if (kb + key < kv_end) {
          const float rs = kIsInt8<KV> ? k_scales[(kb + key) * kv_heads + kvh] : 0.0f;
          stage_row_piece<KV>(k_cache + (kb + key) * row_stride + kvh * D + d0 + dv * kV, rs, dst);
        } else {
          stage_zero<KV>(dst);
        }
      }
      __syncthreads();
#pragma unroll 4
      for (int dd = 0; dd < kDChunk; dd += 4) {
        float4 qv[4], kv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          qv[i] = *reinterpret_cast<const float4*>(Qs + (ty + 8 * i) * Smem::kQStride + d0 + dd);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          kv[j] = *reinterpret_cast<const float4*>(buf + (tx + 16 * j) * Smem::kKStride + dd);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float a = sacc[i][j];
            a = fmaf(qv[i].x, kv[j].x, a);
            a = fmaf(qv[i].y, kv[j].y, a);
            a = fmaf(qv[i].z, kv[j].z, a);
            a = fmaf(qv[i].w, kv[j].w, a);
            sacc[i][j] = a;
          }
      }
    }

    // ---- mask, online softmax, P ----
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = ty + 8 * i;
      const int64_t last = pos + t0 + r;  // this row sees keys 0..last
      const bool live = r < rows_here;
      float tmax = kNegInf;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t key = kb + tx + 16 * j;
        sacc[i][j] = (live && key <= last) ? sacc[i][j] * scale : kNegInf;
        tmax = fmaxf(tmax, sacc[i][j]);
      }
#pragma unroll
      for (int off = 1; off < 16; off <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float m_new = fmaxf(m[i], tmax);
      const float corr = exp_shifted(m[i], m_new);
      float rsum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = exp_shifted(sacc[i][j], m_new);
        rsum += p;
        Ps[r * Smem::kPStride + tx + 16 * j] = p;
      }
#pragma unroll
      for (int off = 1; off < 16; off <<= 1) rsum += __shfl_xor_sync(0xffffffffu, rsum, off);
      l[i] = l[i] * corr + rsum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < kC; ++c) o[i][c] *= corr;
    }

    // ---- O += P V ----
    for (int k0 = 0; k0 < kBk; k0 += kVk) {
      if (kb + k0 >= kv_end) break;  // uniform across the block
      __syncthreads();  // buffer free; P visible
      constexpr int kV = kStageVec<KV>;
      for (int idx = tid; idx < kVk * D / kV; idx += kPrefillThreads) {
        const int key = idx / (D / kV);
        const int dv = idx % (D / kV);
        float* dst = buf + key * D + dv * kV;
        if (kb + k0 + key < kv_end) {
          const float rs = kIsInt8<KV> ? v_scales[(kb + k0 + key) * kv_heads + kvh] : 0.0f;
          stage_row_piece<KV>(v_cache + (kb + k0 + key) * row_stride + kvh * D + dv * kV, rs, dst);
        } else {
          stage_zero<KV>(dst);
        }
      }
      __syncthreads();
#pragma unroll 4
      for (int kk = 0; kk < kVk; ++kk) {
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = Ps[(ty + 8 * i) * Smem::kPStride + k0 + kk];
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          const float vv = buf[kk * D + tx + 16 * c];
#pragma unroll
          for (int i = 0; i < 4; ++i) o[i][c] = fmaf(p[i], vv, o[i][c]);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 8 * i;
    if (r >= rows_here) continue;
    const int64_t t = t0 + r;
    const float* gate = qg + (t * q_heads + h) * 2 * D + D;
    float* dst = out + (t * q_heads + h) * D;
    const float inv_l = 1.0f / l[i];
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int d = tx + 16 * c;
      dst[d] = o[i][c] * inv_l * sigmoidf_(gate[d]);
    }
  }
}

// ============================== prefill cache write (bf16) ==============================
// blockIdx.y 0: k -> k_dst, 1: v -> v_dst; each thread rounds kStoreVec consecutive values
// (two float4 loads, one 16-byte store), round-to-nearest-even. `pieces` = values / kStoreVec.
constexpr int kStoreVec = 8;

__global__ void store_bf16_rows_kernel(const float* k, const float* v, __nv_bfloat16* k_dst,
                                       __nv_bfloat16* v_dst, int64_t pieces) {
  grid_dependency_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pieces) return;
  const float* src = (blockIdx.y == 0 ? k : v) + i * kStoreVec;
  __nv_bfloat16* dst = (blockIdx.y == 0 ? k_dst : v_dst) + i * kStoreVec;
  const float4 a = reinterpret_cast<const float4*>(src)[0];
  const float4 b = reinterpret_cast<const float4*>(src)[1];
  const __nv_bfloat162 p0 = __floats2bfloat162_rn(a.x, a.y);
  const __nv_bfloat162 p1 = __floats2bfloat162_rn(a.z, a.w);
  const __nv_bfloat162 p2 = __floats2bfloat162_rn(b.x, b.y);
  const __nv_bfloat162 p3 = __floats2bfloat162_rn(b.z, b.w);
  uint4 out;
  out.x = *reinterpret_cast<const uint32_t*>(&p0);
  out.y = *reinterpret_cast<const uint32_t*>(&p1);
  out.z = *reinterpret_cast<const uint32_t*>(&p2);
  out.w = *reinterpret_cast<const uint32_t*>(&p3);
  *reinterpret_cast<uint4*>(dst) = out;
}

// ============================== cache write (int8) ======================================
// One warp per (row, K | V): rows r < rows of k / v [rows, head_dim] (rows = n * kv_heads) go to
// cache row pos * kv_heads + r, quantised by quantize_row_warp (the CPU's quantize_kv_row).
// With pos_device (a decode step, n == 1) the position is read here, and a row past
// `capacity` is not written (the attention kernels skip that position too).
constexpr int kStoreWarps = 8;

template <int D>
__global__ void __launch_bounds__(kStoreWarps * 32)
    store_int8_rows_kernel(const float* k, const float* v, int64_t rows, int kv_heads,
                           int64_t pos_host, const int32_t* pos_device, int64_t capacity,
                           int8_t* k_codes, float* k_scales, int8_t* v_codes, float* v_scales) {
  grid_dependency_wait();
  constexpr int kPer = D / 32;
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kStoreWarps + (threadIdx.x >> 5);
  if (item >= 2 * rows) return;  // whole warps: item depends on the warp only
  const int64_t pos = read_position(pos_host, pos_device);
  const int64_t r = item >> 1;
  if (pos < 0 || pos + r / kv_heads >= capacity) return;
  const bool values = (item & 1) != 0;
  const float* src = (values ? v : k) + r * D + lane * kPer;
  float x[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) x[i] = src[i];
  const int64_t at = pos * kv_heads + r;
  quantize_row_warp<kPer>(x, lane, (values ? v_codes : k_codes) + at * D, (values ? v_scales : k_scales) + at);
}

// ============================== host side ===============================================

RopeFreqs rope_freqs(const AttentionShape& a) {
  // transformers: inv_freq = 1 / base ** (arange(0, rot, 2).float() / rot) in f32; the power is
  // formed in double and rounded once (as the reference does; the CPU's powf agrees).
  RopeFreqs f{};
  const int half = a.rotary_dim / 2;
  const auto base = static_cast<float>(a.rope_theta);
  for (int i = 0; i < half && i < kMaxRotaryHalf; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(a.rotary_dim);
    const auto power = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
    f.inv_freq[i] = 1.0f / power;
  }
  return f;
}

template <int D>
void launch_prepare(float* qg, float* k, const float* q_norm, const float* k_norm,
                    const AttentionShape& a, int64_t pos_host, const int32_t* pos_device,
                    int64_t n, float eps, Stream s) {
  const int64_t items = n * (a.q_heads + a.kv_heads);
  const auto blocks = static_cast<unsigned>((items + kPrepareWarps - 1) / kPrepareWarps);
  launch(prepare_kernel<D>, blocks, kPrepareWarps * 32, 0, s, qg, k, q_norm, k_norm, a.q_heads,
         a.kv_heads, a.rotary_dim, rope_freqs(a), pos_host, pos_device, n, eps);
}

// Whether an int8 decode step of this shape runs decode_tc_int8_kernel (head_dim 256, query
// groups of 8, and the shared memory), which also quantises the step's own row.
bool int8_row_in_decode_kernel(int D, const AttentionShape& a) {
  return D == kTcD && a.q_heads == kTcG * a.kv_heads && int8_tensor_core_decode_attention_fits();
}

int decode_splits(int64_t capacity) {
  const int64_t wanted = (capacity + kDecodeMinKeys - 1) / kDecodeMinKeys;
  return static_cast<int>(wanted < kDecodeMaxSplits ? (wanted > 0 ? wanted : 1) : kDecodeMaxSplits);
}

// The caches of one attention call, typed: KV elements, and an int8 cache's row scales
// (nullptr for the others).
template <typename KV>
struct TypedCaches {
  KV* keys;
  KV* values;
  float* key_scales;
  float* value_scales;
};

template <int D, int G, typename KV>
void launch_decode_split(const float* qg, const float* k, const float* v, const TypedCaches<KV>& c,
                         int64_t capacity, const AttentionShape& a, int units,
                         int64_t pos_host, const int32_t* pos_device, int splits, float scale,
                         float* part_o, float* part_ml, Stream s) {
  const int group = a.q_heads / a.kv_heads;
  launch(decode_split_kernel<D, G, KV>, dim3(static_cast<unsigned>(units), static_cast<unsigned>(splits)),
         kDecodeThreads, 0, s, qg, k, v, c.keys, c.values, static_cast<const float*>(c.key_scales),
         static_cast<const float*>(c.value_scales), capacity, a.q_heads, a.kv_heads, group,
         pos_host, pos_device, splits, scale, part_o, part_ml);
}

// The tensor-core kernels' split count: one block per SM at most, and no more than the
// CUDA-core kernel would use. For the int8 kernel too, although two of its blocks fit an SM:
// at 131,072 keys on an H100 it took 61.4 us a layer with one block per SM (66 splits) and 68.1
// with two (128), and the combine has half the partials to merge (tools/lab/attention_lab.cu).
int decode_tc_splits(int64_t capacity, int kv_heads) {
  const int per_sm = sm_count() / (kv_heads > 0 ? kv_heads : 1);
  const int splits = decode_splits(capacity);
  return splits < per_sm ? splits : (per_sm > 0 ? per_sm : 1);
}

template <int D, typename KV>
AttentionPath launch_decode(const float* qg, const float* k, const float* v, const TypedCaches<KV>& c,
                            int64_t capacity, const AttentionShape& a,
                            int64_t pos_host, const int32_t* pos_device, float* out,
                            Workspace& ws, Stream s) {
  KV* k_cache = c.keys;
  KV* v_cache = c.values;
  const int group = a.q_heads / a.kv_heads;
  const int G = (group == 2 || group == 4 || group == 8) ? group : 1;
  const int units = G > 1 ? a.kv_heads : a.q_heads;
  constexpr bool kInt8Tc = kIsInt8<KV> && D == kTcD;
  const bool int8_tensor_cores = kInt8Tc && int8_row_in_decode_kernel(D, a);
  const bool tensor_cores =
      int8_tensor_cores || (G == kTcG && kTensorCoreDecode<D, kTcG, KV> && tensor_core_decode_attention_fits());
  const int splits =
      tensor_cores ? decode_tc_splits(capacity, a.kv_heads) : decode_splits(capacity);
  const size_t o_floats = static_cast<size_t>(a.q_heads) * splits * D;
  const size_t ml_floats = static_cast<size_t>(a.q_heads) * splits * 2;
  auto* part_o = static_cast<float*>(ws.get(kWsAttention, (o_floats + ml_floats) * sizeof(float)));
  float* part_ml = part_o + o_floats;  // o_floats is a multiple of 64: stays 256-byte aligned
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if constexpr (kTensorCoreDecode<D, kTcG, KV>) {
    if (tensor_cores) {
      static bool configured = false;  // one attribute set (host-side, no sync)
      if (!configured) {
        LILY_CUDA_CHECK(cudaFuncSetAttribute(decode_tc_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(kTcSmemBytes)));
        configured = true;
      }
      launch(decode_tc_kernel, dim3(static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(splits)),
             kTcThreads, kTcSmemBytes, s, qg, k, v, k_cache, v_cache, capacity, a.kv_heads,
             pos_host, pos_device, splits, scale, part_o, part_ml);
    }
  }
  if constexpr (kInt8Tc) {
    if (int8_tensor_cores) {
      static bool configured = false;  // one attribute set (host-side, no sync)
      if (!configured) {
        LILY_CUDA_CHECK(cudaFuncSetAttribute(decode_tc_int8_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(kT8SmemBytes)));
        configured = true;
      }
      launch(decode_tc_int8_kernel,
             dim3(static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(splits)), kT8Threads,
             kT8SmemBytes, s, qg, k, v, k_cache, v_cache, c.key_scales, c.value_scales, capacity,
             a.kv_heads, pos_host, pos_device, splits, scale, part_o, part_ml);
    }
  }
  if (!tensor_cores) {
    switch (G) {
      case 8:
        launch_decode_split<D, 8, KV>(qg, k, v, c, capacity, a, units, pos_host,
                                      pos_device, splits, scale, part_o, part_ml, s);
        break;
      case 4:
        launch_decode_split<D, 4, KV>(qg, k, v, c, capacity, a, units, pos_host,
                                      pos_device, splits, scale, part_o, part_ml, s);
        break;
      case 2:
        launch_decode_split<D, 2, KV>(qg, k, v, c, capacity, a, units, pos_host,
                                      pos_device, splits, scale, part_o, part_ml, s);
        break;
      default:
        launch_decode_split<D, 1, KV>(qg, k, v, c, capacity, a, units, pos_host,
                                      pos_device, splits, scale, part_o, part_ml, s);
        break;
    }
  }
  launch(decode_combine_kernel<D>, static_cast<unsigned>(a.q_heads), D, 0, s, qg, capacity, G,
         pos_host, pos_device, splits, part_o, part_ml, out);
  if (int8_tensor_cores) return AttentionPath::decode_int8_tensor_cores;
  return tensor_cores ? AttentionPath::decode_tensor_cores : AttentionPath::decode_cuda_cores;
}

// The prefill's new rows into the caches: a device copy for f32, a rounding kernel for bf16.
void store_rows(const float* k, const float* v, float* k_dst, float* v_dst, size_t count,
                Stream s) {
  copy_async(k_dst, k, count * sizeof(float), cudaMemcpyDeviceToDevice, s);
  copy_async(v_dst, v, count * sizeof(float), cudaMemcpyDeviceToDevice, s);
}
void store_rows(const float* k, const float* v, __nv_bfloat16* k_dst, __nv_bfloat16* v_dst,
                size_t count, Stream s) {
  constexpr int kThreads = 256;
  const size_t pieces = count / kStoreVec;  // count = n * kv_heads * head_dim: a multiple of 64
  const auto blocks = static_cast<unsigned>((pieces + kThreads - 1) / kThreads);
  launch(store_bf16_rows_kernel, dim3(blocks, 2), kThreads, 0, s, k, v, k_dst, v_dst,
         static_cast<int64_t>(pieces));
}

// The new rows of an int8 cache (prefill or decode): store_int8_rows_kernel.
template <int D>
void store_int8_rows(const float* k, const float* v, const TypedCaches<int8_t>& c, const AttentionShape& a,
                     int64_t pos_host, const int32_t* pos_device, int64_t capacity, int64_t n, Stream s) {
  const int64_t rows = n * a.kv_heads;
  const auto blocks = static_cast<unsigned>((2 * rows + kStoreWarps - 1) / kStoreWarps);
  launch(store_int8_rows_kernel<D>, blocks, kStoreWarps * 32, 0, s, k, v, rows, a.kv_heads, pos_host,
         pos_device, capacity, c.keys, c.key_scales, c.values, c.value_scales);
}

template <int D, typename KV>
void launch_prefill(const float* qg, const float* k, const float* v, const TypedCaches<KV>& c,
                    const AttentionShape& a, int64_t pos, int64_t n, float* out, Stream s) {
  KV* k_cache = c.keys;
  KV* v_cache = c.values;
  const int64_t row = static_cast<int64_t>(a.kv_heads) * D;
  if constexpr (!kIsInt8<KV>) {  // int8 rows were stored by launch_attention
    store_rows(k, v, k_cache + pos * row, v_cache + pos * row, static_cast<size_t>(n * row), s);
  }
  constexpr size_t kSmem = PrefillSmem<D>::kBytes;
  static bool configured = false;  // one attribute set per instantiation (host-side, no sync)
  if (!configured) {
    LILY_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<D, KV>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem)));
    configured = true;
  }
  const auto tiles = static_cast<unsigned>((n + kBq - 1) / kBq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  launch_serial(prefill_kernel<D, KV>, dim3(tiles, static_cast<unsigned>(a.q_heads)),
                kPrefillThreads, kSmem, s, qg, k_cache, v_cache,
                static_cast<const float*>(c.key_scales), static_cast<const float*>(c.value_scales),
                a.q_heads, a.kv_heads, a.q_heads / a.kv_heads, pos, n, scale, out);
}

template <int D, typename KV>
AttentionPath launch_attention(const float* qg, const float* k, const float* v, const TypedCaches<KV>& c,
                      int64_t capacity, const AttentionShape& a, int64_t pos_host,
                      const int32_t* pos_device, int64_t n, float* out, Workspace& ws,
                      Stream s) {
  if constexpr (kIsInt8<KV>) {
    // The tensor-core decode quantises its new row itself; the other int8 paths read it from
    // the cache.
    if (n != 1 || !int8_row_in_decode_kernel(D, a)) {
      store_int8_rows<D>(k, v, c, a, pos_host, pos_device, capacity, n, s);
    }
  }
  if (n == 1) {
    return launch_decode<D, KV>(qg, k, v, c, capacity, a, pos_host, pos_device, out, ws, s);
  }
  launch_prefill<D, KV>(qg, k, v, c, a, pos_host, n, out, s);
  return AttentionPath::prefill;
}

template <typename KV>
AttentionPath attention_typed(const float* qg, const float* k, const float* v, const TypedCaches<KV>& c,
                     int64_t capacity, const AttentionShape& a, int64_t pos_host,
                     const int32_t* pos_device, int64_t n, float* out, Workspace& ws,
                     Stream s) {
  switch (a.head_dim) {
    case 64:
      return launch_attention<64, KV>(qg, k, v, c, capacity, a, pos_host, pos_device, n, out, ws, s);
    case 128:
      return launch_attention<128, KV>(qg, k, v, c, capacity, a, pos_host, pos_device, n, out, ws, s);
    case 256:
      return launch_attention<256, KV>(qg, k, v, c, capacity, a, pos_host, pos_device, n, out, ws, s);
    default: throw std::invalid_argument("cuda attention: head_dim must be 64, 128 or 256");
  }
}

}  // namespace

bool tensor_core_decode_attention_fits() {
  // Its ~150 KB of shared memory fit sm_80 and sm_90 (opt-in 163 and 227 KB), not the 99 KB of
  // sm_86, sm_89 and sm_120, which keep the CUDA-core kernel.
  static const bool fits = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) >=
                           static_cast<int>(kTcSmemBytes + 1024);
  return fits;
}

bool int8_tensor_core_decode_attention_fits() {
  // About 77 KB: every supported device (sm_80 and newer, 99 KB and up).
  static const bool fits = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) >=
                           static_cast<int>(kT8SmemBytes + 1024);
  return fits;
}

void attention_prepare(float* qg, float* k, const float* q_norm, const float* k_norm,
                       const AttentionShape& a, int64_t pos_host, const int32_t* pos_device,
                       int64_t n, float eps, Stream s) {
  if (n <= 0) return;
  switch (a.head_dim) {
    case 64: return launch_prepare<64>(qg, k, q_norm, k_norm, a, pos_host, pos_device, n, eps, s);
    case 128: return launch_prepare<128>(qg, k, q_norm, k_norm, a, pos_host, pos_device, n, eps, s);
    case 256: return launch_prepare<256>(qg, k, q_norm, k_norm, a, pos_host, pos_device, n, eps, s);
    default: throw std::invalid_argument("cuda attention_prepare: head_dim must be 64, 128 or 256");
  }
}

AttentionPath attention(const float* qg, const float* k, const float* v, const KvCaches& caches,
                        int64_t capacity, const AttentionShape& a, int64_t pos_host,
                        const int32_t* pos_device, int64_t n, float* out, Workspace& ws,
                        Stream s) {
  if (n <= 0) return AttentionPath::none;
  switch (caches.type) {
    case KvType::f32:
      return attention_typed(qg, k, v,
                             TypedCaches<float>{static_cast<float*>(caches.keys),
                                                static_cast<float*>(caches.values), nullptr, nullptr},
                             capacity, a, pos_host, pos_device, n, out, ws, s);
    case KvType::bf16:
      return attention_typed(qg, k, v,
                             TypedCaches<__nv_bfloat16>{static_cast<__nv_bfloat16*>(caches.keys),
                                                        static_cast<__nv_bfloat16*>(caches.values),
                                                        nullptr, nullptr},
                             capacity, a, pos_host, pos_device, n, out, ws, s);
    case KvType::int8:
      return attention_typed(qg, k, v,
                             TypedCaches<int8_t>{static_cast<int8_t*>(caches.keys),
                                                 static_cast<int8_t*>(caches.values),
                                                 caches.key_scales, caches.value_scales},
                             capacity, a, pos_host, pos_device, n, out, ws, s);
  }
  throw std::invalid_argument("cuda attention: unknown KV cache type");
}

}  // namespace lily::cuda

// Private to quant_gemm.cu and moe_grouped.cu: the tensor-core main loop shared by the dense
// prefill GEMM and the grouped (per-expert) MoE GEMMs.
//
// C[m, n] = sum_k A[m, k] * W[n, k], A = activations (tile rows = tokens / pairs, the MMA's M),
// W = an MLX affine Q4/Q8 weight (tile columns = weight rows, the MMA's N), computed in the
// exact-code form: with W[n, c] = s[n, g] q[n, c] + b[n, g] (g = c / 64, q an integer code),
//   C[m, n] = sum_g ( s[n, g] * sum_{c in g} q[n, c] A[m, c]  +  b[n, g] * sum_{c in g} A[m, c] ).
// The shared-memory weight tile holds the raw codes q (integers 0..255 are exact in BF16), the
// activations are split into two BF16 terms A = hi + lo (hi = bf16(A), lo = bf16(A - hi):
// together A to ~2^-17 relative), and mma.sync m16n8k16 (bf16 x bf16 -> f32) runs q.hi and q.lo
// into a per-group f32 accumulator. After each group (one 64-wide K tile) the group result is
// folded into the total in f32: acc += s * acc_g + b * xsum, with s and b the weight row's
// scale and bias (f32 from BF16, staged in shared memory by the weight loader) and xsum the f32
// sum of the group's split activations hi + lo (precomputed by split_act). So the only
// roundings are the f32 ones plus the ~2^-17 of the split: near-f32 results at twice the MMAs
// of a plain BF16 GEMM.
//
// Activation workspace (split_act): row r at r * act_ld(K) BF16 elements, laid out as
// [hi: K bf16][lo: K bf16][xsum: K/64 f32][pad to 16 bytes].
//
// Block tile: BM activation rows (64 or 128) x 128 weight rows x 64 K (one quant group), 8 warps
// in a 2 (M) x 4 (N) grid, warp tile (BM/2) x 32. Two shared-memory stages: while the tensor
// cores work on stage k, the next activation tile (hi, lo, xsum) streams in with cp.async and
// the next weight codes are already in registers (written into the other stage after the MMAs).
// Shared rows are 128 bytes (8 chunks of 16 B); chunk c of row r lives at chunk c ^ (r & 7), so
// both ldmatrix (8 rows, same chunk) and the 16-byte stores are bank-conflict free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/ptx.cuh"

namespace lily::cuda::gemm_detail {

using ptx::cp_async16;
using ptx::cp_async4;
using ptx::cp_async_commit;
using ptx::cp_async_wait_all;
using ptx::ldmatrix_x4;
using ptx::mma_bf16;
using ptx::mma_bf16_zero;
using ptx::pack_bf16;
using ptx::smem_u32;

inline constexpr int kThreads = 256;  // 8 warps
inline constexpr int kBN = 128;       // weight rows per block tile
inline constexpr int kBK = 64;        // K per stage = one quant group

template <int BM>
struct Tile {
  static_assert(BM == 64 || BM == 128, "BM is 64 or 128");
  static constexpr int kMI = BM / 32;                // m16 tiles per warp (warp tile BM/2 rows)
  static constexpr int kNI = 4;                      // n8 tiles per warp (warp tile 32 rows)
  static constexpr int kARowsPerThread = BM / 32;    // A tile: BM rows x 8 chunks / 256 threads
  static constexpr int kStageA = BM * kBK;           // bf16 elements per A stage (hi or lo)
  static constexpr int kStageB = kBN * kBK;          // bf16 elements per B stage
  // Shared layout: A hi [2 stages], A lo [2], B codes [2] (bf16), then f32: scale [2][kBN],
  // bias [2][kBN], xsum [2][BM].
  static constexpr int kHalfBytes = 2 * (2 * kStageA + kStageB) * 2;
  static constexpr int kFloatCount = 2 * (2 * kBN + BM);
  static constexpr int kSmemBytes = kHalfBytes + kFloatCount * 4;
};

// Row stride (in BF16 elements) of the split activation workspace for K columns (K % 64 == 0):
// hi K, lo K, then K / 64 f32 group sums (2 BF16 slots each), rounded up to 16 bytes.
__host__ __device__ constexpr int64_t act_ld(int64_t K) { return 2 * K + ((2 * (K / 64) + 7) & ~int64_t{7}); }

// Element offset (in bf16) of 16-byte chunk `chunk` (0..7) of shared row `row` (XOR swizzle).
__device__ __forceinline__ int swz(int row, int chunk) { return row * kBK + ((chunk ^ (row & 7)) << 3); }


// Exact float of a small unsigned integer (< 2^23): 2^23 + q as bits, minus 2^23.
__device__ __forceinline__ float u2f_exact(uint32_t q) {
  return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

// Two Q4 codes (bits 0..3 and 4..7 of t) as an exact BF16 pair (.x = bits 0..3): 0x4300 | q is
// the BF16 of 128 + q (exponent 2^7, mantissa step 1), minus 128 exactly.
__device__ __forceinline__ uint32_t q4pair_bf16(uint32_t t) {
  const uint32_t biased = (t & 0xFu) | ((t & 0xF0u) << 12) | 0x43004300u;
  __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&biased);
  v = __hsub2(v, __floats2bfloat162_rn(128.0f, 128.0f));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- weight tile: codes in registers, then raw codes (exact BF16) into shared memory -------
// Thread t owns weight-tile row t / 2 and its 32 K values (t % 2) * 32 .. +31 of the group:
// Q4 one uint4 (4 words x 8 codes), Q8 two uint4 (8 words x 4 codes).
template <int BITS>
struct WeightRegs {
  static constexpr int kVecs = BITS == 4 ? 1 : 2;
  uint4 v[kVecs];
  float scale, bias;
};

struct WeightRow {
  const uint32_t* codes = nullptr;  // start of this row's codes (nullptr: row out of range)
  const __nv_bfloat16* scales = nullptr;
  const __nv_bfloat16* biases = nullptr;
};

// Row `row` of the (stacked) weight w (QuantMatrix's helpers are host-only).
template <int BITS>
__device__ __forceinline__ WeightRow weight_row(const QuantMatrix& w, int64_t row) {
  WeightRow r;
  r.codes = w.codes + row * (w.in * BITS / 32);
  r.scales = w.scales + row * (w.in / 64);
  r.biases = w.biases + row * (w.in / 64);
  return r;
}

template <int BITS>
__device__ __forceinline__ void load_weight(const WeightRow& row, int half, int kt, WeightRegs<BITS>& r) {
  if (row.codes != nullptr) {
    constexpr int kWordsPerGroup = 64 * BITS / 32;  // 8 or 16
    const uint4* src = reinterpret_cast<const uint4*>(row.codes + static_cast<int64_t>(kt) * kWordsPerGroup +
                                                      half * (kWordsPerGroup / 2));
#pragma unroll
    for (int i = 0; i < WeightRegs<BITS>::kVecs; ++i) r.v[i] = __ldg(src + i);
    r.scale = __bfloat162float(row.scales[kt]);
    r.bias = __bfloat162float(row.biases[kt]);
  } else {
#pragma unroll
    for (int i = 0; i < WeightRegs<BITS>::kVecs; ++i) r.v[i] = make_uint4(0, 0, 0, 0);
    r.scale = 0.0f;
    r.bias = 0.0f;
  }
}

// Writes the 32 raw codes (exact BF16 integers) as 4 chunks (half * 4 + 0..3) of shared row
// `srow`; the half-0 thread also stages the row's scale and bias (f32) for the group epilogue
// (zeros for a row out of range, whose codes are zeros too).
template <int BITS>
__device__ __forceinline__ void store_weight(__nv_bfloat16* stage_b, float* stage_scale, float* stage_bias, int srow,
                                             int half, const WeightRegs<BITS>& r) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(r.v);
#pragma unroll
  for (int c = 0; c < 4; ++c) {  // chunk c: elements 8c .. 8c+7 of this thread's 32
    uint32_t packed[4];
    if constexpr (BITS == 4) {
      const uint32_t w = words[c];  // element 8w+j in bits 4j..4j+3
#pragma unroll
      for (int j = 0; j < 4; ++j) packed[j] = q4pair_bf16(w >> (8 * j));
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // two words of 4 codes each: element 4w+j in bits 8j..8j+7
        const uint32_t w = words[2 * c + h];
        packed[2 * h] = pack_bf16(u2f_exact(w & 0xFFu), u2f_exact((w >> 8) & 0xFFu));
        packed[2 * h + 1] = pack_bf16(u2f_exact((w >> 16) & 0xFFu), u2f_exact(w >> 24));
      }
    }
    *reinterpret_cast<uint4*>(stage_b + swz(srow, half * 4 + c)) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
  if (half == 0) {
    stage_scale[srow] = r.scale;
    stage_bias[srow] = r.bias;
  }
}

// ---- activation tile: cp.async of the split rows -------------------------------------------
// Thread t copies chunk t % 8 of tile rows t / 8 + 32 i, from the hi and the lo part, and the
// chunk-0 threads the row's group sum. a_src[i]: that row of the split workspace (act_ld(K)
// layout), or nullptr for a row past the end, which is zero-filled (src-size 0: nothing is
// read, but the instruction still gets a valid global address, `fallback`, 16-byte aligned).
template <int BM>
__device__ __forceinline__ void load_act(__nv_bfloat16* stage_hi, __nv_bfloat16* stage_lo, float* stage_xsum,
                                         const __nv_bfloat16* const (&a_src)[BM / 32], const __nv_bfloat16* fallback,
                                         int kt, int K) {
  const int chunk = threadIdx.x & 7;
  const int row0 = threadIdx.x >> 3;
#pragma unroll
  for (int i = 0; i < BM / 32; ++i) {
    const int row = row0 + 32 * i;
    const __nv_bfloat16* src = a_src[i];
    const bool ok = src != nullptr;
    const int bytes = ok ? 16 : 0;
    const __nv_bfloat16* hi = ok ? src + kt * kBK + chunk * 8 : fallback;
    const __nv_bfloat16* lo = ok ? hi + K : fallback;
    cp_async16(smem_u32(stage_hi + swz(row, chunk)), hi, bytes);
    cp_async16(smem_u32(stage_lo + swz(row, chunk)), lo, bytes);
    if (chunk == 0) {
      const void* xs = ok ? static_cast<const void*>(reinterpret_cast<const float*>(src + 2 * K) + kt)
                          : static_cast<const void*>(fallback);
      cp_async4(smem_u32(stage_xsum + row), xs, ok ? 4 : 0);
    }
  }
}

// ---- the main loop -------------------------------------------------------------------------
// acc[mi][ni][c]: warp (wm, wn) = (warp / 4, warp % 4), lane (g, q) = (lane / 4, lane % 4):
// tile row (activation row, MMA M) wm * BM/2 + mi * 16 + g + 8 * (c >= 2), tile column (weight
// row, MMA N) wn * 32 + ni * 8 + 2 q + (c & 1). K = k_tiles * 64 columns.
template <int BM, int BITS>
__device__ __forceinline__ void mainloop(const __nv_bfloat16* const (&a_src)[BM / 32],
                                         const __nv_bfloat16* fallback, const WeightRow& wrow,
                                         int k_tiles, __nv_bfloat16* smem, float (&acc)[BM / 32][4][4]) {
  using T = Tile<BM>;
  // Stage s: A hi at smem + s * kStageA, A lo at smem + (2 + s) * kStageA, B at
  // smem + 4 * kStageA + s * kStageB; scale / bias / xsum at sf + s * kBN, sf + (2 + s) * kBN,
  // sf + 4 * kBN + s * BM (computed, not indexed arrays, which would live in local memory).
  __nv_bfloat16* const sa0 = smem;
  __nv_bfloat16* const sl0 = smem + 2 * T::kStageA;
  __nv_bfloat16* const sb0 = smem + 4 * T::kStageA;
  float* const ss0 = reinterpret_cast<float*>(smem + 4 * T::kStageA + 2 * T::kStageB);
  float* const sbias0 = ss0 + 2 * kBN;
  float* const sx0 = ss0 + 4 * kBN;
  const int K = k_tiles * kBK;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp >> 2;
  const int wn = warp & 3;
  const int b_row = tid >> 1;  // this thread's weight-tile row for loads
  const int b_half = tid & 1;

#pragma unroll
  for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.0f;

  WeightRegs<BITS> wr;
  load_act<BM>(sa0, sl0, sx0, a_src, fallback, 0, K);
  cp_async_commit();
  load_weight<BITS>(wrow, b_half, 0, wr);
  store_weight<BITS>(sb0, ss0, sbias0, b_row, b_half, wr);
  cp_async_wait_all();
  __syncthreads();

  // ldmatrix lane roles. A (x4 = rows 0-7/8-15 x k 0-7/8-15 of one m16 tile):
  // lane l addresses tile row (l & 15), k chunk (l >> 4). B (x4 = two n8 tiles x k lo/hi):
  // lane l addresses weight row ((l >> 4) << 3) + (l & 7), k chunk (l >> 3) & 1.
  const int a_lrow = wm * (BM / 2) + (lane & 15);
  const int a_lchunk = lane >> 4;
  const int b_lrow = wn * 32 + ((lane >> 4) << 3) + (lane & 7);
  const int b_lchunk = (lane >> 3) & 1;
  // Epilogue roles (the accumulator fragment): weight rows (tile columns) wn*32 + ni*8 + 2q + {0,1},
  // activation rows (tile rows) wm*BM/2 + mi*16 + g + {0,8}.
  const int e_col = wn * 32 + 2 * (lane & 3);
  const int e_row = wm * (BM / 2) + (lane >> 2);

  for (int kt = 0; kt < k_tiles; ++kt) {
    const int cur = kt & 1;
    const bool more = kt + 1 < k_tiles;
    if (more) {
      const int nxt = cur ^ 1;
      load_act<BM>(sa0 + nxt * T::kStageA, sl0 + nxt * T::kStageA, sx0 + nxt * BM, a_src, fallback, kt + 1, K);
      cp_async_commit();
      load_weight<BITS>(wrow, b_half, kt + 1, wr);
    }
    const uint32_t a_base = smem_u32(sa0 + cur * T::kStageA);
    const uint32_t l_base = smem_u32(sl0 + cur * T::kStageA);
    const uint32_t b_base = smem_u32(sb0 + cur * T::kStageB);
    float accg[T::kMI][4][4];  // this group: sum_c q[n, c] (hi + lo)[m, c]
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[T::kMI][4];
      uint32_t bfr[4][2];
#pragma unroll
      for (int nj = 0; nj < 2; ++nj) {
        const int row = b_lrow + nj * 16;
        uint32_t r[4];
        ldmatrix_x4(r, b_base + 2u * static_cast<uint32_t>(swz(row, ks * 2 + b_lchunk)));
        bfr[2 * nj][0] = r[0];
        bfr[2 * nj][1] = r[1];
        bfr[2 * nj + 1][0] = r[2];
        bfr[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < T::kMI; ++mi) {
        const int row = a_lrow + mi * 16;
        ldmatrix_x4(af[mi], a_base + 2u * static_cast<uint32_t>(swz(row, ks * 2 + a_lchunk)));
      }
#pragma unroll
      for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          if (ks == 0) {
            mma_bf16_zero(accg[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
          } else {
            mma_bf16(accg[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
          }
        }
#pragma unroll
      for (int mi = 0; mi < T::kMI; ++mi) {
        const int row = a_lrow + mi * 16;
        ldmatrix_x4(af[mi], l_base + 2u * static_cast<uint32_t>(swz(row, ks * 2 + a_lchunk)));
      }
#pragma unroll
      for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_bf16(accg[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
    }
    // Group epilogue: acc += s[n] * accg + b[n] * xsum[m] (stage cur's f32 side arrays; the
    // other stage is the one being written).
    {
      const float* sc = ss0 + cur * kBN + e_col;
      const float* bi = sbias0 + cur * kBN + e_col;
      const float* xs = sx0 + cur * BM + e_row;
      float2 s2[4];
      float2 b2[4];
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        s2[ni] = *reinterpret_cast<const float2*>(sc + ni * 8);
        b2[ni] = *reinterpret_cast<const float2*>(bi + ni * 8);
      }
#pragma unroll
      for (int mi = 0; mi < T::kMI; ++mi) {
        const float x0 = xs[mi * 16];
        const float x1 = xs[mi * 16 + 8];
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          acc[mi][ni][0] = fmaf(s2[ni].x, accg[mi][ni][0], fmaf(b2[ni].x, x0, acc[mi][ni][0]));
          acc[mi][ni][1] = fmaf(s2[ni].y, accg[mi][ni][1], fmaf(b2[ni].y, x0, acc[mi][ni][1]));
          acc[mi][ni][2] = fmaf(s2[ni].x, accg[mi][ni][2], fmaf(b2[ni].x, x1, acc[mi][ni][2]));
          acc[mi][ni][3] = fmaf(s2[ni].y, accg[mi][ni][3], fmaf(b2[ni].y, x1, acc[mi][ni][3]));
        }
      }
    }
    if (more) {
      const int nxt = cur ^ 1;
      store_weight<BITS>(sb0 + nxt * T::kStageB, ss0 + nxt * kBN, sbias0 + nxt * kBN, b_row, b_half, wr);
    }
    cp_async_wait_all();
    __syncthreads();
  }
}

// Host: the split activation copy of `rows` rows of K f32 values (x row-major, stride K,
// K % 64 == 0) into dst (rows * act_ld(K) BF16 elements, 16-byte aligned): per row hi = bf16(x),
// lo = bf16(x - hi), and the f32 sum of x over each 64-column group. Defined in quant_gemm.cu.
void split_act(const float* x, int64_t rows, int64_t K, __nv_bfloat16* dst, Stream s);

// Host: opt kernel K into `bytes` of dynamic shared memory (once per kernel; a host-side
// attribute, not a stream operation).
template <auto K>
inline void allow_smem(int bytes) {
  static const cudaError_t status = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  LILY_CUDA_CHECK(status);
}

inline size_t align256(size_t bytes) { return (bytes + 255) & ~static_cast<size_t>(255); }

}  // namespace lily::cuda::gemm_detail

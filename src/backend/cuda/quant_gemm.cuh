// Private to quant_gemm.cu and moe_grouped.cu: the tensor-core main loop shared by the dense
// prefill GEMM and the grouped (per-expert) MoE GEMMs.
//
// C[m, n] = sum_k A[m, k] * W[n, k]: A = activations already rounded to BF16 (row-major, K
// contiguous; rows may be gathered), W = an MLX affine Q4/Q8 weight dequantised per tile to
// BF16 (round(scale * q + bias), computed in f32) in shared memory. mma.sync m16n8k16
// (bf16 x bf16 -> f32), so it runs on sm_80..sm_90a alike.
//
// Block tile: BM activation rows (64 or 128) x 128 weight rows x 64 K (one quant group), 8 warps
// in a 2 (M) x 4 (N) grid, warp tile (BM/2) x 32. Two shared-memory stages: while the tensor
// cores work on stage k, the next activation tile streams in with cp.async and the next weight
// codes are already in registers (dequantised into the other stage after the MMAs).
// Shared rows are 128 bytes (8 chunks of 16 B); chunk c of row r lives at chunk c ^ (r & 7), so
// both ldmatrix (8 rows, same chunk) and the 16-byte stores are bank-conflict free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace lily::cuda::gemm_detail {

inline constexpr int kThreads = 256;  // 8 warps
inline constexpr int kBN = 128;       // weight rows per block tile
inline constexpr int kBK = 64;        // K per stage = one quant group

template <int BM>
struct Tile {
  static_assert(BM == 64 || BM == 128, "BM is 64 or 128");
  static constexpr int kMI = BM / 32;                // m16 tiles per warp (warp tile BM/2 rows)
  static constexpr int kNI = 4;                      // n8 tiles per warp (warp tile 32 rows)
  static constexpr int kARowsPerThread = BM / 32;    // A tile: BM rows x 8 chunks / 256 threads
  static constexpr int kStageA = BM * kBK;           // bf16 elements per A stage
  static constexpr int kStageB = kBN * kBK;          // bf16 elements per B stage
  static constexpr int kSmemBytes = 2 * (kStageA + kStageB) * 2;  // 2 stages, 2 B per bf16
};

// ---- PTX wrappers -------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes = 0 writes 16 zero bytes (no read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// D = A B + D, m16n8k16, A row-major bf16, B "col" (n-major, k contiguous) bf16, f32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Element offset (in bf16) of 16-byte chunk `chunk` (0..7) of shared row `row` (XOR swizzle).
__device__ __forceinline__ int swz(int row, int chunk) { return row * kBK + ((chunk ^ (row & 7)) << 3); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Exact float of a small unsigned integer (< 2^23): 2^23 + q as bits, minus 2^23.
__device__ __forceinline__ float u2f_exact(uint32_t q) {
  return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

// ---- weight tile: codes in registers, then dequantised into shared memory -----------------
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

// Writes the 32 dequantised values as 4 chunks (half * 4 + 0..3) of shared row `srow`.
template <int BITS>
__device__ __forceinline__ void store_weight(__nv_bfloat16* stage_b, int srow, int half, const WeightRegs<BITS>& r) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(r.v);
#pragma unroll
  for (int c = 0; c < 4; ++c) {  // chunk c: elements 8c .. 8c+7 of this thread's 32
    uint32_t packed[4];
    if constexpr (BITS == 4) {
      const uint32_t w = words[c];  // element 8w+j in bits 4j..4j+3
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float lo = fmaf(r.scale, u2f_exact((w >> (8 * j)) & 0xFu), r.bias);
        const float hi = fmaf(r.scale, u2f_exact((w >> (8 * j + 4)) & 0xFu), r.bias);
        packed[j] = pack_bf16(lo, hi);
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // two words of 4 codes each: element 4w+j in bits 8j..8j+7
        const uint32_t w = words[2 * c + h];
        const float q0 = fmaf(r.scale, u2f_exact(w & 0xFFu), r.bias);
        const float q1 = fmaf(r.scale, u2f_exact((w >> 8) & 0xFFu), r.bias);
        const float q2 = fmaf(r.scale, u2f_exact((w >> 16) & 0xFFu), r.bias);
        const float q3 = fmaf(r.scale, u2f_exact(w >> 24), r.bias);
        packed[2 * h] = pack_bf16(q0, q1);
        packed[2 * h + 1] = pack_bf16(q2, q3);
      }
    }
    *reinterpret_cast<uint4*>(stage_b + swz(srow, half * 4 + c)) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

// ---- activation tile: cp.async of BF16 rows ------------------------------------------------
// Thread t copies chunk t % 8 of tile rows t / 8 + 32 i. a_src[i]: that row's BF16 values, or
// nullptr for a row past the end, which is zero-filled (src-size 0: nothing is read, but the
// instruction still gets a valid global address, `fallback`).
template <int BM>
__device__ __forceinline__ void load_act(__nv_bfloat16* stage_a, const __nv_bfloat16* const (&a_src)[BM / 32],
                                         const __nv_bfloat16* fallback, int kt) {
  const int chunk = threadIdx.x & 7;
  const int row0 = threadIdx.x >> 3;
#pragma unroll
  for (int i = 0; i < BM / 32; ++i) {
    const int row = row0 + 32 * i;
    const __nv_bfloat16* src = a_src[i];
    const bool ok = src != nullptr;
    cp_async16(smem_u32(stage_a + swz(row, chunk)), ok ? src + kt * kBK + chunk * 8 : fallback, ok ? 16 : 0);
  }
}

// ---- the main loop -------------------------------------------------------------------------
// acc[mi][ni][c]: warp (wm, wn) = (warp / 4, warp % 4), lane (g, q) = (lane / 4, lane % 4):
// tile row wm * BM/2 + mi * 16 + g + 8 * (c >= 2), tile column wn * 32 + ni * 8 + 2 q + (c & 1).
template <int BM, int BITS>
__device__ __forceinline__ void mainloop(const __nv_bfloat16* const (&a_src)[BM / 32],
                                         const __nv_bfloat16* fallback, const WeightRow& wrow,
                                         int k_tiles, __nv_bfloat16* smem, float (&acc)[BM / 32][4][4]) {
  using T = Tile<BM>;
  // Stage s: A at smem + s * kStageA, B at smem + 2 * kStageA + s * kStageB (computed, not
  // indexed arrays, which would live in local memory).
  __nv_bfloat16* const sa0 = smem;
  __nv_bfloat16* const sb0 = smem + 2 * T::kStageA;

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
  load_act<BM>(sa0, a_src, fallback, 0);
  cp_async_commit();
  load_weight<BITS>(wrow, b_half, 0, wr);
  store_weight<BITS>(sb0, b_row, b_half, wr);
  cp_async_wait_all();
  __syncthreads();

  // ldmatrix lane roles. A (x4 = rows 0-7/8-15 x k 0-7/8-15 of one m16 tile):
  // lane l addresses tile row (l & 15), k chunk (l >> 4). B (x4 = two n8 tiles x k lo/hi):
  // lane l addresses weight row ((l >> 4) << 3) + (l & 7), k chunk (l >> 3) & 1.
  const int a_lrow = wm * (BM / 2) + (lane & 15);
  const int a_lchunk = lane >> 4;
  const int b_lrow = wn * 32 + ((lane >> 4) << 3) + (lane & 7);
  const int b_lchunk = (lane >> 3) & 1;

  for (int kt = 0; kt < k_tiles; ++kt) {
    const int cur = kt & 1;
    const bool more = kt + 1 < k_tiles;
    if (more) {
      load_act<BM>(sa0 + (cur ^ 1) * T::kStageA, a_src, fallback, kt + 1);
      cp_async_commit();
      load_weight<BITS>(wrow, b_half, kt + 1, wr);
    }
    const uint32_t a_base = smem_u32(sa0 + cur * T::kStageA);
    const uint32_t b_base = smem_u32(sb0 + cur * T::kStageB);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[T::kMI][4];
      uint32_t bfr[4][2];
#pragma unroll
      for (int mi = 0; mi < T::kMI; ++mi) {
        const int row = a_lrow + mi * 16;
        ldmatrix_x4(af[mi], a_base + 2u * static_cast<uint32_t>(swz(row, ks * 2 + a_lchunk)));
      }
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
      for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_bf16(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
    }
    if (more) store_weight<BITS>(sb0 + (cur ^ 1) * T::kStageB, b_row, b_half, wr);
    cp_async_wait_all();
    __syncthreads();
  }
}

// Host: the BF16 copy (round to nearest even) of `count` f32 activations (count a multiple of
// 4, both buffers 16-byte aligned). Defined in quant_gemm.cu.
void to_bf16(const float* x, int64_t count, __nv_bfloat16* dst, cudaStream_t s);

// Host: opt kernel K into `bytes` of dynamic shared memory (once per kernel; a host-side
// attribute, not a stream operation).
template <auto K>
inline void allow_smem(int bytes) {
  static const cudaError_t status = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  LILY_CUDA_CHECK(status);
}

inline size_t align256(size_t bytes) { return (bytes + 255) & ~static_cast<size_t>(255); }

}  // namespace lily::cuda::gemm_detail

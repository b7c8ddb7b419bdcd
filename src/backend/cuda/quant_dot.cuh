// Device helpers of the decode GEMV kernels (quant_gemv.cu, moe_gemv.cu): streaming weight
// loads, exact MLX affine code extraction, and the per-chunk dot of a few rows with a few inputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace lily::cuda::gemv_detail {

// A "chunk" is what one lane reads with one 16-byte load: 4 code words, 32 Q4 or 16 Q8 values.
// Rows are in * Bits / 8 bytes with in % 64 == 0, so every chunk of every row is 16-byte
// aligned when the codes array is (QuantMatrix arrays are 256-byte aligned).
template <int Bits>
struct Chunk {
  static constexpr int kValues = 128 / Bits;              // values per chunk: 32 (Q4), 16 (Q8)
  static constexpr int kPerWord = 32 / Bits;              // values per u32 word: 8, 4
  static constexpr int kPerGroup = kGroupSize / kValues;  // chunks per group of 64: 2, 4
};

// Lanes that share one row: the smallest power of two >= the row's chunk count, at most 32.
// (A power of two so that the xor-shuffle reduction stays inside each lane segment.)
__host__ __device__ inline int lanes_for_chunks(int64_t chunks) {
  int lanes = 1;
  while (lanes < chunks && lanes < 32) lanes *= 2;
  return lanes;
}

// Weights are read exactly once per step: load them through the read-only path without
// allocating in L1, so that the activations (re-read by every warp) stay cached there.
__device__ __forceinline__ uint4 load_stream(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float load_bf16(const __nv_bfloat16* p) {
  return __bfloat162float(__ldg(p));
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;  // w is a constant after unrolling
}

// N consecutive activations (f32) through the read-only cache; `vec` when p is 16-byte aligned.
template <int N>
__device__ __forceinline__ void load_x(const float* p, bool vec, float (&x)[N]) {
  static_assert(N % 4 == 0, "whole float4s");
  if (vec) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p) + i);
      x[4 * i + 0] = v.x;
      x[4 * i + 1] = v.y;
      x[4 * i + 2] = v.z;
      x[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = __ldg(p + i);
  }
}

// (a & mask) | bits as one instruction. Written as PTX lop3: given an AND and an OR with two
// constants, ptxas emitted two LOP3s per code (SASS LOP3 takes one immediate), which made the
// code extraction half the instructions of the streamed lm_head and its busiest (ALU) pipe;
// here one of the constants has to live in a register, and one LOP3 remains.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t bits) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(bits));  // (a&b)|c
  return d;
}

// The codes of one word as exact floats, without an int->float conversion (I2F issues at a
// quarter rate and would make the loop issue bound). OR-ing an integer m < 2^23 into the
// mantissa of 2^23 gives the float 2^23 + m exactly. The code is left in place (m = q * 16^j
// for nibble j), so one LOP3 extracts it, and one FMA by the exact power of two 16^-j with
// -2^23 * 16^-j recovers q exactly. Nibbles 4..7 are first shifted down 16 bits (one shift
// per word) so that m stays below 2^23. Q8 is the same with bytes (256^-j, j = 0, 1).
template <int Bits>
__device__ __forceinline__ void decode_word(uint32_t word, float (&q)[32 / Bits]) {
  constexpr uint32_t kMagic = 0x4B000000u;  // 2^23 as f32
  constexpr float kTwo23 = 8388608.0f;
  constexpr int kHalf = 16 / Bits;  // codes in each 16-bit half: 4 (Q4), 2 (Q8)
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  const uint32_t hi = word >> 16;
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const float inv = 1.0f / static_cast<float>(1u << (Bits * j));  // exact power of two
    const uint32_t mask = kMask << (Bits * j);
    q[j] = fmaf(__uint_as_float(and_or(word, mask, kMagic)), inv, -kTwo23 * inv);
    q[j + kHalf] = fmaf(__uint_as_float(and_or(hi, mask, kMagic)), inv, -kTwo23 * inv);
  }
}

// ---- activations ----------------------------------------------------------------------
// The kernels read activations as "flat chunks": chunk c of an f32 array is its values
// c * kValues .. c * kValues + kValues - 1, so token t's chunk j of a row of `in` values is
// t * (in / kValues) + j. Two sources give the values of one code word of a chunk:
//
// GlobalActs reads them from global memory through L1. Each lane of a warp reads a different
// chunk, so one float4 load touches 32 cache lines: 32 L1 wavefronts per instruction, which
// bounds a GEMV that serves few rows per activation load (measured on an H200: a 2048 x 4096
// Q4 GEMV with 2 rows per lane ran at 0.5 TB/s).
struct GlobalActs {
  const float* x;
  bool vec;  // x is 16-byte aligned
  template <int Bits, int P>
  __device__ __forceinline__ void load(int64_t chunk, int w, float (&xw)[P]) const {
    load_x<P>(x + chunk * Chunk<Bits>::kValues + w * P, vec, xw);
  }
};

// SharedActs reads them from the block's copy in shared memory, staged once per block by
// stage_acts with a swizzle: float4 m of chunk c sits at c * F + (m ^ (c % F)), F = float4s
// per chunk. Lanes reading float4 m of consecutive chunks then hit distinct bank groups, so
// a warp's load takes the minimum 4 wavefronts instead of 32.
template <int Bits>
__device__ __forceinline__ int64_t swizzled_float4(int64_t chunk, int m) {
  constexpr int F = Chunk<Bits>::kValues / 4;  // 8 (Q4), 4 (Q8)
  return chunk * F + (m ^ static_cast<int>(chunk & (F - 1)));
}

struct SharedActs {
  const float4* xs;
  template <int Bits, int P>
  __device__ __forceinline__ void load(int64_t chunk, int w, float (&xw)[P]) const {
    constexpr int kPerWord = P / 4;  // float4s per code word: 2 (Q4), 1 (Q8)
#pragma unroll
    for (int i = 0; i < kPerWord; ++i) {
      const float4 v = xs[swizzled_float4<Bits>(chunk, w * kPerWord + i)];
      xw[4 * i + 0] = v.x;
      xw[4 * i + 1] = v.y;
      xw[4 * i + 2] = v.z;
      xw[4 * i + 3] = v.w;
    }
  }
};

// Copies `count` activations (a multiple of the chunk size) from src into the block's shared
// copy at dst, from flat chunk `first_chunk` on, swizzled for SharedActs. Every thread of the
// block calls it; the caller syncs the block before reading.
template <int Bits>
__device__ __forceinline__ void stage_acts(const float* src, int64_t count, bool vec,
                                           int64_t first_chunk, float4* dst) {
  constexpr int F = Chunk<Bits>::kValues / 4;
  for (int64_t f = threadIdx.x; f < count / 4; f += blockDim.x) {
    float4 v;
    if (vec) {
      v = __ldg(reinterpret_cast<const float4*>(src) + f);
    } else {
      v = make_float4(__ldg(src + 4 * f), __ldg(src + 4 * f + 1), __ldg(src + 4 * f + 2),
                      __ldg(src + 4 * f + 3));
    }
    dst[swizzled_float4<Bits>(first_chunk + f / F, static_cast<int>(f % F))] = v;
  }
}

// acc[i][t] += row_i(chunk) . x_t(chunk) for R rows and NT inputs of one chunk, using
// s * sum(q x) + b * sum(x) per row (the chunk lies in one group): the inner loop is one
// extraction per code and one FMA per (code, input). Each code word is decoded once and used
// for all NT inputs; each activation is loaded once and used for all R rows.
// q, s, b: the rows' codes, scales, biases; chunk[t]: input t's flat chunk in `acts`.
template <int Bits, int R, int NT, typename Acts>
__device__ __forceinline__ void chunk_dot(const uint4 (&q)[R], const float (&s)[R],
                                          const float (&b)[R], const Acts& acts,
                                          const int64_t (&chunk)[NT], float (&acc)[R][NT]) {
  constexpr int kPerWord = Chunk<Bits>::kPerWord;
  float d[R][NT];
  float xsum[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    xsum[t] = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i) d[i][t] = 0.0f;
  }
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float xw[NT][kPerWord];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      acts.template load<Bits, kPerWord>(chunk[t], w, xw[t]);
#pragma unroll
      for (int j = 0; j < kPerWord; ++j) xsum[t] += xw[t][j];
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float c[kPerWord];
      decode_word<Bits>(word_of(q[i], w), c);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int j = 0; j < kPerWord; ++j) d[i][t] = fmaf(c[j], xw[t][j], d[i][t]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[i][t] += fmaf(s[i], d[i][t], b[i] * xsum[t]);
  }
}

// Sum over an aligned segment of `lanes` lanes (a power of two <= 32); every lane of the warp
// must call it. Each lane gets its segment's sum.
__device__ __forceinline__ float segment_sum(float v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// The weights of U chunks (c0, c0 + stride, ...) of R rows: codes, scales and biases, loaded
// before any is used, so each lane keeps U * R 16-byte loads in flight.
template <int R, int U>
struct WeightBatch {
  uint4 q[U][R];
  float s[U][R];
  float b[U][R];
};

// codes/scales/biases[i]: row i's first code word, scale and bias. Chunks >= chunks load as 0.
template <int Bits, int R, int U>
__device__ __forceinline__ void load_batch(const uint32_t* const (&codes)[R],
                                           const __nv_bfloat16* const (&scales)[R],
                                           const __nv_bfloat16* const (&biases)[R], int chunks,
                                           int c0, int stride, WeightBatch<R, U>& w) {
  using C = Chunk<Bits>;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = c0 + u * stride;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (c < chunks) {
        w.q[u][i] = load_stream(codes[i] + 4 * c);
        w.s[u][i] = load_bf16(scales[i] + c / C::kPerGroup);
        w.b[u][i] = load_bf16(biases[i] + c / C::kPerGroup);
      } else {
        w.q[u][i] = make_uint4(0, 0, 0, 0);
        w.s[u][i] = 0.0f;
        w.b[u][i] = 0.0f;
      }
    }
  }
}

// acc += the batch's rows . inputs; row_chunk[t]: input t's flat chunk 0 in `acts`.
template <int Bits, int R, int NT, int U, typename Acts>
__device__ __forceinline__ void dot_batch(const WeightBatch<R, U>& w, const Acts& acts,
                                          const int64_t (&row_chunk)[NT], int chunks, int c0,
                                          int stride, float (&acc)[R][NT]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = c0 + u * stride;
    if (c < chunks) {
      int64_t chunk[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) chunk[t] = row_chunk[t] + c;
      chunk_dot<Bits, R, NT>(w.q[u], w.s[u], w.b[u], acts, chunk, acc);
    }
  }
}

// Partial dots of R rows with NT inputs over the chunks c = first, first + stride, ... < chunks,
// U chunks per trip to memory.
template <int Bits, int R, int NT, int U, typename Acts>
__device__ __forceinline__ void rows_dot(const uint32_t* const (&codes)[R],
                                         const __nv_bfloat16* const (&scales)[R],
                                         const __nv_bfloat16* const (&biases)[R],
                                         const Acts& acts, const int64_t (&row_chunk)[NT],
                                         int chunks, int first, int stride, float (&acc)[R][NT]) {
  for (int c0 = first; c0 < chunks; c0 += U * stride) {
    WeightBatch<R, U> w;
    load_batch<Bits, R, U>(codes, scales, biases, chunks, c0, stride, w);
    dot_batch<Bits, R, NT, U>(w, acts, row_chunk, chunks, c0, stride, acc);
  }
}

}  // namespace lily::cuda::gemv_detail

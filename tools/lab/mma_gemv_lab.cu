// Kernel lab (not a test, not built by default): a Q4 decode GEMV on the tensor cores, with
// the activations as three exact int8 planes, against today's CUDA-core gemv_batch: values
// (both against a float64 reference) and time, on the model's projection shapes.
//
// Why: the step timeline and Nsight (docs/perf/bench-cuda.md) say the 2,048-wide projections
// and the MoE block are issue-bound, not DRAM-bound: the MoE block runs as long with its
// weights in L2 as from DRAM (moe_layer_lab's timeline states). The CUDA-core dot spends about
// three instructions per weight (extract, exact decode, FMA). Here a weight costs 3/8 of an
// instruction (two LOP3 and a shift turn 8 nibbles into 8 int8 lanes) and the products run on
// the tensor cores (mma.m16n8k32 s8: 16 rows x 32 weights x 8 columns, of which three hold
// the activation planes).
//
// Exactness: per group of 64 activations, e = ilogb(max |x|) - 21 and X = rint(x / 2^e), a
// 23-bit signed integer written as three signed base-256 digits p0 * 65536 + p1 * 256 + p2.
// Each element is then off by at most 2^(e-1) <= max|x| * 2^-22, and the integer dot of the
// codes with each plane is exact in int32; the float work is one combine per (row, group).
// Build: cmake -DLILY_BUILD_LAB=ON, target mma_gemv_lab; run: build/mma_gemv_lab.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "lab_support.cuh"

using namespace lily::cuda;
using namespace lily::cuda::lab;

namespace {

constexpr int kPlanes = 3;

// One warp writes group `group` of x as plane bytes in B-fragment order: [group][h][plane][c]
// [2 words], byte i of word j holding the activation at group offset 16c + 8h + 2i + j (j = 0:
// the even nibbles of a code word, j = 1: the odd ones; see mma_gemv_kernel), with
// gexp[group] = 2^e and xsum[group] = the sum of the group's x.
__device__ __forceinline__ void write_group_planes(const float* x, int64_t group, int8_t* planes,
                                                   float* gexp, float* xsum) {
  const int lane = threadIdx.x & 31;
  const float v[2] = {x[group * 64 + lane], x[group * 64 + lane + 32]};
  float m = fmaxf(fabsf(v[0]), fabsf(v[1]));
  float s = v[0] + v[1];
  for (int o = 16; o > 0; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  const int e = m > 0.0f ? ilogbf(m) - 21 : 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int o = lane + 32 * r;  // offset in the group: 16c + 8h + 2i + j
    const int X = __float2int_rn(ldexpf(v[r], -e));
    const int p2 = (X << 24) >> 24;
    const int X1 = (X - p2) >> 8;
    const int p1 = (X1 << 24) >> 24;
    const int p0 = (X1 - p1) >> 8;
    const int c = o / 16, h = (o / 8) & 1, i = (o / 2) & 3, j = o & 1;
    const int p[kPlanes] = {p0, p1, p2};
#pragma unroll
    for (int pl = 0; pl < kPlanes; ++pl) {
      planes[((((group * 2 + h) * kPlanes + pl) * 4 + c) * 2 + j) * 4 + i] =
          static_cast<int8_t>(p[pl]);
    }
  }
  if (lane == 0) {
    gexp[group] = ldexpf(1.0f, e);
    xsum[group] = s;
  }
}

// The planes of x [in] into global memory: one warp per group.
__global__ void planes_kernel(const float* x, int64_t in, int8_t* planes, float* gexp,
                              float* xsum) {
  const int64_t group = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (group < in / 64) write_group_planes(x, group, planes, gexp, xsum);
}

__device__ __forceinline__ uint2 load_codes(const uint32_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
               : "=r"(v.x), "=r"(v.y)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// U bf16 values (U = 4 or 8), 8- or 16-byte aligned, as floats.
template <int U>
__device__ __forceinline__ void load_bf16s(const __nv_bfloat16* p, float (&v)[U]) {
  static_assert(U == 4 || U == 8, "one 8- or 16-byte load");
  uint32_t w[U / 2];
  if constexpr (U == 8) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = q.x, w[1] = q.y, w[2] = q.z, w[3] = q.w;
  } else {
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = q.x, w[1] = q.y;
  }
#pragma unroll
  for (int i = 0; i < U / 2; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// The activation planes of groups [0, G) of x into shared memory, with 2^e and the group
// sums: the block's warps take the groups in turn.
__device__ __forceinline__ void stage_planes(const float* x, int64_t G, int8_t* frag, float* sexp,
                                             float* ssum) {
  const int warps = blockDim.x / 32;
  for (int64_t group = threadIdx.x / 32; group < G; group += warps) {
    write_group_planes(x, group, frag, sexp, ssum);
  }
}

// y = W x for a Q4 matrix of `rows` (a multiple of 16) x `in`. A warp takes 16 rows (lanes:
// g = lane / 4 owns rows g and g + 8, c = lane % 4 the bytes 8c..8c+7 of each row's 32-byte
// group) over 1/KSPLIT of the groups, U groups per trip to memory; the KSPLIT warps of a tile
// add their rows in a fixed order through shared memory. The block first issues its first
// trip's weight loads, then turns x into planes (in the block, no separate launch), so the
// two latencies overlap.
template <int KSPLIT, int TILES, int U, bool IN_BLOCK>
__global__ void __launch_bounds__(KSPLIT* TILES * 32)
    mma_gemv_kernel(QuantMatrix w, int64_t rows, const float* x, const int8_t* planes,
                    const float* gexp, const float* xsum, float* y) {
  extern __shared__ uint32_t smem[];
  const int64_t G = w.in / 64;
  uint32_t* frag = smem;                                                   // [G][2][3][4][2] words
  float* sexp = reinterpret_cast<float*>(frag + G * 2 * kPlanes * 4 * 2);  // [G]
  float* ssum = sexp + G;                                                  // [G]
  float* partial = ssum + G;  // [KSPLIT * TILES warps][16]
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x * int64_t(TILES) + warp / KSPLIT;
  const int part = warp % KSPLIT;
  const int64_t per_part = G / KSPLIT;
  const int64_t g0 = part * per_part;
  const int64_t r0 = tile * 16;
  const bool live = r0 < rows;
  const int64_t ra = live ? r0 + g : 0, rb = live ? r0 + g + 8 : 0;
  const int64_t words = w.in / 8;
  const uint32_t* ca = w.codes + ra * words + 2 * c;  // group gi: + 8 * gi words
  const uint32_t* cb = w.codes + rb * words + 2 * c;
  uint2 qa[U], qb[U];
  float sa[U], ba[U], sb[U], bb[U];
  const auto load_trip = [&](int64_t gi0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      qa[u] = load_codes(ca + 8 * (gi0 + u));
      qb[u] = load_codes(cb + 8 * (gi0 + u));
    }
    load_bf16s<U>(w.scales + ra * G + gi0, sa);
    load_bf16s<U>(w.biases + ra * G + gi0, ba);
    load_bf16s<U>(w.scales + rb * G + gi0, sb);
    load_bf16s<U>(w.biases + rb * G + gi0, bb);
  };
  load_trip(g0);
  if constexpr (IN_BLOCK) {
    stage_planes(x, G, reinterpret_cast<int8_t*>(frag), sexp, ssum);
  } else {
    for (int64_t i = threadIdx.x; i < G * 2 * kPlanes * 4 * 2; i += blockDim.x) {
      frag[i] = reinterpret_cast<const uint32_t*>(planes)[i];
    }
    for (int64_t i = threadIdx.x; i < G; i += blockDim.x) {
      sexp[i] = gexp[i];
      ssum[i] = xsum[i];
    }
  }
  __syncthreads();
  // Column weights of the lane's two accumulator columns 2c, 2c + 1: planes 0, 1, 2 in
  // columns 0, 1, 2 (p0 * 65536 + p1 * 256 + p2); the bias term only once per row (c == 0).
  const float wlo = c == 0 ? 65536.0f : c == 1 ? 1.0f : 0.0f;
  const float whi = c == 0 ? 256.0f : 0.0f;
  const bool plane_lane = g < kPlanes;
  float acc_a = 0.0f, acc_b = 0.0f;
  for (int64_t gi0 = g0; gi0 < g0 + per_part; gi0 += U) {
    if (gi0 != g0) load_trip(gi0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t gi = gi0 + u;
      int d[4] = {0, 0, 0, 0};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t wa = h == 0 ? qa[u].x : qa[u].y;
        const uint32_t wb = h == 0 ? qb[u].x : qb[u].y;
        const uint32_t* f = frag + ((gi * 2 + h) * kPlanes + (plane_lane ? g : 0)) * 8 + 2 * c;
        const uint32_t b0 = plane_lane ? f[0] : 0u;
        const uint32_t b1 = plane_lane ? f[1] : 0u;
        mma_s8(d, wa & 0x0F0F0F0Fu, wb & 0x0F0F0F0Fu, (wa >> 4) & 0x0F0F0F0Fu,
               (wb >> 4) & 0x0F0F0F0Fu, b0, b1);
      }
      const float e = sexp[gi];
      const float va = fmaf(static_cast<float>(d[0]), wlo, static_cast<float>(d[1]) * whi);
      const float vb = fmaf(static_cast<float>(d[2]), wlo, static_cast<float>(d[3]) * whi);
      acc_a = fmaf(sa[u] * e, va, acc_a);
      acc_b = fmaf(sb[u] * e, vb, acc_b);
      if (c == 0) {
        acc_a = fmaf(ba[u], ssum[gi], acc_a);
        acc_b = fmaf(bb[u], ssum[gi], acc_b);
      }
    }
  }
  acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 1);
  acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 2);
  acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 1);
  acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 2);
  if (c == 0) {
    partial[warp * 16 + g] = acc_a;
    partial[warp * 16 + g + 8] = acc_b;
  }
  __syncthreads();
  if (part == 0 && lane < 16 && live) {
    float v = 0.0f;
    for (int k = 0; k < KSPLIT; ++k) v += partial[(warp + k) * 16 + lane];
    y[r0 + lane] = v;
  }
}

template <int KSPLIT, int TILES, int U, bool IN_BLOCK>
void mma_gemv(const QuantMatrix& w, int64_t rows, const float* x, const int8_t* planes,
              const float* gexp, const float* xsum, float* y, cudaStream_t s) {
  constexpr int kW = KSPLIT * TILES;
  const int64_t G = w.in / 64;
  const size_t bytes = size_t(G) * 2 * kPlanes * 4 * 2 * 4 + 2 * size_t(G) * 4 + kW * 16 * 4;
  const int64_t tiles = rows / 16;
  mma_gemv_kernel<KSPLIT, TILES, U, IN_BLOCK>
      <<<unsigned((tiles + TILES - 1) / TILES), kW * 32, bytes, s>>>(w, rows, x, planes, gexp, xsum,
                                                                     y);
}

void planes(const float* x, int64_t in, int8_t* pl, float* gexp, float* xsum, cudaStream_t s) {
  const int64_t G = in / 64;
  planes_kernel<<<unsigned((G + 7) / 8), 256, 0, s>>>(x, in, pl, gexp, xsum);
}

// The floor of a GEMV's memory traffic: the same matrix's codes, scales and biases read once
// with 16-byte loads, U in flight per thread, nothing computed but an XOR kept from the
// compiler. Its time is what any kernel streaming these bytes in one launch can approach.
template <int U>
__global__ void __launch_bounds__(256)
    read_only_kernel(const uint4* codes, int64_t n_codes, const uint4* scales, const uint4* biases,
                     int64_t n_groups, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i0 = first; i0 < n_codes; i0 += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = i0 + u * stride;
      v[u] = i < n_codes ? __ldcs(codes + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (int64_t i = first; i < n_groups; i += stride) {
    const uint4 a = __ldcs(scales + i), b = __ldcs(biases + i);
    acc ^= a.x ^ b.y;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// float64 reference of y = W x on the host.
std::vector<double> reference(const QuantMatrix& w, int64_t rows, const std::vector<float>& x) {
  const int64_t words = w.in / 8, G = w.in / 64;
  std::vector<uint32_t> codes(static_cast<size_t>(rows * words));
  std::vector<__nv_bfloat16> sc(static_cast<size_t>(rows * G)), bi(static_cast<size_t>(rows * G));
  LILY_CUDA_CHECK(cudaMemcpy(codes.data(), w.codes, codes.size() * 4, cudaMemcpyDeviceToHost));
  LILY_CUDA_CHECK(cudaMemcpy(sc.data(), w.scales, sc.size() * 2, cudaMemcpyDeviceToHost));
  LILY_CUDA_CHECK(cudaMemcpy(bi.data(), w.biases, bi.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<double> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0.0;
    for (int64_t k = 0; k < w.in; ++k) {
      const uint32_t q = (codes[size_t(r * words + k / 8)] >> (4 * (k % 8))) & 15u;
      const double s = double(__bfloat162float(sc[size_t(r * G + k / 64)]));
      const double b = double(__bfloat162float(bi[size_t(r * G + k / 64)]));
      acc += (s * double(q) + b) * double(x[size_t(k)]);
    }
    y[size_t(r)] = acc;
  }
  return y;
}

double max_error(const std::vector<double>& ref, const float* dev_y, int64_t rows) {
  std::vector<float> y(static_cast<size_t>(rows));
  LILY_CUDA_CHECK(cudaMemcpy(y.data(), dev_y, y.size() * 4, cudaMemcpyDeviceToHost));
  double err = 0.0, scale = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    err = std::max(err, std::fabs(double(y[size_t(r)]) - ref[size_t(r)]));
    scale = std::max(scale, std::fabs(ref[size_t(r)]));
  }
  return err / scale;
}

template <int KSPLIT, int TILES, int U>
void run_shape(const char* name, int64_t rows, int64_t in, cudaStream_t raw) {
  const Stream s{raw, /*pdl=*/true, /*pdl_launches=*/nullptr};
  constexpr int kCopies = 8;  // 8 distinct weight copies per graph: they stream from DRAM
  std::vector<QuantMatrix> ws;
  for (int i = 0; i < kCopies; ++i)
    ws.push_back(matrix(4, 1, rows, in, 77u * uint64_t(i + 1), 0.01f));
  std::vector<float> hx(static_cast<size_t>(in));
  for (int64_t k = 0; k < in; ++k) {
    // Mixed magnitudes: every 13th value 30x larger, some tiny, as after a norm with outliers.
    const double base = double((k * 7919) % 1000) / 1000.0 - 0.5;
    hx[size_t(k)] = float(base * (k % 13 == 0 ? 30.0 : (k % 7 == 0 ? 1e-3 : 1.0)));
  }
  float* x = dev<float>(in);
  LILY_CUDA_CHECK(cudaMemcpy(x, hx.data(), size_t(in) * 4, cudaMemcpyHostToDevice));
  auto* pl = dev<int8_t>(in / 64 * 2 * kPlanes * 4 * 8);
  float* gexp = dev<float>(in / 64);
  float* xsum = dev<float>(in / 64);
  float* y_core = dev<float>(rows);
  float* y_mma = dev<float>(rows);
  const auto core = [&](const QuantMatrix& w) {
    GemvTarget t;
    t.w = w;
    t.rows = rows;
    t.y = y_core;
    gemv_batch(&t, 1, x, 1, s);
  };
  const auto tensor = [&](const QuantMatrix& w) {
    mma_gemv<KSPLIT, TILES, U, true>(w, rows, x, pl, gexp, xsum, y_mma, raw);
  };
  core(ws[0]);
  tensor(ws[0]);
  planes(x, in, pl, gexp, xsum, raw);
  LILY_CUDA_CHECK(cudaStreamSynchronize(raw));
  LILY_CUDA_CHECK(cudaGetLastError());
  const std::vector<double> ref = reference(ws[0], rows, hx);
  std::printf(
      "%s (%lld x %lld, KSPLIT %d, TILES %d, U %d): max |y - ref| / max |ref|: CUDA cores %.3g, "
      "tensor cores %.3g\n",
      name, (long long)rows, (long long)in, KSPLIT, TILES, U, max_error(ref, y_core, rows),
      max_error(ref, y_mma, rows));
  const cudaGraphExec_t g_core = capture(raw, [&] {
    for (auto& w : ws) core(w);
  });
  const cudaGraphExec_t g_tensor = capture(raw, [&] {
    for (auto& w : ws) tensor(w);
  });
  const cudaGraphExec_t g_mma_only = capture(raw, [&] {
    for (auto& w : ws) mma_gemv<KSPLIT, TILES, U, false>(w, rows, x, pl, gexp, xsum, y_mma, raw);
  });
  const double mb = double(rows) * double(in) * 4.5 / 8.0 / 1e6;
  auto* sink = dev<uint32_t>(1);
  int sms = 0;
  LILY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const auto read_only = [&](const QuantMatrix& w, int blocks_per_sm) {
    read_only_kernel<4><<<unsigned(sms * blocks_per_sm), 256, 0, raw>>>(
        reinterpret_cast<const uint4*>(w.codes), rows * in / 32,
        reinterpret_cast<const uint4*>(w.scales), reinterpret_cast<const uint4*>(w.biases),
        rows * in / 64 / 8, sink);
  };
  const cudaGraphExec_t g_read4 = capture(raw, [&] {
    for (auto& w : ws) read_only(w, 4);
  });
  const cudaGraphExec_t g_read8 = capture(raw, [&] {
    for (auto& w : ws) read_only(w, 8);
  });
  for (int round = 0; round < 2; ++round) {
    const float a = time_graph(g_core, raw, 50) / kCopies;
    const float b = time_graph(g_tensor, raw, 50) / kCopies;
    const float c = time_graph(g_mma_only, raw, 50) / kCopies;
    const float r4 = time_graph(g_read4, raw, 50) / kCopies;
    const float r8 = time_graph(g_read8, raw, 50) / kCopies;
    std::printf(
        "  round %d: reading the bytes alone %.2f us (%.2f TB/s) at 4 blocks an SM, %.2f us at 8\n",
        round, r4, mb / r4, r8);
    std::printf(
        "  round %d: CUDA cores %.2f us (%.2f TB/s); tensor cores, planes in the block %.2f us "
        "(%.2f TB/s), planes given %.2f us\n",
        round, a, mb / a, b, mb / b, c);  // MB per us = TB/s
  }
}

}  // namespace

int main() {
  cudaStream_t raw;
  LILY_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  run_shape<4, 2, 8>("input projection", 12352, 2048, raw);
  run_shape<16, 1, 4>("output projection", 2048, 4096, raw);
  run_shape<8, 1, 4>("expert gate|up", 1024, 2048, raw);
  return 0;
}

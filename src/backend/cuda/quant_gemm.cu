// Prefill GEMM on tensor cores: y[t, r] = sum_c W[row_begin + r, c] x[t, c] for any n, with W
// an MLX affine Q4/Q8 weight (group 64) dequantised tile by tile to BF16 in shared memory and
// x rounded to BF16 once (a workspace copy); f32 accumulation. See quant_gemm.cuh for the tile
// design. Accuracy: each product carries the BF16 rounding of the weight and of the
// activation (relative 2^-9 each), so results differ from the exact value by ~1e-3 relative
// (normalised), against ~1e-7 for the f32 GEMV; the f32 accumulation adds nothing visible.
#include "backend/cuda/quant_gemm.cuh"

#include <algorithm>

namespace lily::cuda {
namespace gemm_detail {

namespace {

__global__ void to_bf16_vec_kernel(const float4* __restrict__ x, int64_t count4, uint2* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    out[i] = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
}

__global__ void to_bf16_scalar_kernel(const float* __restrict__ x, int64_t count, __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}

struct DenseParams {
  const __nv_bfloat16* x = nullptr;  // [n, in] BF16
  int64_t n = 0;
  int64_t in = 0;
  QuantMatrix w;
  int64_t row_begin = 0;
  int64_t rows = 0;
  float* y = nullptr;       // [n, rows]
  bool tokens_fast = false; // blockIdx.x walks token tiles (weight tile shared by neighbours)
};

// One block: BM tokens x 128 weight rows, the whole K.
template <int BM, int BITS>
__global__ void __launch_bounds__(kThreads, 2) dense_gemm_kernel(const DenseParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const int64_t m_tile = p.tokens_fast ? blockIdx.x : blockIdx.y;
  const int64_t n_tile = p.tokens_fast ? blockIdx.y : blockIdx.x;
  const int64_t m0 = m_tile * BM;
  const int64_t n0 = n_tile * kBN;
  const int tid = threadIdx.x;

  const __nv_bfloat16* a_src[BM / 32];
#pragma unroll
  for (int i = 0; i < BM / 32; ++i) {
    const int64_t t = m0 + (tid >> 3) + 32 * i;
    a_src[i] = t < p.n ? p.x + t * p.in : nullptr;
  }
  WeightRow wrow;
  const int64_t r = n0 + (tid >> 1);
  if (r < p.rows) wrow = weight_row<BITS>(p.w, p.row_begin + r);

  float acc[BM / 32][4][4];
  mainloop<BM, BITS>(a_src, p.x, wrow, static_cast<int>(p.in / kBK), smem, acc);

  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int q = lane & 3;
  const bool vec = (p.rows % 2 == 0) && ((reinterpret_cast<uintptr_t>(p.y) & 7) == 0);
#pragma unroll
  for (int mi = 0; mi < BM / 32; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = m0 + (warp >> 2) * (BM / 2) + mi * 16 + g + 8 * h;
      if (t >= p.n) continue;
      float* yrow = p.y + t * p.rows;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int64_t col = n0 + (warp & 3) * 32 + ni * 8 + 2 * q;
        const float v0 = acc[mi][ni][2 * h];
        const float v1 = acc[mi][ni][2 * h + 1];
        if (vec && col + 1 < p.rows) {
          *reinterpret_cast<float2*>(yrow + col) = make_float2(v0, v1);
        } else {
          if (col < p.rows) yrow[col] = v0;
          if (col + 1 < p.rows) yrow[col + 1] = v1;
        }
      }
    }
  }
}

template <int BM, int BITS>
void launch_dense(const DenseParams& p, cudaStream_t s) {
  constexpr int kSmem = Tile<BM>::kSmemBytes;
  allow_smem<dense_gemm_kernel<BM, BITS>>(kSmem);
  const auto m_tiles = static_cast<unsigned>((p.n + BM - 1) / BM);
  const auto n_tiles = static_cast<unsigned>((p.rows + kBN - 1) / kBN);
  const dim3 grid = p.tokens_fast ? dim3(m_tiles, n_tiles) : dim3(n_tiles, m_tiles);
  dense_gemm_kernel<BM, BITS><<<grid, kThreads, kSmem, s>>>(p);
  LILY_CUDA_LAUNCH_CHECK();
}

}  // namespace

void to_bf16(const float* x, int64_t count, __nv_bfloat16* dst, cudaStream_t s) {
  if (count <= 0) return;
  const bool aligned = count % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                       (reinterpret_cast<uintptr_t>(dst) & 7) == 0;
  const int64_t items = aligned ? count / 4 : count;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((items + 255) / 256, 8192));
  if (aligned) {
    to_bf16_vec_kernel<<<blocks, 256, 0, s>>>(reinterpret_cast<const float4*>(x), items,
                                              reinterpret_cast<uint2*>(dst));
  } else {
    to_bf16_scalar_kernel<<<blocks, 256, 0, s>>>(x, items, dst);
  }
  LILY_CUDA_LAUNCH_CHECK();
}

}  // namespace gemm_detail

void gemm(const QuantMatrix& w, int64_t row_begin, int64_t rows, const float* x, int64_t n, float* y,
          Workspace& ws, cudaStream_t s) {
  using namespace gemm_detail;
  if (n <= 0 || rows <= 0) return;
  auto* xb = static_cast<__nv_bfloat16*>(ws.get(kWsGemm, align256(static_cast<size_t>(n * w.in) * 2)));
  to_bf16(x, n * w.in, xb, s);

  DenseParams p;
  p.x = xb;
  p.n = n;
  p.in = w.in;
  p.w = w;
  p.row_begin = row_begin;
  p.rows = rows;
  p.y = y;
  // Neighbouring blocks share one operand tile: keep the larger operand streaming once and
  // re-read the smaller one (from L2) instead.
  const double weight_bytes = static_cast<double>(rows) * static_cast<double>(w.in) * w.bits / 8.0;
  const double act_bytes = static_cast<double>(n) * static_cast<double>(w.in) * 2.0;
  p.tokens_fast = weight_bytes > act_bytes;
  const bool big = n > 64;
  if (w.bits == 4) {
    big ? launch_dense<128, 4>(p, s) : launch_dense<64, 4>(p, s);
  } else {
    big ? launch_dense<128, 8>(p, s) : launch_dense<64, 8>(p, s);
  }
}

}  // namespace lily::cuda

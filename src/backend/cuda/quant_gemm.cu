// Prefill GEMM on tensor cores: y[t, r] = sum_c W[row_begin + r, c] x[t, c] for any n, with W
// an MLX affine Q4/Q8 weight (group 64) in the exact-code form: raw codes (exact BF16) in shared
// memory, x split once into two BF16 terms hi + lo plus f32 group sums (a workspace copy),
// f32 accumulation per group, then f32 scale and bias per group (see quant_gemm.cuh).
// Accuracy: the codes and the products are exact, x is represented to ~2^-17 relative, and
// everything else is f32 arithmetic, so results agree with the exact value to ~1e-6..1e-5
// (normalised), against ~1e-3 for a plain BF16 dequantise-and-round GEMM.
#include "backend/cuda/quant_gemm.cuh"

#include <algorithm>

namespace lily::cuda {
namespace gemm_detail {

namespace {

// One warp per (row, group) item, grid-stride: lane l takes columns 2l, 2l+1 of the group.
__global__ void split_act_kernel(const float* __restrict__ x, int64_t rows, int64_t K,
                                 __nv_bfloat16* __restrict__ dst) {
  const int64_t groups = K / 64;
  const int64_t items = rows * groups;
  const int64_t ld = act_ld(K);
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t it = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5); it < items;
       it += warps) {
    const int64_t r = it / groups;
    const int64_t g = it - r * groups;
    const int64_t col = g * 64 + 2 * lane;
    const float v0 = x[r * K + col];
    const float v1 = x[r * K + col + 1];
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v0, v1);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v0 - __low2float(hi), v1 - __high2float(hi));
    __nv_bfloat16* row = dst + r * ld;
    *reinterpret_cast<__nv_bfloat162*>(row + col) = hi;
    *reinterpret_cast<__nv_bfloat162*>(row + K + col) = lo;
    // The group sum of the represented values hi + lo (each sum exact in f32: lo sits 8+ bits
    // below hi), not of x: then sum_c q x' and b sum_c x' describe the same x' = hi + lo, and
    // the split error enters as sum_c W[c] (x' - x)[c] with the effective weights W = s q + b,
    // not amplified by the cancellation of s q against b (e.g. x > 0, b ~ -7.5 s).
    float sum = (__low2float(hi) + __low2float(lo)) + (__high2float(hi) + __high2float(lo));
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    if (lane == 0) reinterpret_cast<float*>(row + 2 * K)[g] = sum;
  }
}

struct DenseParams {
  const __nv_bfloat16* x = nullptr;  // [n, act_ld(in)] split activations (split_act)
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
    a_src[i] = t < p.n ? p.x + t * act_ld(p.in) : nullptr;
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
void launch_dense(const DenseParams& p, Stream s) {
  constexpr int kSmem = Tile<BM>::kSmemBytes;
  allow_smem<dense_gemm_kernel<BM, BITS>>(kSmem);
  const auto m_tiles = static_cast<unsigned>((p.n + BM - 1) / BM);
  const auto n_tiles = static_cast<unsigned>((p.rows + kBN - 1) / kBN);
  const dim3 grid = p.tokens_fast ? dim3(m_tiles, n_tiles) : dim3(n_tiles, m_tiles);
  launch_serial(dense_gemm_kernel<BM, BITS>, grid, kThreads, kSmem, s, p);
}

}  // namespace

void split_act(const float* x, int64_t rows, int64_t K, __nv_bfloat16* dst, Stream s) {
  if (rows <= 0 || K <= 0) return;
  const int64_t items = rows * (K / 64);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((items + 7) / 8, 8192));  // 8 warps a block
  launch_serial(split_act_kernel, blocks, 256, 0, s, x, rows, K, dst);
}

}  // namespace gemm_detail

void gemm(const QuantMatrix& w, int64_t row_begin, int64_t rows, const float* x, int64_t n, float* y,
          Workspace& ws, Stream s) {
  using namespace gemm_detail;
  if (n <= 0 || rows <= 0) return;
  auto* xb = static_cast<__nv_bfloat16*>(ws.get(kWsGemm, align256(static_cast<size_t>(n * act_ld(w.in)) * 2)));
  split_act(x, n, w.in, xb, s);

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
  const double act_bytes = static_cast<double>(n) * static_cast<double>(act_ld(w.in)) * 2.0;
  p.tokens_fast = weight_bytes > act_bytes;
  // 64-token tiles only: with the per-group accumulators (acc and acc_g) a 128-token tile needs
  // ~230 registers (spills at 2 blocks / SM, or runs 1 block / SM); 64 tokens fit in 128
  // registers with no spills, 2 blocks / SM.
  if (w.bits == 4) {
    launch_dense<64, 4>(p, s);
  } else {
    launch_dense<64, 8>(p, s);
  }
}

}  // namespace lily::cuda

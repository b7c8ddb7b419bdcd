// Prefill mixture of experts on tensor cores: the n*k (token, slot) pairs are counting-sorted by
// expert on the device (atomic histogram, one-warp exclusive scan, atomic scatter), then one
// grouped launch runs every expert's GEMM over its gathered rows (quant_gemm.cuh main loop).
// No host readback: the grouped grid is sized from host-known bounds (at most
// ceil(P / BM) + min(E, P) row tiles for P pairs) and blocks past the real tile count exit.
//
//   swiglu: A = split copy of x (BF16 hi + lo + f32 group sums, quant_gemm.cuh), row of pair p = token p / k; each block computes 64 gate rows and
//           the same 64 up rows of the pair's expert (interleaved 16/16 per warp so one thread
//           holds g and u of the same output) and writes h[p, :] = silu(g) * u.
//   down:   A = split copy of h, row p; ed[p, :] = D_e h[p] (f32 workspace), the shared expert
//           down projection through cuda::gemm, then a combine kernel
//           out[t] = sum_j (ascending) w[t, j] ed[t k + j] + sigmoid(logit[t]) sd[t].
// Pairs whose id is outside [0, E) are not placed: swiglu writes zeros into their h rows and
// the combine skips them (CudaBackend cannot check device-side ids without a sync).
// Within one expert the order of pairs depends on atomics, but every output row is computed
// from its own A row only, so results are deterministic.
#include <algorithm>
#include <stdexcept>

#include "backend/cuda/quant_gemm.cuh"

namespace lily::cuda {

namespace {

using namespace gemm_detail;

constexpr int kGroupBM = 64;  // pair rows per grouped tile (MoE experts see ~n*k/E rows each)

// ---- counting sort of pairs by expert ---------------------------------------------------------
struct SortBuffers {
  int* counts = nullptr;    // [E]
  int* cursor = nullptr;    // [E]
  int* offsets = nullptr;   // [E + 1] first sorted slot of each expert; [E] = placed pairs
  int* tile_off = nullptr;  // [E + 1] first row tile of each expert; [E] = tiles
  int* sorted = nullptr;    // [P] pair indices, grouped by expert
  static size_t bytes(int64_t experts, int64_t pairs) {
    return align256(static_cast<size_t>(4 * experts + 2 + pairs) * sizeof(int));
  }
  SortBuffers(void* base, int64_t experts) {
    counts = static_cast<int*>(base);
    cursor = counts + experts;
    offsets = cursor + experts;
    tile_off = offsets + experts + 1;
    sorted = tile_off + experts + 1;
  }
};

__device__ __forceinline__ int expert_of(const int32_t* ids, int64_t p) { return ids != nullptr ? ids[p] : 0; }

__global__ void moe_histogram_kernel(const int32_t* __restrict__ ids, int64_t pairs, int experts,
                                     int* __restrict__ counts) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= pairs) return;
  const int e = expert_of(ids, p);
  if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
}

// One warp: exclusive scans of the counts and of the row tiles per expert, 32 experts a step.
__global__ void moe_scan_kernel(const int* __restrict__ counts, int experts, int bm, int* __restrict__ offsets,
                                int* __restrict__ tile_off, int* __restrict__ cursor) {
  const int lane = threadIdx.x;
  int carry_c = 0;
  int carry_t = 0;
  for (int base = 0; base < experts; base += 32) {
    const int e = base + lane;
    const int c = e < experts ? counts[e] : 0;
    const int t = (c + bm - 1) / bm;
    int ic = c;
    int it = t;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int oc = __shfl_up_sync(0xffffffffu, ic, d);
      const int ot = __shfl_up_sync(0xffffffffu, it, d);
      if (lane >= d) {
        ic += oc;
        it += ot;
      }
    }
    if (e < experts) {
      offsets[e] = carry_c + ic - c;
      tile_off[e] = carry_t + it - t;
      cursor[e] = carry_c + ic - c;
    }
    carry_c += __shfl_sync(0xffffffffu, ic, 31);
    carry_t += __shfl_sync(0xffffffffu, it, 31);
  }
  if (lane == 0) {
    offsets[experts] = carry_c;
    tile_off[experts] = carry_t;
  }
}

// Places each pair in its expert's range; a pair with an invalid id gets a zero row in
// zero_rows [P, width] when zero_rows != nullptr.
__global__ void moe_scatter_kernel(const int32_t* __restrict__ ids, int64_t pairs, int experts,
                                   int* __restrict__ cursor, int* __restrict__ sorted, float* zero_rows,
                                   int64_t width) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= pairs) return;
  const int e = expert_of(ids, p);
  if (e >= 0 && e < experts) {
    sorted[atomicAdd(&cursor[e], 1)] = static_cast<int>(p);
  } else if (zero_rows != nullptr) {
    for (int64_t i = 0; i < width; ++i) zero_rows[p * width + i] = 0.0f;
  }
}

void sort_pairs(const int32_t* ids, int64_t pairs, int64_t experts, const SortBuffers& b, float* zero_rows,
                int64_t width, Stream s) {
  zero_async(b.counts, static_cast<size_t>(experts) * sizeof(int), s);
  const auto blocks = static_cast<unsigned>((pairs + 255) / 256);
  launch_serial(moe_histogram_kernel, blocks, 256, 0, s, ids, pairs, static_cast<int>(experts),
                b.counts);
  launch_serial(moe_scan_kernel, 1, 32, 0, s, b.counts, static_cast<int>(experts), kGroupBM,
                b.offsets, b.tile_off, b.cursor);
  launch_serial(moe_scatter_kernel, blocks, 256, 0, s, ids, pairs, static_cast<int>(experts),
                b.cursor, b.sorted, zero_rows, width);
}

// ---- grouped GEMM -----------------------------------------------------------------------------
struct GroupedParams {
  const __nv_bfloat16* a = nullptr;  // split activation rows [*, act_ld(K)] (split_act)
  int64_t K = 0;
  int64_t a_div = 1;  // A row of pair p: p / a_div (swiglu: k; down: 1)
  const int* offsets = nullptr;
  const int* tile_off = nullptr;
  const int* sorted = nullptr;
  int experts = 0;
  QuantMatrix w0;  // swiglu: gate; down: down
  QuantMatrix w1;  // swiglu: up
  int64_t out = 0;      // outputs per pair: I (swiglu) or H (down)
  float* y = nullptr;   // [P, out]
};

// blockIdx.x: row tile (over all experts), blockIdx.y: output column tile (64 swiglu outputs,
// i.e. 64 gate + 64 up weight rows, or 128 down rows).
template <int BITS, bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 2) grouped_gemm_kernel(const GroupedParams p) {
  constexpr int BM = kGroupBM;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const int b = static_cast<int>(blockIdx.x);
  const int total = p.tile_off[p.experts];
  if (b >= total) return;  // beyond the real tiles (uniform per block, before any barrier)
  int lo = 0;              // tile_off[lo] <= b < tile_off[hi]
  int hi = p.experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (p.tile_off[mid] <= b) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int e = lo;
  const int start = p.offsets[e] + (b - p.tile_off[e]) * BM;
  const int count = min(BM, p.offsets[e + 1] - start);
  const int tid = threadIdx.x;

  const __nv_bfloat16* a_src[BM / 32];
#pragma unroll
  for (int i = 0; i < BM / 32; ++i) {
    const int r = (tid >> 3) + 32 * i;
    a_src[i] = r < count ? p.a + (p.sorted[start + r] / p.a_div) * act_ld(p.K) : nullptr;
  }

  WeightRow wrow;
  const int srow = tid >> 1;
  if constexpr (SWIGLU) {
    // Warp wn's 32 weight rows: 16 gate rows then the same 16 up rows.
    const int64_t col = static_cast<int64_t>(blockIdx.y) * 64 + (srow >> 5) * 16 + (srow & 15);
    if (col < p.out) {
      // Both candidates, then a register select: selecting between the two parameter structs
      // themselves would index the kernel parameters dynamically.
      const WeightRow g = weight_row<BITS>(p.w0, e * p.out + col);
      const WeightRow u = weight_row<BITS>(p.w1, e * p.out + col);
      wrow = (srow & 16) ? u : g;
    }
  } else {
    const int64_t col = static_cast<int64_t>(blockIdx.y) * kBN + srow;
    if (col < p.out) wrow = weight_row<BITS>(p.w0, e * p.out + col);
  }

  float acc[BM / 32][4][4];
  mainloop<BM, BITS>(a_src, p.a, wrow, static_cast<int>(p.K / kBK), smem, acc);

  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < BM / 32; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = (warp >> 2) * (BM / 2) + mi * 16 + g + 8 * h;
      if (r >= count) continue;
      float* yrow = p.y + static_cast<int64_t>(p.sorted[start + r]) * p.out;
      if constexpr (SWIGLU) {
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          const int64_t col = static_cast<int64_t>(blockIdx.y) * 64 + (warp & 3) * 16 + ni * 8 + 2 * q;
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            if (col + c < p.out) {
              yrow[col + c] = siluf_(acc[mi][ni][2 * h + c]) * acc[mi][ni + 2][2 * h + c];
            }
          }
        }
      } else {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int64_t col = static_cast<int64_t>(blockIdx.y) * kBN + (warp & 3) * 32 + ni * 8 + 2 * q;
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            if (col + c < p.out) yrow[col + c] = acc[mi][ni][2 * h + c];
          }
        }
      }
    }
  }
}

template <int BITS, bool SWIGLU>
void launch_grouped(const GroupedParams& p, int64_t pairs, Stream s) {
  constexpr int kSmem = Tile<kGroupBM>::kSmemBytes;
  allow_smem<grouped_gemm_kernel<BITS, SWIGLU>>(kSmem);
  const int64_t max_tiles = (pairs + kGroupBM - 1) / kGroupBM + std::min<int64_t>(p.experts, pairs);
  const int64_t col_tiles = SWIGLU ? (p.out + 63) / 64 : (p.out + kBN - 1) / kBN;
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>(col_tiles));
  launch_serial(grouped_gemm_kernel<BITS, SWIGLU>, grid, kThreads, kSmem, s, p);
}

template <bool SWIGLU>
void launch_grouped_bits(int bits, const GroupedParams& p, int64_t pairs, Stream s) {
  if (bits == 4) {
    launch_grouped<4, SWIGLU>(p, pairs, s);
  } else {
    launch_grouped<8, SWIGLU>(p, pairs, s);
  }
}

// out[t, c] = sum_j w[t, j] ed[t k + j, c] (ascending j, valid ids only) + sigmoid(logit[t]) sd[t, c]
__global__ void moe_combine_kernel(const float* __restrict__ ed, const int32_t* __restrict__ ids,
                                   const float* __restrict__ weights, int k, int experts,
                                   const float* __restrict__ sd, const float* __restrict__ shared_logit, int64_t H,
                                   float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= H) return;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int64_t pair = t * k + j;
    const int e = ids[pair];
    if (e >= 0 && e < experts) acc += weights[pair] * ed[pair * H + c];
  }
  out[t * H + c] = acc + sigmoidf_(shared_logit[t]) * sd[t * H + c];
}

}  // namespace

void expert_swiglu_grouped(const QuantMatrix& gate, const QuantMatrix& up, const float* x, const int32_t* ids,
                           int64_t n, int64_t k, float* h, Workspace& ws, Stream s) {
  if (n <= 0 || k <= 0) return;
  if (gate.bits != up.bits) throw std::invalid_argument("expert_swiglu_grouped: gate and up bits differ");
  const int64_t pairs = n * k;
  const int64_t E = gate.experts;
  const int64_t I = gate.out;
  const int64_t K = gate.in;
  const SortBuffers sort(ws.get(kWsMoe, SortBuffers::bytes(E, pairs)), E);
  auto* xb = static_cast<__nv_bfloat16*>(ws.get(kWsMoe2, align256(static_cast<size_t>(n * act_ld(K)) * 2)));
  split_act(x, n, K, xb, s);
  sort_pairs(ids, pairs, E, sort, h, I, s);

  GroupedParams p;
  p.a = xb;
  p.K = K;
  p.a_div = k;
  p.offsets = sort.offsets;
  p.tile_off = sort.tile_off;
  p.sorted = sort.sorted;
  p.experts = static_cast<int>(E);
  p.w0 = gate;
  p.w1 = up;
  p.out = I;
  p.y = h;
  launch_grouped_bits<true>(gate.bits, p, pairs, s);
}

void expert_down_combine_grouped(const QuantMatrix& down, const float* h, const int32_t* ids, const float* weights,
                                 int64_t n, int64_t k, const QuantMatrix& shared_down, const float* shared_h,
                                 const float* shared_logit, float* out, Workspace& ws, Stream s) {
  if (n <= 0 || k <= 0) return;
  const int64_t pairs = n * k;
  const int64_t E = down.experts;
  const int64_t H = down.out;
  const int64_t I = down.in;
  const SortBuffers sort(ws.get(kWsMoe, SortBuffers::bytes(E, pairs)), E);
  const size_t hb_bytes = align256(static_cast<size_t>(pairs * act_ld(I)) * 2);
  const size_t ed_bytes = align256(static_cast<size_t>(pairs * H) * sizeof(float));
  const size_t sd_bytes = align256(static_cast<size_t>(n * H) * sizeof(float));
  auto* base = static_cast<unsigned char*>(ws.get(kWsMoe2, hb_bytes + ed_bytes + sd_bytes));
  auto* hb = reinterpret_cast<__nv_bfloat16*>(base);
  auto* ed = reinterpret_cast<float*>(base + hb_bytes);
  auto* sd = reinterpret_cast<float*>(base + hb_bytes + ed_bytes);

  split_act(h, pairs, I, hb, s);
  sort_pairs(ids, pairs, E, sort, nullptr, 0, s);
  GroupedParams p;
  p.a = hb;
  p.K = I;
  p.a_div = 1;
  p.offsets = sort.offsets;
  p.tile_off = sort.tile_off;
  p.sorted = sort.sorted;
  p.experts = static_cast<int>(E);
  p.w0 = down;
  p.w1 = down;
  p.out = H;
  p.y = ed;
  launch_grouped_bits<false>(down.bits, p, pairs, s);

  // The shared expert's down projection (kWsGemm is gemm's own slot).
  gemm(shared_down, 0, H, shared_h, n, sd, ws, s);

  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((H + 255) / 256));
  launch_serial(moe_combine_kernel, grid, 256, 0, s, ed, ids, weights, static_cast<int>(k),
                static_cast<int>(E), sd, shared_logit, H, out);
}

}  // namespace lily::cuda

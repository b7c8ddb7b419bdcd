// The one-token GEMV of a tall Q4 matrix (lm_head, 248,320 x 2048) streamed through shared memory with bulk copies.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quant_dot.cuh"

namespace lily::cuda {

namespace {

// Why a second GEMV: the generic kernel (quant_gemv.cu) keeps each lane's weights in registers,
// so the bytes a block has in flight end with its short life (load, reduce, exit), and on
// lm_head it streams at about half the copy bandwidth (143 us for 286 MB on an H200). Here
// a persistent block per SM keeps kStages tiles of rows in flight: one producer thread
// issues bulk asynchronous copies (cp.async.bulk, completion counted on an mbarrier) of each
// tile's codes, scales and biases into shared memory, and consumer warps compute from there
// while the next tiles arrive. Activations stay in registers: a lane always reads the same
// chunks of every row.
//
// Arithmetic and summation order are those of the generic kernel with 32 lanes per row (lane l
// takes chunks l, l + 32, ...; chunk_dot's order within a chunk; the same xor reduction), so
// the logits are bit-identical to it.
constexpr int kTileRows = 32;         // rows per tile (one bulk copy each of codes, scales, biases)
constexpr int kStages = 4;            // tiles in flight per block
constexpr int kConsumerWarps = 16;    // each takes kTileRows / kConsumerWarps rows of a tile
[[maybe_unused]] constexpr int kWarpRows = kTileRows / kConsumerWarps;
constexpr int kStreamThreads = (kConsumerWarps + 1) * 32;  // + the producer warp
using Q4 = gemv_detail::Chunk<4>;

// Bytes of one row of one tile: in / 2 of codes, in / 32 each of scales and biases (BF16 per 64).
template <int kChunksPerLane>
struct TileLayout {
  static constexpr int kIn = kChunksPerLane * 32 * Q4::kValues;  // 1024 or 2048 values per row
  static constexpr int kCodeRowBytes = kIn / 2;
  static constexpr int kGroupRowBytes = kIn / kGroupSize * 2;
  static constexpr int kCodeBytes = kTileRows * kCodeRowBytes;
  static constexpr int kGroupBytes = kTileRows * kGroupRowBytes;
  static constexpr int kStageBytes = kCodeBytes + 2 * kGroupBytes;  // codes | scales | biases
  static_assert(kCodeRowBytes % 16 == 0 && kGroupRowBytes % 16 == 0, "bulk copies move 16-byte units");
};

// The mbarrier and bulk-copy instructions exist from sm_90 on; the host only launches this
// kernel there (stream_gemv_applies), and other targets compile the kernel with an empty body.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LILY_STREAM_GEMV 1
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}
// bytes % 16 == 0, both addresses 16-byte aligned; completion is counted on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}
#endif

// y [rows] f32 = W[row_begin .. row_begin + rows) . x, x [in] f32 (16-byte aligned),
// in = kChunksPerLane * 1024, Q4. Grid: at most one block per tile, each walks tiles
// blockIdx.x, + gridDim.x, ...; dynamic shared memory kStages * kStageBytes.
template <int kChunksPerLane>
__global__ void __launch_bounds__(kStreamThreads, 1)
    stream_gemv_kernel(QuantMatrix w, int64_t row_begin, int64_t rows, const float* __restrict__ x,
                       float* __restrict__ y) {
#ifdef LILY_STREAM_GEMV
  using L = TileLayout<kChunksPerLane>;
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ uint64_t full[kStages];   // tile landed: 1 arrival + the copies' bytes
  __shared__ uint64_t empty[kStages];  // tile consumed: one arrival per consumer warp
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // Producer. Weights do not depend on earlier kernels, so the first kStages tiles are
    // requested before grid_dependency_wait, while the previous kernel finishes.
    if (lane == 0) {
      const auto* codes = reinterpret_cast<const unsigned char*>(w.codes);
      const auto* scales = reinterpret_cast<const unsigned char*>(w.scales);
      const auto* biases = reinterpret_cast<const unsigned char*>(w.biases);
      int k = 0;
      for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++k) {
        const int s = k % kStages;
        if (k >= kStages) mbar_wait(&empty[s], static_cast<unsigned>((k / kStages - 1) & 1));
        const int64_t first = row_begin + tile * kTileRows;
        const int64_t count = rows - tile * kTileRows < kTileRows ? rows - tile * kTileRows : kTileRows;
        const auto code_bytes = static_cast<unsigned>(count * L::kCodeRowBytes);
        const auto group_bytes = static_cast<unsigned>(count * L::kGroupRowBytes);
        unsigned char* stage = stages + static_cast<size_t>(s) * L::kStageBytes;
        mbar_expect_tx(&full[s], code_bytes + 2 * group_bytes);
        bulk_copy(stage, codes + first * L::kCodeRowBytes, code_bytes, &full[s]);
        bulk_copy(stage + L::kCodeBytes, scales + first * L::kGroupRowBytes, group_bytes, &full[s]);
        bulk_copy(stage + L::kCodeBytes + L::kGroupBytes, biases + first * L::kGroupRowBytes,
                  group_bytes, &full[s]);
      }
    }
    grid_dependency_wait();  // every block waits before it exits (launch contract)
    return;
  }

  // Consumers: lane l's activations, chunks l + 32 j (j < kChunksPerLane), in registers, and
  // their sums as chunk_dot forms them (value order 0..31).
  grid_dependency_wait();
  float xr[kChunksPerLane][Q4::kValues];
  float xsum[kChunksPerLane];
#pragma unroll
  for (int j = 0; j < kChunksPerLane; ++j) {
    const auto* src = reinterpret_cast<const float4*>(x + (lane + 32 * j) * Q4::kValues);
#pragma unroll
    for (int f = 0; f < Q4::kValues / 4; ++f) {
      const float4 v = __ldg(src + f);
      xr[j][4 * f + 0] = v.x;
      xr[j][4 * f + 1] = v.y;
      xr[j][4 * f + 2] = v.z;
      xr[j][4 * f + 3] = v.w;
    }
    xsum[j] = 0.0f;
#pragma unroll
    for (int v = 0; v < Q4::kValues; ++v) xsum[j] += xr[j][v];
  }

  int k = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++k) {
    const int s = k % kStages;
    mbar_wait(&full[s], static_cast<unsigned>((k / kStages) & 1));
    const unsigned char* stage = stages + static_cast<size_t>(s) * L::kStageBytes;
    const auto* scales = reinterpret_cast<const __nv_bfloat16*>(stage + L::kCodeBytes);
    const auto* biases = reinterpret_cast<const __nv_bfloat16*>(stage + L::kCodeBytes + L::kGroupBytes);
    float acc[kWarpRows];
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunksPerLane; ++j) {
      const int c = lane + 32 * j;
      uint4 q[kWarpRows];
      float sc[kWarpRows];
      float bi[kWarpRows];
#pragma unroll
      for (int i = 0; i < kWarpRows; ++i) {
        const int r = warp * kWarpRows + i;  // row within the tile
        q[i] = *reinterpret_cast<const uint4*>(stage + r * L::kCodeRowBytes + c * 16);
        sc[i] = __bfloat162float(scales[r * (L::kGroupRowBytes / 2) + c / Q4::kPerGroup]);
        bi[i] = __bfloat162float(biases[r * (L::kGroupRowBytes / 2) + c / Q4::kPerGroup]);
      }
      float d[kWarpRows];
#pragma unroll
      for (int i = 0; i < kWarpRows; ++i) d[i] = 0.0f;
#pragma unroll
      for (int wd = 0; wd < 4; ++wd) {
#pragma unroll
        for (int i = 0; i < kWarpRows; ++i) {
          float cq[Q4::kPerWord];
          gemv_detail::decode_word<4>(gemv_detail::word_of(q[i], wd), cq);
#pragma unroll
          for (int v = 0; v < Q4::kPerWord; ++v) {
            d[i] = fmaf(cq[v], xr[j][wd * Q4::kPerWord + v], d[i]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kWarpRows; ++i) acc[i] += fmaf(sc[i], d[i], bi[i] * xsum[j]);
    }
    // The stage's data are in registers: hand it back before the reduction.
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i) {
      const float v = gemv_detail::segment_sum(acc[i], 32);
      const int64_t row = tile * kTileRows + warp * kWarpRows + i;
      if (lane == 0 && row < rows) y[row] = v;
    }
  }
  allow_dependent_launch();
#endif
}

template <int kChunksPerLane>
void launch_stream(const QuantMatrix& w, int64_t row_begin, int64_t rows, const float* x, float* y,
                   Stream s) {
  constexpr size_t kBytes = static_cast<size_t>(kStages) * TileLayout<kChunksPerLane>::kStageBytes;
  static const bool configured = [] {
    LILY_CUDA_CHECK(cudaFuncSetAttribute(stream_gemv_kernel<kChunksPerLane>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kBytes)));
    return true;
  }();
  (void)configured;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t blocks = tiles < sm_count() ? tiles : sm_count();
  launch(stream_gemv_kernel<kChunksPerLane>, static_cast<unsigned>(blocks), kStreamThreads, kBytes,
         s, w, row_begin, rows, x, y);
}

}  // namespace

size_t stream_gemv_shared_bytes(int64_t in) {
  if (in == 1024) return static_cast<size_t>(kStages) * TileLayout<1>::kStageBytes;
  if (in == 2048) return static_cast<size_t>(kStages) * TileLayout<2>::kStageBytes;
  return 0;
}

bool stream_gemv_built_for_device() {
  cudaFuncAttributes attributes{};
  LILY_CUDA_CHECK(cudaFuncGetAttributes(&attributes, stream_gemv_kernel<2>));
  // ptxVersion is the virtual architecture the running code came from (90 for sm_90a
  // machine code, 80 when the driver JIT-compiled the compute_80 PTX).
  return attributes.ptxVersion >= 90;
}

bool stream_gemv_enabled_for(int64_t in, const StreamGemvConfig& config) {
  const size_t bytes = stream_gemv_shared_bytes(in);
  return config.enabled && bytes != 0 && bytes <= config.max_shared_bytes;
}

bool stream_gemv_applies(const QuantMatrix& w, int64_t rows, const float* x, int64_t n,
                         const StreamGemvConfig& config) {
  return n == 1 && w.bits == 4 && stream_gemv_enabled_for(w.in, config) &&
         rows >= kStreamGemvMinRows && aligned16(x) && aligned16(w.codes) && aligned16(w.scales) &&
         aligned16(w.biases);
}

void stream_gemv(const QuantMatrix& w, int64_t row_begin, int64_t rows, const float* x, float* y,
                 const StreamGemvConfig& config, Stream s) {
  if (!stream_gemv_applies(w, rows, x, 1, config) || row_begin < 0 ||
      row_begin + rows > w.experts * w.out) {
    throw std::invalid_argument(
        "cuda::stream_gemv: needs one token, Q4 rows of 1024 or 2048 values, at least " +
        std::to_string(kStreamGemvMinRows) + " rows inside the matrix, 16-byte aligned buffers "
        "and the kernel enabled (code built for sm_90+, its tiles fitting the shared memory, "
        "not --cuda-disable stream-gemv)");
  }
  if (w.in == 1024) {
    launch_stream<1>(w, row_begin, rows, x, y, s);
  } else {
    launch_stream<2>(w, row_begin, rows, x, y, s);
  }
}

}  // namespace lily::cuda

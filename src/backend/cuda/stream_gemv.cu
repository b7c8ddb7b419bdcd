// One-token GEMVs of Q4 matrices streamed through shared memory with bulk copies: the lm_head and the projections.
#include <cstdint>
#include <cstdlib>
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
// The one-token projections (qkv|z|a|b, q|k|v, the output projections: 4.7-14 MB each) take
// the same kernel over a batch of up to kMaxGemvTargets matrices, whose tiles are numbered one
// after the other: there every block has at most a few tiles, so the producer requests all of
// them (or its first kStages) before the dependency wait, while the kernels before finish, and
// after the wait a consumer only loads the activations and computes from shared memory.
//
// Arithmetic and summation order are those of the generic kernel with 32 lanes per row (lane l
// takes chunks l, l + 32, ...; chunk_dot's order within a chunk; the same xor reduction), so
// the outputs are bit-identical to it.
using Q4 = gemv_detail::Chunk<4>;

// The shape of one block's work for rows of kChunksPerLane * 1024 values. Each consumer warp
// takes kWarpRows = 2 rows of a tile. Rows of 4096 values hold 128 activations per lane in
// registers, so they take half the consumer warps (and tiles of 16 rows) to leave each thread
// room for them (65,536 registers / 288 threads); shorter rows take 16 warps and 32 rows.
template <int kChunksPerLane, bool kCompact = false>
struct TileLayout {
  static constexpr int kStages = kCompact ? 2 : 4;
  static constexpr int kMinBlocks = kCompact && kChunksPerLane <= 2 ? 2 : 1;
  static constexpr int kTileRows = kCompact ? 16 : kChunksPerLane <= 2 ? 32 : 16;  // one bulk copy each of codes, scales, biases
  static constexpr int kConsumerWarps = kCompact ? 8 : kChunksPerLane <= 2 ? 16 : 8;
  static constexpr int kWarpRows = kTileRows / kConsumerWarps;
  static constexpr int kThreads = (kConsumerWarps + 1) * 32;  // + the producer warp
  static constexpr int kIn = kChunksPerLane * 32 * Q4::kValues;  // 1024, 2048 or 4096 values per row
  static constexpr int kCodeRowBytes = kIn / 2;
  static constexpr int kGroupRowBytes = kIn / kGroupSize * 2;  // BF16 per group of 64
  static constexpr int kCodeBytes = kTileRows * kCodeRowBytes;
  static constexpr int kGroupBytes = kTileRows * kGroupRowBytes;
  static constexpr int kStageBytes = kCodeBytes + 2 * kGroupBytes;  // codes | scales | biases
  static_assert(kCodeRowBytes % 16 == 0 && kGroupRowBytes % 16 == 0, "bulk copies move 16-byte units");
  static_assert(kWarpRows == 2, "the consumer loop is written for two rows per warp");
};

// The targets of one launch and their tiles: target i owns tiles [tile_end[i - 1], tile_end[i])
// (tile_end[-1] = 0), each of TileLayout::kTileRows rows but the last.
struct StreamBatch {
  GemvTarget target[kMaxGemvTargets];
  int64_t tile_end[kMaxGemvTargets] = {};
  int count = 0;
  WindowShift shift;  // active when shift.window != nullptr
};

// Which target a tile belongs to, and the tile's index within it. Selected with constant
// indices: a dynamic index into the kernel parameters would copy them to local memory.
struct TileOf {
  GemvTarget target;
  int64_t tile;  // within the target
};
__device__ __forceinline__ TileOf tile_of(const StreamBatch& b, int64_t tile) {
  TileOf t{b.target[0], tile};
#pragma unroll
  for (int i = 1; i < kMaxGemvTargets; ++i) {
    if (i < b.count && tile >= b.tile_end[i - 1]) {
      t.target = b.target[i];
      t.tile = tile - b.tile_end[i - 1];
    }
  }
  return t;
}

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

// For each target of the batch: y[r] = W[row_begin + r] . x for r < rows; x [in] f32 (16-byte
// aligned, the same for every target), in = kChunksPerLane * 1024, Q4; y [rows] f32 per target.
// Grid: at most one block per tile, each walks tiles blockIdx.x, + gridDim.x, ...; dynamic
// shared memory kStages * kStageBytes.
template <int kChunksPerLane, bool kCompact>
__global__ void __launch_bounds__(TileLayout<kChunksPerLane, kCompact>::kThreads,
                                  TileLayout<kChunksPerLane, kCompact>::kMinBlocks)
    stream_gemv_kernel(StreamBatch batch, const float* __restrict__ x) {
#ifdef LILY_STREAM_GEMV
  using L = TileLayout<kChunksPerLane, kCompact>;
  constexpr int kStages = L::kStages;
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ uint64_t full[kStages];   // tile landed: 1 arrival + the copies' bytes
  __shared__ uint64_t empty[kStages];  // tile consumed: one arrival per consumer warp
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t tiles = batch.tile_end[batch.count - 1];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], L::kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == L::kConsumerWarps) {
    // Producer. Weights do not depend on earlier kernels, so the first kStages tiles are
    // requested before grid_dependency_wait, while the previous kernel finishes.
    if (lane == 0) {
      int k = 0;
      for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++k) {
        const int s = k % kStages;
        if (k >= kStages) mbar_wait(&empty[s], static_cast<unsigned>((k / kStages - 1) & 1));
        const TileOf t = tile_of(batch, tile);
        const QuantMatrix& w = t.target.w;
        const int64_t done = t.tile * L::kTileRows;  // rows of the target before this tile
        const int64_t first = t.target.row_begin + done;
        const int64_t count = t.target.rows - done < L::kTileRows ? t.target.rows - done : L::kTileRows;
        const auto code_bytes = static_cast<unsigned>(count * L::kCodeRowBytes);
        const auto group_bytes = static_cast<unsigned>(count * L::kGroupRowBytes);
        unsigned char* stage = stages + static_cast<size_t>(s) * L::kStageBytes;
        mbar_expect_tx(&full[s], code_bytes + 2 * group_bytes);
        bulk_copy(stage, reinterpret_cast<const unsigned char*>(w.codes) + first * L::kCodeRowBytes,
                  code_bytes, &full[s]);
        bulk_copy(stage + L::kCodeBytes,
                  reinterpret_cast<const unsigned char*>(w.scales) + first * L::kGroupRowBytes,
                  group_bytes, &full[s]);
        bulk_copy(stage + L::kCodeBytes + L::kGroupBytes,
                  reinterpret_cast<const unsigned char*>(w.biases) + first * L::kGroupRowBytes,
                  group_bytes, &full[s]);
      }
    }
    grid_dependency_wait();  // every block waits before it exits (launch contract)
    return;
  }

  // Consumers: lane l's activations, chunks l + 32 j (j < kChunksPerLane), in registers, and
  // their sums as chunk_dot forms them (value order 0..31).
  grid_dependency_wait();
  if (batch.shift.window != nullptr) {
    constexpr int kConsumerThreads = L::kConsumerWarps * 32;
    gemv_detail::shift_window(batch.shift,
                              static_cast<int64_t>(blockIdx.x) * kConsumerThreads + threadIdx.x,
                              static_cast<int64_t>(gridDim.x) * kConsumerThreads);
  }
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
    float acc[L::kWarpRows];
#pragma unroll
    for (int i = 0; i < L::kWarpRows; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunksPerLane; ++j) {
      const int c = lane + 32 * j;
      uint4 q[L::kWarpRows];
      float sc[L::kWarpRows];
      float bi[L::kWarpRows];
#pragma unroll
      for (int i = 0; i < L::kWarpRows; ++i) {
        const int r = warp * L::kWarpRows + i;  // row within the tile
        q[i] = *reinterpret_cast<const uint4*>(stage + r * L::kCodeRowBytes + c * 16);
        sc[i] = __bfloat162float(scales[r * (L::kGroupRowBytes / 2) + c / Q4::kPerGroup]);
        bi[i] = __bfloat162float(biases[r * (L::kGroupRowBytes / 2) + c / Q4::kPerGroup]);
      }
      float d[L::kWarpRows];
#pragma unroll
      for (int i = 0; i < L::kWarpRows; ++i) d[i] = 0.0f;
#pragma unroll
      for (int wd = 0; wd < 4; ++wd) {
#pragma unroll
        for (int i = 0; i < L::kWarpRows; ++i) {
          float cq[Q4::kPerWord];
          gemv_detail::decode_word<4>(gemv_detail::word_of(q[i], wd), cq);
#pragma unroll
          for (int v = 0; v < Q4::kPerWord; ++v) {
            d[i] = fmaf(cq[v], xr[j][wd * Q4::kPerWord + v], d[i]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < L::kWarpRows; ++i) acc[i] += fmaf(sc[i], d[i], bi[i] * xsum[j]);
    }
    // The stage's data are in registers: hand it back before the reduction.
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    const TileOf t = tile_of(batch, tile);
#pragma unroll
    for (int i = 0; i < L::kWarpRows; ++i) {
      const float v = gemv_detail::segment_sum(acc[i], 32);
      const int64_t row = t.tile * L::kTileRows + warp * L::kWarpRows + i;
      if (lane == 0 && row < t.target.rows) t.target.y[row] = v;
    }
  }
  allow_dependent_launch();
#endif
}

template <int kChunksPerLane, bool kCompact>
void launch_stream(const StreamBatch& batch, const float* x, Stream s) {
  using L = TileLayout<kChunksPerLane, kCompact>;
  constexpr size_t kBytes = static_cast<size_t>(L::kStages) * L::kStageBytes;
  static const int per_sm = [] {
    LILY_CUDA_CHECK(cudaFuncSetAttribute(stream_gemv_kernel<kChunksPerLane, kCompact>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kBytes)));
    int n = 0;
    LILY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, stream_gemv_kernel<kChunksPerLane, kCompact>, L::kThreads, kBytes));
    return n < 1 ? 1 : n;
  }();
  const int64_t tiles = batch.tile_end[batch.count - 1];
  const int64_t slots = static_cast<int64_t>(sm_count()) * (kCompact ? per_sm : 1);
  const int64_t blocks = tiles < slots ? tiles : slots;
  launch(stream_gemv_kernel<kChunksPerLane, kCompact>, static_cast<unsigned>(blocks), L::kThreads,
         kBytes, s, batch, x);
}

template <int kChunksPerLane, bool kCompact = false>
void launch_stream_batch(const GemvTarget* targets, int count, const float* x,
                         const WindowShift& shift, Stream s) {
  StreamBatch batch;
  batch.count = count;
  batch.shift = shift;
  int64_t tiles = 0;
  for (int i = 0; i < count; ++i) {
    batch.target[i] = targets[i];
    tiles += (targets[i].rows + TileLayout<kChunksPerLane, kCompact>::kTileRows - 1) /
             TileLayout<kChunksPerLane, kCompact>::kTileRows;
    batch.tile_end[i] = tiles;
  }
  launch_stream<kChunksPerLane, kCompact>(batch, x, s);
}

void dispatch_stream(const GemvTarget* targets, int count, const float* x, const WindowShift& shift,
                     Stream s) {
  static const bool compact = std::getenv("LILY_TMP_COMPACT") != nullptr;  // TEMPORARY experiment
  if (compact) {
    switch (targets[0].w.in) {
      case 1024: return launch_stream_batch<1, true>(targets, count, x, shift, s);
      case 2048: return launch_stream_batch<2, true>(targets, count, x, shift, s);
      default: return launch_stream_batch<4, true>(targets, count, x, shift, s);
    }
  }
  switch (targets[0].w.in) {
    case 1024: return launch_stream_batch<1>(targets, count, x, shift, s);
    case 2048: return launch_stream_batch<2>(targets, count, x, shift, s);
    default: return launch_stream_batch<4>(targets, count, x, shift, s);
  }
}

bool aligned_q4_rows(const QuantMatrix& w) {
  return w.bits == 4 && aligned16(w.codes) && aligned16(w.scales) && aligned16(w.biases);
}

}  // namespace

size_t stream_gemv_shared_bytes(int64_t in) {
  if (in == 1024) return static_cast<size_t>(TileLayout<1>::kStages) * TileLayout<1>::kStageBytes;
  if (in == 2048) return static_cast<size_t>(TileLayout<2>::kStages) * TileLayout<2>::kStageBytes;
  if (in == 4096) return static_cast<size_t>(TileLayout<4>::kStages) * TileLayout<4>::kStageBytes;
  return 0;
}

bool stream_gemv_built_for_device() {
  cudaFuncAttributes attributes{};
  LILY_CUDA_CHECK(cudaFuncGetAttributes(&attributes, stream_gemv_kernel<2, false>));
  // ptxVersion is the virtual architecture the running code came from (90 for sm_90a
  // machine code, 80 when the driver JIT-compiled the compute_80 PTX).
  return attributes.ptxVersion >= 90;
}

bool stream_gemv_enabled_for(int64_t in, const StreamGemvConfig& config) {
  const size_t bytes = stream_gemv_shared_bytes(in);
  return config.enabled && bytes != 0 && bytes <= config.max_shared_bytes;
}

bool stream_projections_enabled_for(int64_t in, const StreamGemvConfig& config) {
  const size_t bytes = stream_gemv_shared_bytes(in);
  return config.projections && bytes != 0 && bytes <= config.max_shared_bytes;
}

bool stream_gemv_applies(const QuantMatrix& w, int64_t rows, const float* x, int64_t n,
                         const StreamGemvConfig& config) {
  return n == 1 && stream_gemv_enabled_for(w.in, config) && rows >= kStreamGemvMinRows &&
         aligned16(x) && aligned_q4_rows(w);
}

bool stream_projections_apply(const GemvTarget* targets, int count, const float* x, int64_t n,
                              const StreamGemvConfig& config) {
  if (n != 1 || count < 1 || count > kMaxGemvTargets || !aligned16(x) ||
      !stream_projections_enabled_for(targets[0].w.in, config)) {
    return false;
  }
  int64_t rows = 0;
  for (int i = 0; i < count; ++i) {
    if (!aligned_q4_rows(targets[i].w) || targets[i].w.in != targets[0].w.in || targets[i].rows <= 0) {
      return false;
    }
    rows += targets[i].rows;
  }
  return rows < kStreamGemvMinRows;
}

void stream_gemv(const QuantMatrix& w, int64_t row_begin, int64_t rows, const float* x, float* y,
                 const StreamGemvConfig& config, Stream s) {
  if (!stream_gemv_applies(w, rows, x, 1, config) || row_begin < 0 ||
      row_begin + rows > w.experts * w.out) {
    throw std::invalid_argument(
        "cuda::stream_gemv: needs one token, Q4 rows of 1024, 2048 or 4096 values, at least " +
        std::to_string(kStreamGemvMinRows) + " rows inside the matrix, 16-byte aligned buffers "
        "and the kernel enabled (code built for sm_90+, its tiles fitting the shared memory, "
        "not --cuda-disable stream-gemv)");
  }
  const GemvTarget target{w, row_begin, rows, y};
  dispatch_stream(&target, 1, x, WindowShift{}, s);
}

void stream_projections(const GemvTarget* targets, int count, const float* x,
                        const StreamGemvConfig& config, Stream s, const WindowShift& shift) {
  if (!stream_projections_apply(targets, count, x, 1, config)) {
    throw std::invalid_argument(
        "cuda::stream_projections: needs one token, 1 to " + std::to_string(kMaxGemvTargets) +
        " Q4 matrices of one width (1024, 2048 or 4096 values), fewer than " +
        std::to_string(kStreamGemvMinRows) + " rows in all, 16-byte aligned buffers and the "
        "kernel enabled (code built for sm_90+, its tiles fitting the shared memory, not "
        "--cuda-disable stream-proj)");
  }
  for (int i = 0; i < count; ++i) {
    const GemvTarget& t = targets[i];
    if (t.row_begin < 0 || t.row_begin + t.rows > t.w.experts * t.w.out) {
      throw std::invalid_argument("cuda::stream_projections: target " + std::to_string(i) +
                                  "'s rows lie outside its matrix");
    }
  }
  dispatch_stream(targets, count, x, shift, s);
}

}  // namespace lily::cuda

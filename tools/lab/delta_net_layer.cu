// Kernel lab (tools/lab/, not in the decode plan: measured slower than the op path, docs/cuda.md).
// The Gated DeltaNet mixer of one decode token as one persistent kernel: add + RMSNorm, the
// qkv | z | a | b projections, conv + gated delta rule, gated RMSNorm and the output
// projection, with two grid barriers between them.
//
// Why: the op path spends five launches on this mixer (add_rms_norm, the projections'
// gemv_batch, gated_delta_step, gated_rms_norm, the output projection), 31 us of kernel time
// per layer on an H200 for about 19 MB of weights and state, most of it ramp-up, tail and the
// dependency between launches. Here every block stays resident; the weights of its next phase
// and the recurrent state are in flight before the inputs they meet are ready.
//
// Phases (grid G blocks of 256 threads, G = blocks per SM x SMs, every block co-resident):
//   -  before the dependency wait, each warp copies its first unit of phase 1 and its first
//      row of phase 3 into shared memory (cp.async), and pulls the state tile into L2;
//   0  every block: residual + delta and its RMSNorm into shared memory (residual_norm.cuh);
//   1  the projections' rows, kInRows per lane segment, over every warp of the grid;
//      -- barrier 1 (between arrival and wait: the state tiles and the conv taps load) --
//   2  blocks 0 .. Hv x Dv/32 - 1: one delta-rule tile each (delta_rule_decode.cuh); the last
//      tile of a head to finish (a counter per head) forms the head's gated RMSNorm;
//      -- barrier 2 --
//   3  the window shift; every block stages the gated norm, then the output rows.
//
// Exactness: every value is computed by the same lanes in the same order as the op path's
// kernels (norm_vec_kernel / norm_warp_kernel, gemv_kernel, gated_delta_decode_kernel,
// norm_warp_kernel<gated>), so the outputs are bit-identical to it
// (delta_net_layer_lab checks that on model-shaped weights; the decode plan's test that once
// held it is in the history at 3d02f72, tests/cuda/delta_net_layer_test.cpp).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/delta_rule_decode.cuh"
#include "backend/cuda/grid_barrier.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/quant_dot.cuh"
#include "backend/cuda/residual_norm.cuh"
#include "delta_net_layer.cuh"

namespace lily::cuda::lab {

using gemv_detail::Chunk;

namespace {

constexpr int kThreads = kPersistentThreads;
constexpr int kWarps = kPersistentWarps;
// Rows per lane segment in phase 1. The model's 12,352 rows in units of 6 are 2,061 units for
// the 2,112 warps of 264 blocks: one unit per warp, 12 16-byte loads in flight per lane.
constexpr int kInRows = 6;
constexpr int kInUnroll = 2;   // chunks per lane in the preloaded batch (H = 2048: all of them)
constexpr int kOutUnroll = 4;  // the same for the output rows (Hv Dv = 4096: all of them)
constexpr int kBits = 4;       // the code width of every projection (the model's)

// The rows a lane segment reads: a matrix's arrays by value (taking the address of a kernel
// parameter would copy the parameters to local memory).
struct RowSource {
  const uint32_t* codes = nullptr;
  const __nv_bfloat16* scales = nullptr;
  const __nv_bfloat16* biases = nullptr;
  int64_t in = 0;
  int64_t rows = 0;    // the matrix's rows
  int64_t first = 0;   // the segment's first row
  float* y = nullptr;  // [rows] the output
};

__device__ __forceinline__ RowSource source(const QuantMatrix& w, int64_t first, float* y) {
  return RowSource{w.codes, w.scales, w.biases, w.in, w.out, first, y};
}

__device__ __forceinline__ int64_t units_of(int64_t rows) { return (rows + kInRows - 1) / kInRows; }

__device__ __forceinline__ int64_t in_units(const DeltaNetLayerParams& p) {
  return units_of(p.in_qkv.out) + units_of(p.in_z.out) +
         units_of(p.in_a.out) + units_of(p.in_b.out);
}

// Phase 1's unit `unit`: kInRows consecutive rows of one projection. Units are numbered over the
// four projections in turn (qkv, z, a, b), ceil(rows / kInRows) each.
__device__ __forceinline__ RowSource in_rows(const DeltaNetLayerParams& p, int64_t unit) {
  const int64_t u_qkv = units_of(p.in_qkv.out);
  const int64_t u_z = u_qkv + units_of(p.in_z.out);
  const int64_t u_a = u_z + units_of(p.in_a.out);
  if (unit < u_qkv) return source(p.in_qkv, unit * kInRows, p.mixed);
  if (unit < u_z) return source(p.in_z, (unit - u_qkv) * kInRows, p.z);
  if (unit < u_a) return source(p.in_a, (unit - u_z) * kInRows, p.a);
  return source(p.in_b, (unit - u_a) * kInRows, p.b);
}

// Row pointers of kRows rows from src.first (rows past the end re-read the last one: they keep
// the segment in step and are never stored).
template <int Bits, int kRows>
struct RowPointers {
  const uint32_t* codes[kRows];
  const __nv_bfloat16* scales[kRows];
  const __nv_bfloat16* biases[kRows];
  __device__ __forceinline__ explicit RowPointers(const RowSource& src) {
    const int64_t words = src.in * Bits / 32;
    const int64_t groups = src.in / kGroupSize;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t row = src.first + i < src.rows ? src.first + i : src.rows - 1;
      codes[i] = src.codes + row * words;
      scales[i] = src.scales + row * groups;
      biases[i] = src.biases + row * groups;
    }
  }
};

// acc += the rows' chunks c_next, c_next + lanes, ... < chunks from global memory (never in the
// model), then each row's segment sum is stored to y[first + i] by the segment's first lane
// when `store` and the row exists: gemv_kernel's order, the chunks before c_next being in acc.
template <int Bits, int kRows>
__device__ __forceinline__ void finish_rows(const RowSource& src, bool store, float (&acc)[kRows][1],
                                            const gemv_detail::SharedActs& acts, int chunks,
                                            int c_next, int lanes) {
  const int64_t row_chunk[1] = {0};
  if (c_next < chunks) {
    const RowPointers<Bits, kRows> ptr(src);
    gemv_detail::rows_dot<Bits, kRows, 1, 1>(ptr.codes, ptr.scales, ptr.biases, acts, row_chunk,
                                             chunks, c_next, lanes, acc);
  }
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const float v = gemv_detail::segment_sum(acc[i][0], lanes);
    if (store && (lane & (lanes - 1)) == 0 && src.first + i < src.rows) src.y[src.first + i] = v;
  }
}


// Stores one float of the block's swizzled activation copy (gemv_detail::SharedActs layout).
template <int Bits>
__device__ __forceinline__ void store_swizzled(float4* dst, int64_t f, float v) {
  constexpr int kValues = Chunk<Bits>::kValues;
  const int within = static_cast<int>(f % kValues);
  reinterpret_cast<float*>(dst)[4 * gemv_detail::swizzled_float4<Bits>(f / kValues, within / 4) +
                                within % 4] = v;
}

// The gated RMSNorm of value head h (Dv <= 256) into gated[h], as norm_warp_kernel<gated>: lane
// l of one warp holds values l + 32c; core_out and z come from this launch (through L2).
__device__ void head_gated_norm(const DeltaNetLayerParams& p, int h) {
  const int Dv = p.shape.value_dim;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const float* x = p.core_out + static_cast<int64_t>(h) * Dv;
  const float* z = p.z + static_cast<int64_t>(h) * Dv;
  float v[8];
  float zv[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const int i = lane + 32 * c;
    v[c] = i < Dv ? load_shared_result(x + i) : 0.0f;
    zv[c] = i < Dv ? load_shared_result(z + i) : 0.0f;
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    if (lane + 32 * c < Dv) sum_sq = fmaf(v[c], v[c], sum_sq);
  }
  const float inv = rms_scale(warp_sum(sum_sq), Dv, p.eps);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const int i = lane + 32 * c;
    if (i < Dv) {
      float o = v[c] * inv * p.gated_norm_gain[i];
      o *= zv[c] * sigmoidf_(zv[c]);  // silu as the CPU forms it: z * sigmoid(z)
      p.gated[static_cast<int64_t>(h) * Dv + i] = o;
    }
  }
}

// ---- the per-warp staging of the first unit's weights (shared memory, cp.async) ----------
// At kernel start, before the dependency wait, every lane copies the code chunks it will
// multiply in phases 1 and 3, and the segment's lanes the rows' scales and biases, into the
// warp's part of shared memory: the whole layer's weights are then in flight from the first
// instruction on, and the phases read them from shared memory, without holding registers
// across the phases before. Layout per warp (bytes): phase 1 codes uint4 [kInUnroll][kInRows]
// [32 lanes], phase 3 codes uint4 [kOutUnroll][32], phase 1 scales then biases bf16
// [segments][kInRows][groups], phase 3 scales then biases bf16 [segments][groups]
// (segments x groups <= kMaxGroups: hidden and Hv Dv <= 4096).
constexpr int kMaxGroups = 64;
constexpr int64_t kStageInCodes = int64_t(kInUnroll) * 6 * 32 * 16;  // kInRows = 6
constexpr int64_t kStageOutCodes = int64_t(kOutUnroll) * 32 * 16;
constexpr int64_t kStageInScales = 2LL * 6 * kMaxGroups * 2;
constexpr int64_t kStageOutScales = 2LL * kMaxGroups * 2;
constexpr int64_t kStagePerWarp = kStageInCodes + kStageOutCodes + kStageInScales + kStageOutScales;

struct WarpStage {
  uint4* in_codes;
  uint4* out_codes;
  __nv_bfloat16* in_sb;   // this segment's [2][kInRows][groups]
  __nv_bfloat16* out_sb;  // this segment's [2][groups]
};

// Copies the R rows of src (chunks c_first + u * lanes < chunks) to codes[u][i][lane] and the
// rows' scales and biases to sb[0 | 1][i][groups] (rows past the end are not copied: the reads
// clamp to the last row). groups must be even (4-byte copies).
template <int Bits, int kRows, int U>
__device__ __forceinline__ void stage_rows(const RowSource& src, int chunks, int c_first, int lanes,
                                           uint4* codes, __nv_bfloat16* sb) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t words = src.in * Bits / 32;
  const int groups = static_cast<int>(src.in / kGroupSize);
  const int64_t live = src.rows - src.first < kRows ? src.rows - src.first : kRows;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = c_first + u * lanes;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      if (c < chunks && i < live) {
        ptx::cp_async16(ptx::smem_u32(codes + (u * kRows + i) * 32 + lane),
                        src.codes + (src.first + i) * words + 4 * c, 16);
      }
    }
  }
  const int sb_words = static_cast<int>(live) * groups / 2;  // per array
  const auto* scales = reinterpret_cast<const uint32_t*>(src.scales + src.first * groups);
  const auto* biases = reinterpret_cast<const uint32_t*>(src.biases + src.first * groups);
  auto* dst = reinterpret_cast<uint32_t*>(sb);
  for (int w = c_first; w < sb_words; w += lanes) {
    ptx::cp_async4(ptx::smem_u32(dst + w), scales + w, 4);
    ptx::cp_async4(ptx::smem_u32(dst + kRows * groups / 2 + w), biases + w, 4);
  }
}

// acc += the staged rows' first U chunks . acts, one chunk of every row at a time (from shared
// memory: no register holds a chunk before its turn).
template <int Bits, int kRows, int U>
__device__ __forceinline__ void dot_staged(const RowSource& src, int chunks, int c_first, int lanes,
                                           const uint4* codes, const __nv_bfloat16* sb,
                                           const gemv_detail::SharedActs& acts,
                                           float (&acc)[kRows][1]) {
  using C = Chunk<Bits>;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int groups = static_cast<int>(src.in / kGroupSize);
  const int64_t last = src.rows - 1 - src.first;  // the last live row of the unit
  const int64_t row_chunk[1] = {0};
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = c_first + u * lanes;
    if (c >= chunks) continue;
    gemv_detail::WeightBatch<kRows, 1> batch;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = i < last ? i : static_cast<int>(last);  // rows past the end: the last (never stored)
      batch.q[0][i] = codes[(u * kRows + r) * 32 + lane];
      batch.s[0][i] = __bfloat162float(sb[r * groups + c / C::kPerGroup]);
      batch.b[0][i] = __bfloat162float(sb[kRows * groups + r * groups + c / C::kPerGroup]);
    }
    gemv_detail::dot_batch<Bits, kRows, 1, 1>(batch, acts, row_chunk, chunks, c, lanes, acc);
  }
}


// Phase-end stamps (%globaltimer) of block b at timeline[b * kDeltaNetLayerStamps + phase].
__device__ __forceinline__ void stamp(unsigned long long* timeline, int phase) {
  if (timeline == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  timeline[blockIdx.x * kDeltaNetLayerStamps + phase] = t;
}

template <int Dk>
__global__ void __launch_bounds__(kThreads, 2) delta_net_layer_kernel(DeltaNetLayerParams p) {
  extern __shared__ float4 smem[];
  __shared__ float partial[kWarps];
  __shared__ int last_tile;
  const int64_t H = p.hidden;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  // Virtual warp j * grid + b for warp j of block b: units go round-robin over the blocks
  // first, so that a phase with fewer units than warps still spreads over every SM.
  const int64_t warp = static_cast<int64_t>(threadIdx.x / 32) * gridDim.x + blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int Dv = p.shape.value_dim;
  const int tiles_per_head = (Dv + delta_detail::kDecodeCols - 1) / delta_detail::kDecodeCols;
  const int tiles = p.shape.value_heads * tiles_per_head;

  // Shared memory: [3H] floats of activations (phase 0-1: [H] normed, swizzled, then [2H] sums;
  // phase 3: [Hv Dv] gated, swizzled), then kStagePerWarp bytes per warp.
  const int64_t acts_bytes = 4 * (3 * H > p.out_proj.in ? 3 * H : p.out_proj.in);
  char* stage_base = reinterpret_cast<char*>(smem) + acts_bytes + (threadIdx.x / 32) * kStagePerWarp;
  const int in_chunks = static_cast<int>(H / Chunk<kBits>::kValues);
  const int in_lanes = gemv_detail::lanes_for_chunks(in_chunks);
  const int in_segments = 32 / in_lanes;
  const int in_first = lane & (in_lanes - 1);
  const int in_groups = static_cast<int>(H / kGroupSize);
  const int64_t Vw = p.out_proj.in;
  const int out_chunks = static_cast<int>(Vw / Chunk<kBits>::kValues);
  const int out_lanes = gemv_detail::lanes_for_chunks(out_chunks);
  const int out_segments = 32 / out_lanes;
  const int out_first = lane & (out_lanes - 1);
  const int out_groups = static_cast<int>(Vw / kGroupSize);
  const WarpStage stage{
      reinterpret_cast<uint4*>(stage_base), reinterpret_cast<uint4*>(stage_base + kStageInCodes),
      reinterpret_cast<__nv_bfloat16*>(stage_base + kStageInCodes + kStageOutCodes) +
          (lane / in_lanes) * 2 * kInRows * in_groups,
      reinterpret_cast<__nv_bfloat16*>(stage_base + kStageInCodes + kStageOutCodes + kStageInScales) +
          (lane / out_lanes) * 2 * out_groups};

  // Before the wait: weights and the state only (the previous kernel writes neither). The
  // first unit of phase 1 and the first row of phase 3 into shared memory (two cp.async
  // groups), the segment's later units and this block's state tile into L2.
  const int64_t units = in_units(p);
  const int64_t first_unit = warp * in_segments + lane / in_lanes;
  const RowSource first_in = in_rows(p, first_unit < units ? first_unit : units - 1);
  if (warp * in_segments < units) {
    stage_rows<kBits, kInRows, kInUnroll>(first_in, in_chunks, in_first, in_lanes, stage.in_codes, stage.in_sb);
  }
  ptx::cp_async_commit();
  const int64_t first_out = warp * out_segments + lane / out_lanes;
  const RowSource first_row = source(p.out_proj, first_out < H ? first_out : H - 1, p.out);
  if (warp * out_segments < H) {
    stage_rows<kBits, 1, kOutUnroll>(first_row, out_chunks, out_first, out_lanes, stage.out_codes, stage.out_sb);
  }
  ptx::cp_async_commit();
  for (int64_t unit = first_unit + warps * in_segments; unit < units; unit += warps * in_segments) {
    const RowSource src = in_rows(p, unit);
    const int64_t words = src.in * kBits / 32;
    for (int i = 0; i < kInRows && src.first + i < src.rows; ++i) {
      for (int c = in_first; c < in_chunks; c += in_lanes) {
        prefetch_l2(src.codes + (src.first + i) * words + 4 * c);
      }
    }
  }
  if (static_cast<int>(blockIdx.x) < tiles) {
    const int h = static_cast<int>(blockIdx.x) / tiles_per_head;
    const int c0 = (static_cast<int>(blockIdx.x) % tiles_per_head) * delta_detail::kDecodeCols;
    const int cols = Dv - c0 < delta_detail::kDecodeCols ? Dv - c0 : delta_detail::kDecodeCols;
    const char* tile = reinterpret_cast<const char*>(p.state + (static_cast<int64_t>(h) * Dk * Dv + c0));
    for (int r = static_cast<int>(threadIdx.x); r < Dk; r += kThreads) {
      for (int at = 0; at < cols * 4; at += 32) prefetch_l2(tile + static_cast<int64_t>(r) * Dv * 4 + at);
    }
  }
  grid_dependency_wait();
  stamp(p.timeline, 0);

  // Phase 0: the input norm, staged for the projections.
  float4* normed_s = smem;
  float* sums = reinterpret_cast<float*>(smem + H / 4);
  if (p.add_norm) {
    const ResidualNormArgs args{p.residual, p.delta, p.norm_gain, p.normed, H, p.eps};
    residual_norm_any(args, sums, partial, [&](int64_t q, float4 v) {
      constexpr int F = Chunk<kBits>::kValues / 4;
      normed_s[gemv_detail::swizzled_float4<kBits>(q / F, static_cast<int>(q % F))] = v;
    });
  } else {
    gemv_detail::stage_acts<kBits>(p.normed, H, true, 0, normed_s);
  }
  __syncthreads();
  stamp(p.timeline, 1);

  // Phase 1: the projections. One unit per lane segment and trip; the first is staged.
  const gemv_detail::SharedActs in_acts{normed_s};
  ptx::cp_async_wait<1>();  // this lane's phase-1 copies
  __syncwarp();             // and the segment's scales and biases
  for (int64_t base = warp * in_segments; base < units; base += warps * in_segments) {
    const int64_t unit = base + lane / in_lanes;
    const RowSource rows = in_rows(p, unit < units ? unit : units - 1);
    // The first unit's first chunks from the staging; anything else from global memory.
    float acc[kInRows][1] = {};
    const bool staged = base == warp * in_segments;
    if (staged) {
      dot_staged<kBits, kInRows, kInUnroll>(rows, in_chunks, in_first, in_lanes, stage.in_codes,
                                            stage.in_sb, in_acts, acc);
    }
    // (A dead segment, past the last unit, stores nothing.)
    finish_rows<kBits, kInRows>(rows, unit < units, acc, in_acts, in_chunks,
                                staged ? in_first + kInUnroll * in_lanes : in_first, in_lanes);
  }
  stamp(p.timeline, 2);

  // Barrier 1; phase 2: the delta rule, one tile per block of the first `tiles`. The tile's
  // state and taps load between the arrival and the wait. The last of a head's tiles to
  // finish then forms the head's gated norm (a counter per head; monotonic, as the barrier).
  const unsigned long long target1 = grid_arrive(p.barrier);
  // (The lambda copies what it needs: capturing the kernel parameter by reference would copy
  // all of it to local memory.)
  unsigned long long* const barrier = p.barrier;
  unsigned long long* const timeline = p.timeline;
  const auto wait1 = [barrier, target1, timeline] {
    grid_wait(barrier, target1);
    stamp(timeline, 3);
  };
  if (static_cast<int>(blockIdx.x) < tiles) {
    const int h = static_cast<int>(blockIdx.x) / tiles_per_head;
    delta_detail::DeltaDecodeArgs args;
    args.fused = delta_detail::FusedConv{p.mixed, p.window, p.conv_weight};
    args.a = p.a;
    args.b = p.b;
    args.a_log = p.a_log;
    args.dt_bias = p.dt_bias;
    args.state = p.state;
    args.key_heads = p.shape.key_heads;
    args.value_heads = p.shape.value_heads;
    args.value_dim = Dv;
    args.q_scale = p.q_scale;
    args.out = p.core_out;
    delta_detail::delta_decode_tile<Dk, kFusedConvKernel, true>(
        args, h, static_cast<int>(blockIdx.x) % tiles_per_head, wait1, [] {});
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();  // this tile's core_out before its count (as grid_arrive)
      const unsigned done = atomicAdd(p.head_counts + h, 1u) + 1u;
      last_tile = done % static_cast<unsigned>(tiles_per_head) == 0;
      __threadfence();
    }
    __syncthreads();
    if (last_tile && threadIdx.x < 32) head_gated_norm(p, h);
  } else {
    wait1();
  }
  // Block 0 now owns the residual: every block has read it.
  if (p.add_norm && blockIdx.x == 0) {
    for (int64_t q = threadIdx.x; q < H / 4; q += kThreads) {
      reinterpret_cast<float4*>(p.residual)[q] = reinterpret_cast<const float4*>(sums)[q];
    }
  }
  stamp(p.timeline, 4);

  grid_barrier(p.barrier);
  stamp(p.timeline, 5);

  // Phase 3: every tile has read the window: shift it by this token (gemv_kernel's
  // shift_window); the gated norm into shared memory, then the output rows.
  {
    const int64_t C = p.in_qkv.out;  // the channels (checked at plan build)
    const int K = p.shape.conv_kernel;
    const int64_t threads = static_cast<int64_t>(gridDim.x) * kThreads;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < C; c += threads) {
      for (int j = 0; j + 1 < K - 1; ++j) p.window[j * C + c] = p.window[(j + 1) * C + c];
      p.window[(K - 2) * C + c] = load_shared_result(p.mixed + c);
    }
  }
  float4* gated_s = smem;
  {
    constexpr int F = Chunk<kBits>::kValues / 4;
    for (int64_t f = threadIdx.x; f < Vw / 4; f += kThreads) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(p.gated) + f);
      gated_s[gemv_detail::swizzled_float4<kBits>(f / F, static_cast<int>(f % F))] = v;
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();
  stamp(p.timeline, 6);
  const gemv_detail::SharedActs out_acts{gated_s};
  for (int64_t base = warp * out_segments; base < H; base += warps * out_segments) {
    const int64_t row = base + lane / out_lanes;
    const RowSource rows = source(p.out_proj, row < H ? row : H - 1, p.out);
    float acc[1][1] = {};
    const bool staged = base == warp * out_segments;
    if (staged) {
      dot_staged<kBits, 1, kOutUnroll>(rows, out_chunks, out_first, out_lanes, stage.out_codes,
                                       stage.out_sb, out_acts, acc);
    }
    finish_rows<kBits, 1>(rows, row < H, acc, out_acts, out_chunks,
                          staged ? out_first + kOutUnroll * out_lanes : out_first, out_lanes);
  }
  allow_dependent_launch();  // every block is past the barriers: the next kernel cannot starve one
  __syncthreads();
  stamp(p.timeline, 7);
}

size_t shared_bytes(const DeltaNetLayerParams& p) {
  const int64_t acts = 3 * p.hidden > p.out_proj.in ? 3 * p.hidden : p.out_proj.in;
  return static_cast<size_t>(4 * acts + kWarps * kStagePerWarp);
}

void* kernel_for(int key_dim) {
  switch (key_dim) {
    case 32: return reinterpret_cast<void*>(delta_net_layer_kernel<32>);
    case 64: return reinterpret_cast<void*>(delta_net_layer_kernel<64>);
    case 128: return reinterpret_cast<void*>(delta_net_layer_kernel<128>);
    default: return nullptr;
  }
}

}  // namespace

std::string delta_net_layer_unsupported(const DeltaNetLayerParams& p) {
  const DeltaNetShape& d = p.shape;
  if (kernel_for(d.key_dim) == nullptr) return "key_dim " + std::to_string(d.key_dim) + " (built: 32, 64, 128)";
  if (d.conv_kernel != kFusedConvKernel) {
    return "conv kernel " + std::to_string(d.conv_kernel) + " (built: " + std::to_string(kFusedConvKernel) + ")";
  }
  if (d.key_heads <= 0 || d.value_heads % d.key_heads != 0 ||
      (d.value_dim != 32 && d.value_dim != 64 && d.value_dim != 128)) {
    return "value heads / dims (needs value_heads a multiple of key_heads, value_dim 32, 64 or 128, "
           "as the op path)";
  }
  const QuantMatrix* const all[5] = {&p.in_qkv, &p.in_z, &p.in_a, &p.in_b, &p.out_proj};
  for (const QuantMatrix* w : all) {
    if (w->bits != kBits) return "a " + std::to_string(w->bits) + "-bit projection (built: 4-bit)";
  }
  const int64_t Vw = static_cast<int64_t>(d.value_heads) * d.value_dim;
  if (p.in_qkv.in != p.hidden || p.in_z.in != p.hidden || p.in_a.in != p.hidden ||
      p.in_b.in != p.hidden || p.in_qkv.out != d.channels() || p.in_z.out != Vw ||
      p.in_a.out != d.value_heads || p.in_b.out != d.value_heads || p.out_proj.in != Vw ||
      p.out_proj.out != p.hidden) {
    return "projection shapes do not chain (in = hidden; out = channels, Hv Dv, Hv, Hv; out_proj Hv Dv -> hidden)";
  }
  // Widths of whole pairs of groups (the scales are staged 4 bytes at a time), at most
  // kMaxGroups groups (the staging area of a warp).
  if (p.hidden % 128 != 0 || p.hidden > 4096 || Vw % 128 != 0 || Vw > 4096) {
    return "hidden width " + std::to_string(p.hidden) + " or Hv Dv " + std::to_string(Vw) +
           " (needs multiples of 128, <= 4096)";
  }
  return "";
}

int delta_net_layer_grid(const DeltaNetLayerParams& p) {
  void* kernel = kernel_for(p.shape.key_dim);
  if (kernel == nullptr) return 0;
  // Above the default 48 KB of dynamic shared memory (set once, at plan build: not capturable).
  LILY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared_bytes(p))));
  int per_sm = 0;
  LILY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, shared_bytes(p)));
  const int grid = per_sm * sm_count();  // (0 when one block's shared memory does not fit an SM)
  const int tiles_per_head = (p.shape.value_dim + delta_detail::kDecodeCols - 1) / delta_detail::kDecodeCols;
  return grid >= p.shape.value_heads * tiles_per_head ? grid : 0;
}

void delta_net_layer(const DeltaNetLayerParams& p, int grid, Stream s) {
  const size_t bytes = shared_bytes(p);
  void* kernel = kernel_for(p.shape.key_dim);
  if (kernel == nullptr) {
    throw std::invalid_argument("cuda::delta_net_layer: key_dim " + std::to_string(p.shape.key_dim));
  }
  launch(reinterpret_cast<void (*)(DeltaNetLayerParams)>(kernel), static_cast<unsigned>(grid),
         kThreads, bytes, s, p);
}

}  // namespace lily::cuda::lab

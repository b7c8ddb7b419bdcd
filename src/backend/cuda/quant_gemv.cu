// Decode kernels over MLX affine Q4/Q8 weights: GEMV for n <= 8 tokens, embedding gather, argmax.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quant_dot.cuh"

namespace lily::cuda {

using gemv_detail::Chunk;

namespace {

// ---- gemv ---------------------------------------------------------------------------------
// A segment of `lanes` lanes owns kGemvRows<NT> consecutive rows; its lanes stride over the rows'
// 16-byte chunks (lanes = chunks per row rounded up to a power of two, at most 32, so short
// rows such as in = 512 still keep every lane busy). Activations are not staged in shared
// memory: they are read through L1 (x is at most 8 x 8192 f32 and every warp reads the same
// values), and each loaded activation serves kGemvRows<NT> rows, which keeps L1 traffic below
// the weight stream. No shared memory, so any `in` and n <= 8 need no tiling.
constexpr int kGemvThreads = 128;
// Rows per lane segment: each activation a lane loads serves that many rows, and each lane
// keeps that many 16-byte weight loads in flight. Activation loads (4 bytes per value per
// token through L1) otherwise cost more than the weight stream itself (0.5 byte per value):
// measured on an H200, lm_head [248320, 2048] n=1 ran at 0.5 TB/s with 1 row, 0.95 with 2,
// 1.6 with 4 and 2.1 TB/s with 8. With more tokens the accumulators and activations need the
// registers (and the kernel is FMA bound): 4 rows from n = 3 on (n = 8: 176 GB/s with 4 rows,
// 101 with 2).
template <int NT>
inline constexpr int kGemvRows = NT <= 2 ? 8 : 4;
// Unless that leaves the GPU idle: a small matrix (the router's 257 rows, or 2048 rows of
// 4096 inputs, 64 blocks at 8 rows) takes fewer rows per segment so that it spreads over at
// least one block per SM (each lane then walks fewer rows; the activations serve fewer rows
// per load, which costs little at these sizes).
// Chunks per lane loaded before any is used (kGemvRows loads are already in flight). Two
// would put a 2048-wide row's both chunks in flight at once, but takes 255 registers: half
// the blocks per SM, so no more loads in flight over the GPU.
inline constexpr int kGemvUnroll = 1;
// At most 128 registers for n <= 2 (4 blocks, 16 warps per SM: enough loads in flight);
// the many-token variants may use more rather than spill.
template <int NT>
inline constexpr int kGemvMinBlocks = NT <= 2 ? 4 : 1;

// The targets of one launch, and the blocks of each: target i owns blocks
// [block_end[i - 1], block_end[i]) (block_end[-1] = 0).
struct GemvBatch {
  GemvTarget target[kMaxGemvTargets];
  unsigned block_end[kMaxGemvTargets] = {};
  int count = 0;
  WindowShift shift;        // active when shift.window != nullptr
};

// The WindowShift side job: each thread of the launch takes channels c, c + threads, ...
__device__ void shift_window(const WindowShift& w) {
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < w.channels;
       c += threads) {
    for (int j = 0; j + 1 < w.conv_kernel - 1; ++j) {
      w.window[j * w.channels + c] = w.window[(j + 1) * w.channels + c];
    }
    w.window[(w.conv_kernel - 2) * w.channels + c] = w.mixed[c];
  }
}

// For each target: y[t, r] = W[row_begin + r] . x[t] for r < rows, t < NT.
// x [NT, in] f32 (every target has the same `in`); y [NT, rows] f32 per target.
// kShared: x [NT, in] is staged in shared memory (gemv_detail::SharedActs), NT * in * 4 bytes
// of dynamic shared memory.
template <int Bits, int NT, int kRows, bool kShared>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocks<NT>)
    gemv_kernel(GemvBatch batch, const float* __restrict__ x, int lanes, bool x_vec) {
  // This block's target, selected with constant indices (a dynamic index into the kernel
  // parameters would copy them to local memory).
  GemvTarget target = batch.target[0];
  unsigned first_block = 0;
#pragma unroll
  for (int i = 1; i < kMaxGemvTargets; ++i) {
    if (i < batch.count && blockIdx.x >= batch.block_end[i - 1]) {
      target = batch.target[i];
      first_block = batch.block_end[i - 1];
    }
  }
  const QuantMatrix& w = target.w;
  const int64_t rows = target.rows;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int segments = 32 / lanes;
  const int64_t warp =
      static_cast<int64_t>(blockIdx.x - first_block) * (kGemvThreads / 32) + threadIdx.x / 32;
  const bool live = warp * segments * kRows < rows;  // whole warps leave (shuffles below)
  const int64_t first = (warp * segments + lane / lanes) * kRows;  // first row (relative)
  // (QuantMatrix's helpers are host-only, so the sizes are spelled out.)
  const int64_t words = w.in * Bits / 32;
  const int64_t groups = w.in / kGroupSize;
  const int chunks = static_cast<int>(w.in / Chunk<Bits>::kValues);

  const uint32_t* codes[kRows];
  const __nv_bfloat16* scales[kRows];
  const __nv_bfloat16* biases[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    // Rows past the end re-read the last row (keeps the segment in step); never stored.
    const int64_t row = target.row_begin + (first + i < rows ? first + i : rows - 1);
    codes[i] = w.codes + row * words;
    scales[i] = w.scales + row * groups;
    biases[i] = w.biases + row * groups;
  }
  // Weights do not depend on the previous kernel: while that kernel finishes (see
  // grid_dependency_wait), load this lane's first batch into registers and start pulling the
  // rest of its share into L2, so that after the wait only the activations are waited for.
  // Fewer rows per segment, more chunks per lane in flight: about 8 16-byte loads either way.
  constexpr int kUnroll = kRows >= 8 ? kGemvUnroll : 8 / kRows;
  const int c_first = lane & (lanes - 1);
  gemv_detail::WeightBatch<kRows, kUnroll> first_batch;
  if (live) {
    gemv_detail::load_batch<Bits, kRows, kUnroll>(codes, scales, biases, chunks, c_first, lanes,
                                                  first_batch);
    for (int c = c_first + kUnroll * lanes; c < chunks; c += lanes) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) prefetch_l2(codes[i] + 4 * c);
    }
  }
  grid_dependency_wait();
  // The Gated DeltaNet's output projection (the launch that shifts the conv window) lets the
  // persistent MoE block after it launch now rather than after its loop: the block's pre-wait
  // L2 prefetches of its router and shared-expert rows then overlap the whole projection (it
  // waits for this grid to complete before reading the projection's output, so no value
  // changes). H200, 2026-12-07: +1.4% at 256 (three rounds), +0.8% to +1.5% from 4,096 to
  // 131,072 (docs/perf/bench-cuda.md). The second trigger below is then a no-op.
  if (batch.shift.window != nullptr) allow_dependent_launch();
  if (batch.shift.window != nullptr) shift_window(batch.shift);
  int64_t row_chunk[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) row_chunk[t] = static_cast<int64_t>(t) * chunks;
  float acc[kRows][NT] = {};
  const int c_next = c_first + kUnroll * lanes;
  // (The preloaded first batch, then the rest of the lane's chunks, in both branches: one
  // generic lambda for the two would be shorter, but it made ptxas spill twice as much in
  // the n = 8 variant.)
  if constexpr (kShared) {
    extern __shared__ float4 staged[];
    gemv_detail::stage_acts<Bits>(x, NT * w.in, x_vec, 0, staged);
    __syncthreads();
    if (!live) return;  // after the wait and the block's sync
    const gemv_detail::SharedActs acts{staged};
    gemv_detail::dot_batch<Bits, kRows, NT, kUnroll>(first_batch, acts, row_chunk, chunks, c_first,
                                                     lanes, acc);
    gemv_detail::rows_dot<Bits, kRows, NT, kUnroll>(codes, scales, biases, acts, row_chunk, chunks,
                                                    c_next, lanes, acc);
  } else {
    if (!live) return;  // after the wait: see grid_dependency_wait
    const gemv_detail::GlobalActs acts{x, x_vec};
    gemv_detail::dot_batch<Bits, kRows, NT, kUnroll>(first_batch, acts, row_chunk, chunks, c_first,
                                                     lanes, acc);
    gemv_detail::rows_dot<Bits, kRows, NT, kUnroll>(codes, scales, biases, acts, row_chunk, chunks,
                                                    c_next, lanes, acc);
  }
  allow_dependent_launch();

#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = gemv_detail::segment_sum(acc[i][t], lanes);
      if ((lane & (lanes - 1)) == 0 && first + i < rows) target.y[t * rows + first + i] = v;
    }
  }
}

template <int Bits, int NT, int kRows>
void launch_gemv_rows(const GemvTarget* targets, int count, const float* x, Stream s,
                      const WindowShift& shift) {
  const int lanes = gemv_detail::lanes_for_chunks(targets[0].w.in / Chunk<Bits>::kValues);
  const int64_t rows_per_block = (kGemvThreads / 32) * (32 / lanes) * kRows;
  GemvBatch batch;
  batch.count = count;
  batch.shift = shift;
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    batch.target[i] = targets[i];
    blocks += (targets[i].rows + rows_per_block - 1) / rows_per_block;
    if (blocks > INT32_MAX) throw std::invalid_argument("cuda::gemv: too many rows");
    batch.block_end[i] = static_cast<unsigned>(blocks);
  }
  // Activations go through shared memory when they fit the default 48 KB (decode: 8 or 16 KB).
  // (Only for n <= 2: more tokens already serve each activation load several times.)
  const size_t act_bytes = static_cast<size_t>(NT) * targets[0].w.in * sizeof(float);
  if constexpr (NT <= 2) {
    if (act_bytes <= kMaxStagedBytes) {
      return launch(gemv_kernel<Bits, NT, kRows, true>, static_cast<unsigned>(blocks),
                    kGemvThreads, act_bytes, s, batch, x, lanes, aligned16(x));
    }
  }
  launch(gemv_kernel<Bits, NT, kRows, false>, static_cast<unsigned>(blocks), kGemvThreads, 0, s,
         batch, x, lanes, aligned16(x));
}

template <int Bits, int NT>
void launch_gemv(const GemvTarget* targets, int count, const float* x, Stream s,
                 const WindowShift& shift) {
  if constexpr (kGemvRows<NT> == 8) {
    const int lanes = gemv_detail::lanes_for_chunks(targets[0].w.in / Chunk<Bits>::kValues);
    const int64_t segments_per_block = (kGemvThreads / 32) * (32 / lanes);
    int64_t rows = 0;
    for (int i = 0; i < count; ++i) rows += targets[i].rows;
    const auto blocks_at = [&](int r) { return (rows + segments_per_block * r - 1) / (segments_per_block * r); };
    if (blocks_at(8) < sm_count()) {
      if (blocks_at(2) >= sm_count()) {
        return launch_gemv_rows<Bits, NT, 2>(targets, count, x, s, shift);
      }
      return launch_gemv_rows<Bits, NT, 1>(targets, count, x, s, shift);
    }
  }
  launch_gemv_rows<Bits, NT, kGemvRows<NT>>(targets, count, x, s, shift);
}

template <int Bits>
void gemv_bits(const GemvTarget* targets, int count, const float* x, int64_t n, Stream s,
               const WindowShift& shift) {
  switch (n) {
    case 1: return launch_gemv<Bits, 1>(targets, count, x, s, shift);
    case 2: return launch_gemv<Bits, 2>(targets, count, x, s, shift);
    case 3: return launch_gemv<Bits, 3>(targets, count, x, s, shift);
    case 4: return launch_gemv<Bits, 4>(targets, count, x, s, shift);
    case 5: return launch_gemv<Bits, 5>(targets, count, x, s, shift);
    case 6: return launch_gemv<Bits, 6>(targets, count, x, s, shift);
    case 7: return launch_gemv<Bits, 7>(targets, count, x, s, shift);
    case 8: return launch_gemv<Bits, 8>(targets, count, x, s, shift);
    default:
      throw std::invalid_argument("cuda::gemv: n = " + std::to_string(n) + " outside 1..8");
  }
}

// ---- embed --------------------------------------------------------------------------------
constexpr int kEmbedThreads = 256;

// out[t, c] = scale * q + bias of table row ids[t] (row clamped into the table). One block per token, one thread per value
// (coalesced stores; neighbouring threads re-read the same code word from L1).
// ids [n] i32 (device); out [n, in] f32.
__global__ void __launch_bounds__(kEmbedThreads)
    embed_kernel(QuantMatrix table, const int32_t* __restrict__ ids, float* __restrict__ out) {
  grid_dependency_wait();
  const int64_t t = blockIdx.x;
  // Ids come from the host or from argmax on the device and are in range; the clamp only
  // keeps a corrupt id from reading outside the table.
  const int64_t table_rows = table.experts * table.out;
  int64_t row = ids[t];
  row = row < 0 ? 0 : (row >= table_rows ? table_rows - 1 : row);
  const int per_word = 32 / table.bits;
  const int64_t groups = table.in / kGroupSize;
  const uint32_t* codes = table.codes + row * (table.in / per_word);
  const __nv_bfloat16* scales = table.scales + row * groups;
  const __nv_bfloat16* biases = table.biases + row * groups;
  for (int64_t c = threadIdx.x; c < table.in; c += kEmbedThreads) {
    const uint32_t word = codes[c / per_word];
    const int j = static_cast<int>(c % per_word);
    const float q = table.bits == 4 ? q4_at(word, j) : q8_at(word, j);
    const int64_t g = c / kGroupSize;
    // f32 multiply, then add, never contracted to an FMA: bit for bit the MLX reference
    // dequantisation (checkpoint/mlx_quant.h) and the CPU backend.
    out[t * table.in + c] =
        __fadd_rn(__fmul_rn(__bfloat162float(scales[g]), q), __bfloat162float(biases[g]));
  }
}

// ---- argmax -------------------------------------------------------------------------------
// Stage 1: a grid of (n, blocks); each block reduces a contiguous span of one row to its best
// (value, index). Stage 2: one block per row reduces the partials. Partials live in the
// workspace: values f32 [n, blocks] then indices i32 [n, blocks].
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxPerThread = 8;  // values a thread loads before comparing (loads in flight)
constexpr int64_t kArgmaxSpan = kArgmaxThreads * kArgmaxPerThread;  // values per block pass
constexpr int64_t kArgmaxMaxBlocks = 1024;

// Whether (av, ai) ranks before (bv, bi): larger value first, NaN after every number, and the
// lower index first among equal values (and among NaNs). A total order, so any reduction tree
// gives the same answer as the CPU's strict > scan (which never moves off a number to a NaN).
__device__ __forceinline__ bool ranks_before(float av, int32_t ai, float bv, int32_t bi) {
  const bool an = isnan(av);
  const bool bn = isnan(bv);
  if (an || bn) return an && bn ? ai < bi : bn;
  return av > bv || (av == bv && ai < bi);
}

// Reduces (v, i) over the block; the result is valid in thread 0.
__device__ __forceinline__ void block_best(float& v, int32_t& i) {
  __shared__ float vals[kArgmaxThreads / 32];
  __shared__ int32_t idxs[kArgmaxThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, i, offset);
    if (ranks_before(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
  const int warp = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) {
    vals[warp] = v;
    idxs[warp] = i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) {
      if (ranks_before(vals[w], idxs[w], v, i)) {
        v = vals[w];
        i = idxs[w];
      }
    }
  }
}

// logits [n, vocab] f32; part_v, part_i [n, gridDim.y]; `span` values per block.
// Rows on grid x (up to 2^31 - 1), blocks of a row on grid y (at most kArgmaxMaxBlocks).
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_partial_kernel(const float* __restrict__ logits, int64_t vocab, int64_t span,
                          float* __restrict__ part_v, int32_t* __restrict__ part_i) {
  grid_dependency_wait();
  const int64_t t = blockIdx.x;
  const float* row = logits + t * vocab;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * span;
  const int64_t end = begin + span < vocab ? begin + span : vocab;
  // Sentinel: a NaN at an index past every real one loses to any real element.
  float best_v = NAN;
  int32_t best_i = INT32_MAX;
  for (int64_t base = begin; base < end; base += kArgmaxSpan) {
    float v[kArgmaxPerThread];
#pragma unroll
    for (int k = 0; k < kArgmaxPerThread; ++k) {
      const int64_t idx = base + k * kArgmaxThreads + threadIdx.x;  // coalesced
      v[k] = idx < end ? row[idx] : NAN;
    }
#pragma unroll
    for (int k = 0; k < kArgmaxPerThread; ++k) {
      const int64_t idx = base + k * kArgmaxThreads + threadIdx.x;
      if (idx < end && ranks_before(v[k], static_cast<int32_t>(idx), best_v, best_i)) {
        best_v = v[k];
        best_i = static_cast<int32_t>(idx);
      }
    }
  }
  block_best(best_v, best_i);
  if (threadIdx.x == 0) {
    part_v[t * gridDim.y + blockIdx.y] = best_v;
    part_i[t * gridDim.y + blockIdx.y] = best_i;
  }
}

// part_v, part_i [n, parts]; out [n] i32. One block per row.
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_final_kernel(const float* __restrict__ part_v, const int32_t* __restrict__ part_i,
                        int parts, int32_t* __restrict__ out) {
  grid_dependency_wait();
  const int64_t t = blockIdx.x;
  float best_v = NAN;
  int32_t best_i = INT32_MAX;
  for (int p = threadIdx.x; p < parts; p += kArgmaxThreads) {
    const float v = part_v[t * parts + p];
    const int32_t i = part_i[t * parts + p];
    if (ranks_before(v, i, best_v, best_i)) {
      best_v = v;
      best_i = i;
    }
  }
  block_best(best_v, best_i);
  if (threadIdx.x == 0) out[t] = best_i;
}

}  // namespace

void gemv_batch(const GemvTarget* targets, int count, const float* x, int64_t n, Stream s,
                const WindowShift& shift) {
  if (n <= 0 || count <= 0) return;
  if (shift.window != nullptr &&
      (shift.mixed == nullptr || shift.channels <= 0 || shift.conv_kernel < 2 || shift.conv_kernel > 8)) {
    throw std::invalid_argument(
        "cuda::gemv_batch: a window shift needs its token's inputs, channels > 0 and a conv "
        "kernel of 2..8");
  }
  if (count > kMaxGemvTargets) {
    throw std::invalid_argument("cuda::gemv_batch: more than " + std::to_string(kMaxGemvTargets) +
                                " targets");
  }
  for (int i = 0; i < count; ++i) {
    if (targets[i].rows <= 0 || targets[i].w.bits != targets[0].w.bits ||
        targets[i].w.in != targets[0].w.in) {
      throw std::invalid_argument(
          "cuda::gemv_batch: targets need rows > 0 and one bit width and input width");
    }
  }
  if (targets[0].w.bits == 4) {
    gemv_bits<4>(targets, count, x, n, s, shift);
  } else if (targets[0].w.bits == 8) {
    gemv_bits<8>(targets, count, x, n, s, shift);
  } else {
    throw std::invalid_argument("cuda::gemv: bits must be 4 or 8");
  }
}

void gemv(const QuantMatrix& w, int64_t row_begin, int64_t rows, const float* x, int64_t n,
          float* y, Stream s) {
  if (rows <= 0 || n <= 0) return;
  const GemvTarget target{w, row_begin, rows, y};
  gemv_batch(&target, 1, x, n, s);
}

void embed(const QuantMatrix& table, const int32_t* ids, int64_t n, float* out, Stream s) {
  if (n <= 0) return;
  if (table.bits != 4 && table.bits != 8) {
    throw std::invalid_argument("cuda::embed: bits must be 4 or 8");
  }
  launch(embed_kernel, static_cast<unsigned>(n), kEmbedThreads, 0, s, table, ids, out);
}

void argmax(const float* logits, int64_t n, int64_t vocab, int32_t* out, Workspace& ws,
            Stream s) {
  if (n <= 0 || vocab <= 0) return;
  if (vocab > INT32_MAX) throw std::invalid_argument("cuda::argmax: vocab exceeds i32 indices");
  // About one pass of kArgmaxSpan values per block (248,320 logits -> 122 blocks a row); very
  // large rows take several passes per block rather than more blocks.
  int64_t blocks = (vocab + kArgmaxSpan - 1) / kArgmaxSpan;
  if (blocks > kArgmaxMaxBlocks) blocks = kArgmaxMaxBlocks;
  int64_t span = (vocab + blocks - 1) / blocks;
  blocks = (vocab + span - 1) / span;  // every block gets at least one value
  const size_t count = static_cast<size_t>(n * blocks);
  auto* part_v = static_cast<float*>(ws.get(kWsArgmax, count * (sizeof(float) + sizeof(int32_t))));
  auto* part_i = reinterpret_cast<int32_t*>(part_v + count);
  launch(argmax_partial_kernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(blocks)),
         kArgmaxThreads, 0, s, logits, vocab, span, part_v, part_i);
  launch(argmax_final_kernel, static_cast<unsigned>(n), kArgmaxThreads, 0, s, part_v, part_i,
         static_cast<int>(blocks), out);
}

}  // namespace lily::cuda

// The MoE block of one decode token as one persistent kernel: add + RMSNorm, router GEMV,
// routing, routed and shared SwiGLU, down + combine, with two grid barriers between them.
//
// Why: the op path spends four launches on this block (add_rms_norm, the router | shared-gate
// GEMV, route_expert_swiglu, expert_down_combine), each a few microseconds of ramp-up and tail
// around 0.5-10 MB of weights. Here every block stays resident: it pulls its next phases'
// weights into L2 before the inputs are ready, and a phase waits for the previous one through
// a counter in global memory (about a microsecond) instead of a kernel boundary.
//
// Exactness: every value is computed by the same lanes in the same order as the op path's
// kernels (norms.cu norm_vec_kernel / norm_warp_kernel, quant_gemv.cu gemv_kernel, moe_gemv.cu
// swiglu_kernel and down_combine_kernel, moe_route.cuh route_row), so the outputs are
// bit-identical to it (tests/cuda/moe_layer_test.cpp checks that). The norm copies the op
// path's choice of kernel by the hidden width: one warp up to 256 values, the register-resident
// block form up to 4096.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/grid_barrier.cuh"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/quant_dot.cuh"
#include "backend/cuda/residual_norm.cuh"

namespace lily::cuda {

using gemv_detail::Chunk;

namespace {

constexpr int kThreads = kPersistentThreads;  // residual_norm.cuh
constexpr int kWarps = kPersistentWarps;
constexpr int kSwigluRows = 4;  // rows per SwiGLU unit, as moe_gemv.cu (any count gives the same values)
// The shared expert's units (phase 1) take one row each: its 512 rows then spread over 512
// pairs of warps instead of 128, so the first barrier does not wait on a few long units.
constexpr int kSharedSwigluRows = 1;
constexpr int kDownRows = 1;    // rows per down unit (moe_gemv.cu takes 2; a row's values do not depend on it)
// Items per lane per trip: the model's row is 144 items (8 experts x 16 chunks + the shared
// expert's 16), so 5 cover it in one trip; 8 (moe_gemv.cu's) left three item blocks that every
// lane jumps over and one that half the lanes run, each a fetch of new code (Nsight: half the
// down phase's stall samples were instruction fetch, ncu-stalls). A lane sums its items in the
// same order for any trip length, so the values do not depend on it. Measured against 8 (H200,
// MoE lab): 25.33 against 25.90 us a layer, decode +1.4% at 256 (docs/perf/bench-cuda.md).
constexpr int kDownUnroll = 5;

__device__ __forceinline__ void stamp(const MoeLayerParams& p, int phase) {
  if (p.timeline == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  p.timeline[blockIdx.x * kMoeLayerStamps + phase] = t;
}

// The staged copies of the normalised input: one swizzled for the router's code width, one
// for the experts' (gemv_detail::SharedActs), each H floats.
template <int RB, int EB>
__device__ __forceinline__ void store_normed(float4* for_router, float4* for_experts, int64_t f,
                                             float4 v) {
  constexpr int FR = Chunk<RB>::kValues / 4;
  constexpr int FE = Chunk<EB>::kValues / 4;
  for_router[gemv_detail::swizzled_float4<RB>(f / FR, static_cast<int>(f % FR))] = v;
  for_experts[gemv_detail::swizzled_float4<EB>(f / FE, static_cast<int>(f % FE))] = v;
}

// The norm's gain as thread t holds it for H > 256 (float4s t, t + 256, ...), read before the
// dependency wait (a weight: its device-memory round trip is then off the norm's path).
constexpr int kNormGainQuads = 4;  // H <= 4096

__device__ __forceinline__ void load_norm_gain(const MoeLayerParams& p,
                                               float4 (&gain)[kNormGainQuads]) {
  const int64_t quads = p.hidden > 256 ? p.hidden / 4 : 0;
#pragma unroll
  for (int i = 0; i < kNormGainQuads; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * kThreads;
    gain[i] = q < quads ? reinterpret_cast<const float4*>(p.norm_gain)[q]
                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// residual + delta into `sums` and its RMSNorm, staged twice; block 0 also writes normed (the
// residual is written after the first barrier: other blocks read it until then). Same
// arithmetic as norm_warp_kernel<add> (H <= 256) or norm_vec_kernel<add, V> (H > 256), and as
// residual_norm.cuh's residual_norm, written out here on purpose: built on residual_norm (a
// store callback, V chosen inside), this kernel compiled to other spills in its hot loops and
// decode measured 0.8% slower (docs/perf/bench-cuda.md).
template <int RB, int EB, int V>
__device__ void stage_norm(const MoeLayerParams& p, const float4 (&gain)[kNormGainQuads],
                           float4* for_router, float4* for_experts, float* sums, float* partial) {
  const int64_t H = p.hidden;
  if (H <= 256) {
    // norm_warp_kernel: lane l holds values l + 32c; warp 0 does it, the others wait.
    if (threadIdx.x < 32) {
      const int lane = static_cast<int>(threadIdx.x);
      float v[8];
      float sum_sq = 0.0f;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int64_t i = lane + 32 * c;
        v[c] = 0.0f;
        if (i < H) {
          v[c] = p.residual[i] + p.delta[i];
          sum_sq = fmaf(v[c], v[c], sum_sq);
        }
      }
      const float inv = rms_scale(warp_sum(sum_sq), H, p.eps);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int64_t i = lane + 32 * c;
        if (i < H) sums[i] = v[c];
        if (i < H) v[c] = v[c] * inv * p.norm_gain[i];
        if (i < H && blockIdx.x == 0) p.normed[i] = v[c];
      }
      __syncwarp();
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int64_t i = lane + 32 * c;
        if (i < H) sums[H + i] = v[c];  // the normed row, after the sums
      }
    }
    __syncthreads();
    for (int64_t q = threadIdx.x; q < H / 4; q += kThreads) {
      const float* o = sums + H + 4 * q;
      store_normed<RB, EB>(for_router, for_experts, q, make_float4(o[0], o[1], o[2], o[3]));
    }
    return;
  }
  // norm_vec_kernel: thread t holds float4s t, t + 256, ...
  const int64_t quads = H / 4;
  const auto* r = reinterpret_cast<const float4*>(p.residual);
  const auto* d = reinterpret_cast<const float4*>(p.delta);
  float4 sum[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * kThreads;
    sum[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (q < quads) {
      const float4 a = r[q];
      const float4 b = d[q];
      sum[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
      reinterpret_cast<float4*>(sums)[q] = sum[i];
    }
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    sum_sq = fmaf(sum[i].x, sum[i].x, sum_sq);
    sum_sq = fmaf(sum[i].y, sum[i].y, sum_sq);
    sum_sq = fmaf(sum[i].z, sum[i].z, sum_sq);
    sum_sq = fmaf(sum[i].w, sum[i].w, sum_sq);
  }
  const float inv = rms_scale(norm_block_sum(sum_sq, partial), H, p.eps);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * kThreads;
    if (q >= quads) continue;
    const float4 gq = gain[i];
    const float4 o = make_float4(sum[i].x * inv * gq.x, sum[i].y * inv * gq.y,
                                 sum[i].z * inv * gq.z, sum[i].w * inv * gq.w);
    store_normed<RB, EB>(for_router, for_experts, q, o);
    if (blockIdx.x == 0) reinterpret_cast<float4*>(p.normed)[q] = o;
  }
}

// Rows [0, E) of the router and row E (the shared expert's gate) for one token, a lane segment
// per row, as gemv_kernel: lane li of a segment takes chunks li, li + lanes, ...
template <int RB>
__device__ void router_phase(const MoeLayerParams& p, const float4* staged, int64_t warp,
                             int64_t warps) {
  const int64_t H = p.hidden;
  const int chunks = static_cast<int>(H / Chunk<RB>::kValues);
  const int lanes = gemv_detail::lanes_for_chunks(chunks);
  const int segments = 32 / lanes;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int li = lane & (lanes - 1);
  const int64_t rows = p.experts + 1;
  const int64_t words = H * RB / 32;
  const int64_t groups = H / kGroupSize;
  const gemv_detail::SharedActs acts{staged};
  for (int64_t base = warp * segments; base < rows; base += warps * segments) {
    const int64_t unit = base + lane / lanes;
    const bool live = unit < rows;
    const int64_t row = live ? unit : rows - 1;
    const bool gate_row = row == p.experts;
    const QuantMatrix& w = gate_row ? p.shared_expert_gate : p.router;
    const int64_t r = gate_row ? 0 : row;
    const uint32_t* codes[1] = {w.codes + r * words};
    const __nv_bfloat16* scales[1] = {w.scales + r * groups};
    const __nv_bfloat16* biases[1] = {w.biases + r * groups};
    float acc[1][1] = {};
    const int64_t row_chunk[1] = {0};
    gemv_detail::rows_dot<RB, 1, 1, 8>(codes, scales, biases, acts, row_chunk, chunks, li, lanes, acc);
    const float v = gemv_detail::segment_sum(acc[0][0], lanes);
    if (live && li == 0) {
      if (gate_row) {
        *p.shared_logit = v;
      } else {
        p.router_logits[row] = v;
      }
    }
  }
}

// One SwiGLU unit of a set (routed: slot j = 0..k-1 with expert ids[j]; shared: expert 0):
// kSwigluRows gate rows and the same up rows, as swiglu_kernel<EB, EB, true> computes them.
struct SwigluSetRef {
  const QuantMatrix* gate;
  const QuantMatrix* up;
  int64_t rows;   // I (routed) or S (shared)
  float* h;       // [slots, rows] f32 out
};

// Lane li's partial dots of unit (slot, i0) over the chunks first, first + stride, ... : with
// first = li and stride = lanes, the whole row as the op path's lane sums it.
template <int EB, int R>
__device__ __forceinline__ void swiglu_unit_dot(const SwigluSetRef& set, int64_t e, int64_t i0,
                                                const float4* staged, int64_t H, int first,
                                                int stride, float (&acc)[2 * R][1]) {
  const int chunks = static_cast<int>(H / Chunk<EB>::kValues);
  const int64_t words = H * EB / 32;
  const int64_t groups = H / kGroupSize;
  const uint32_t* codes[2 * R];
  const __nv_bfloat16* scales[2 * R];
  const __nv_bfloat16* biases[2 * R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t row = e * set.rows + (i0 + i < set.rows ? i0 + i : set.rows - 1);
    codes[i] = set.gate->codes + row * words;
    scales[i] = set.gate->scales + row * groups;
    biases[i] = set.gate->biases + row * groups;
    codes[R + i] = set.up->codes + row * words;
    scales[R + i] = set.up->scales + row * groups;
    biases[R + i] = set.up->biases + row * groups;
  }
#pragma unroll
  for (int i = 0; i < 2 * R; ++i) acc[i][0] = 0.0f;
  const int64_t row_chunk[1] = {0};
  gemv_detail::rows_dot<EB, 2 * R, 1, 1>(codes, scales, biases, gemv_detail::SharedActs{staged},
                                          row_chunk, chunks, first, stride, acc);
}

// Segment sums, SiLU(gate) * up, stored by the segment's first lane.
template <int R>
__device__ __forceinline__ void swiglu_store(const SwigluSetRef& set, int64_t slot, int64_t i0,
                                             bool live, int li, int lanes,
                                             const float (&acc)[2 * R][1]) {
  float* h = set.h + slot * set.rows;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float gv = gemv_detail::segment_sum(acc[i][0], lanes);
    const float uv = gemv_detail::segment_sum(acc[R + i][0], lanes);
    if (live && li == 0 && i0 + i < set.rows) h[i0 + i] = siluf_(gv) * uv;
  }
}

// Units [0, units) of a set, a segment of `lanes` lanes per unit, over the virtual warps
// (any shape; the model's rows of 2 x 32 chunks take two trips per lane this way).
template <int EB, int R>
__device__ void swiglu_units_by_warp(const MoeLayerParams& p, const SwigluSetRef& set,
                                     const int32_t* ids, int64_t slots, const float4* staged,
                                     int64_t warp, int64_t warps) {
  const int64_t H = p.hidden;
  const int lanes = gemv_detail::lanes_for_chunks(H / Chunk<EB>::kValues);
  const int segments = 32 / lanes;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int li = lane & (lanes - 1);
  const int64_t tiles = (set.rows + R - 1) / R;
  const int64_t units = slots * tiles;
  for (int64_t base = warp * segments; base < units; base += warps * segments) {
    int64_t unit = base + lane / lanes;
    const bool live = unit < units;
    if (!live) unit = units - 1;
    const int64_t slot = unit / tiles;
    const int64_t i0 = (unit % tiles) * R;
    float acc[2 * R][1];
    swiglu_unit_dot<EB, R>(set, ids == nullptr ? 0 : ids[slot], i0, staged, H, li, lanes, acc);
    swiglu_store<R>(set, slot, i0, live, li, lanes, acc);
  }
}

// Rows of exactly 64 chunks (2 per lane of a warp, the model's 2048-wide input): a pair of
// warps of one block takes a unit, the first warp chunk li, the second chunk li + 32, one
// trip to memory each instead of two in a row. The second's partial sums reach the first
// through shared memory and are added as the op path's lane adds its second chunk:
// (0 + c_li) + c_li+32, so the values are the same bit for bit. Pair q of the block (warps
// 2q, 2q + 1) is virtual pair q * grid + block; pairs in [pair_begin, pair_end) of the block
// work. `buffer`: [4][2 * kSwigluRows * 32] f32 in shared memory.
template <int EB>
__device__ __forceinline__ bool paired_rows(int64_t H) {
  return H / Chunk<EB>::kValues == 64;
}

__device__ __forceinline__ void pair_sync(int q) {
  asm volatile("bar.sync %0, 64;" : : "r"(1 + q) : "memory");
}

template <int EB, int R>
__device__ void swiglu_units_by_pair(const MoeLayerParams& p, const SwigluSetRef& set,
                                     const int32_t* ids, int64_t slots, const float4* staged,
                                     int pair_begin, int pair_end, float* buffer) {
  const int q = static_cast<int>(threadIdx.x / 64);
  if (q < pair_begin || q >= pair_end) return;
  const int half = static_cast<int>(threadIdx.x / 32) & 1;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t tiles = (set.rows + R - 1) / R;
  const int64_t units = slots * tiles;
  const int64_t pairs = static_cast<int64_t>(gridDim.x) * (pair_end - pair_begin);
  float* mine = buffer + q * (2 * kSwigluRows * 32);
  for (int64_t unit = static_cast<int64_t>(q - pair_begin) * gridDim.x + blockIdx.x; unit < units;
       unit += pairs) {
    const int64_t slot = unit / tiles;
    const int64_t i0 = (unit % tiles) * R;
    float acc[2 * R][1];
    swiglu_unit_dot<EB, R>(set, ids == nullptr ? 0 : ids[slot], i0, staged, p.hidden,
                           lane + 32 * half, 64, acc);
    if (half == 1) {
#pragma unroll
      for (int i = 0; i < 2 * R; ++i) mine[i * 32 + lane] = acc[i][0];
    }
    pair_sync(q);
    if (half == 0) {
#pragma unroll
      for (int i = 0; i < 2 * R; ++i) acc[i][0] += mine[i * 32 + lane];
      swiglu_store<R>(set, slot, i0, true, lane, 32, acc);
    }
    pair_sync(q);  // the buffer is free for the pair's next unit
  }
}

// Pulls this warp's down rows of the chosen experts and of the shared expert into L2 (the
// down phase's rows r0 = 2 * (warp + j * warps)); the ids are known from the routing.
template <int EB>
__device__ void prefetch_down(const MoeLayerParams& p, const int32_t* ids, int64_t warp,
                              int64_t warps) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t H = p.hidden;
  const int64_t row_bytes = p.down.in * EB / 8;
  const int64_t shared_row_bytes = p.shared_down.in * EB / 8;
  constexpr int64_t kSector = 32;
  for (int64_t r0 = warp * kDownRows; r0 < H; r0 += warps * kDownRows) {
    for (int64_t slot = 0; slot <= p.k; ++slot) {
      const bool shared = slot == p.k;
      const int64_t bytes = shared ? shared_row_bytes : row_bytes;
      const char* base = reinterpret_cast<const char*>(shared ? p.shared_down.codes : p.down.codes) +
                         ((shared ? 0 : ids[slot] * H) + r0) * bytes;
      for (int64_t s = lane; s < kDownRows * bytes / kSector; s += 32) prefetch_l2(base + s * kSector);
    }
  }
}

// One trip of a down-phase lane: kDownUnroll items (slot, chunk) of kDownRows rows, the
// routed items first, then the shared expert's chunks; items past the end load as zero. Only
// the loaded words are kept (each scale and bias as its raw BF16 pair), so that a trip loaded
// before the second barrier holds 40 registers through it; the item's chunk and weight are
// recomputed when it is used.
struct DownTrip {
  uint4 q[kDownUnroll][kDownRows];
  uint32_t scale_bias[kDownUnroll][kDownRows];  // BF16 scale | BF16 bias << 16
};

// Where item `item` of the down phase lies: its flat chunk in the staged h | shared_h, the
// chunk within its row, and whether it is routed (slot j) or the shared expert's.
struct DownItem {
  int64_t chunk;  // in the staged copy (shared_h's chunks follow h's)
  int64_t c;      // within the expert's row
  int64_t slot;   // j < k, or k for the shared expert
};
// (32-bit division: a 64-bit one is a long call, and the phase divides twice per item.)
__device__ __forceinline__ DownItem down_item(int64_t item, int64_t cd, int64_t k, int64_t routed) {
  if (item < routed) {
    const int64_t j = static_cast<uint32_t>(item) / static_cast<uint32_t>(cd);
    return {item, item - j * cd, j};
  }
  return {item, item - routed, k};
}

__device__ __forceinline__ uint32_t load_scale_bias(const __nv_bfloat16* scales,
                                                    const __nv_bfloat16* biases, int64_t at) {
  const auto s = static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(scales) + at));
  const auto b = static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(biases) + at));
  return s | (b << 16);
}

// Loads the trip of rows r0.. and items base, base + 32, ... (lanes stride over the items).
template <int EB>
__device__ __forceinline__ void load_down_trip(const MoeLayerParams& p, const int32_t* ids,
                                               int64_t r0, int64_t base, DownTrip& t) {
  constexpr int R = kDownRows;
  using C = Chunk<EB>;
  const int64_t H = p.hidden;
  const int64_t cd = p.down.in / C::kValues;
  const int64_t routed = p.k * cd;
  const int64_t items = routed + p.shared_down.in / C::kValues;
  const int64_t words_d = p.down.in * EB / 32;
  const int64_t words_s = p.shared_down.in * EB / 32;
  const int64_t groups_d = p.down.in / kGroupSize;
  const int64_t groups_s = p.shared_down.in / kGroupSize;
  int64_t r[R];
#pragma unroll
  for (int i = 0; i < R; ++i) r[i] = r0 + i < H ? r0 + i : H - 1;
#pragma unroll
  for (int u = 0; u < kDownUnroll; ++u) {
    const int64_t item = base + u * 32;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      t.q[u][i] = make_uint4(0, 0, 0, 0);
      t.scale_bias[u][i] = 0;
    }
    if (item >= items) continue;
    const DownItem it = down_item(item, cd, p.k, routed);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (it.slot < p.k) {
        const int64_t row = ids[it.slot] * H + r[i];
        t.q[u][i] = gemv_detail::load_stream(p.down.codes + row * words_d + 4 * it.c);
        t.scale_bias[u][i] = load_scale_bias(p.down.scales, p.down.biases,
                                             row * groups_d + it.c / C::kPerGroup);
      } else {
        t.q[u][i] = gemv_detail::load_stream(p.shared_down.codes + r[i] * words_s + 4 * it.c);
        t.scale_bias[u][i] = load_scale_bias(p.shared_down.scales, p.shared_down.biases,
                                             r[i] * groups_s + it.c / C::kPerGroup);
      }
    }
  }
}

// acc += the trip's items . the staged h | shared_h, each scaled by its routing weight (or
// the shared expert's gate).
template <int EB>
__device__ __forceinline__ void dot_down_trip(const MoeLayerParams& p, const DownTrip& t,
                                              const gemv_detail::SharedActs& acts,
                                              const float* weights, float gate, int64_t base,
                                              float (&acc)[kDownRows]) {
  constexpr int R = kDownRows;
  using C = Chunk<EB>;
  const int64_t cd = p.down.in / C::kValues;
  const int64_t routed = p.k * cd;
  const int64_t items = routed + p.shared_down.in / C::kValues;
#pragma unroll
  for (int u = 0; u < kDownUnroll; ++u) {
    const int64_t item = base + u * 32;
    if (item >= items) continue;
    const DownItem it = down_item(item, cd, p.k, routed);
    const float weight = it.slot < p.k ? weights[it.slot] : gate;
    float sc[R];
    float bi[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      sc[i] = __uint_as_float(t.scale_bias[u][i] << 16);          // BF16 -> f32 is exact
      bi[i] = __uint_as_float(t.scale_bias[u][i] & 0xFFFF0000u);
    }
    float dot[R][1] = {};
    const int64_t at[1] = {it.chunk};
    gemv_detail::chunk_dot<EB, R, 1>(t.q[u], sc, bi, acts, at, dot);
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = fmaf(weight, dot[i][0], acc[i]);
  }
}

// The down phase's gate of the shared expert, sigmoid(shared_logit) (published by barrier 1).
__device__ __forceinline__ float shared_down_gate(const MoeLayerParams& p) {
  return sigmoidf_(load_shared_result(p.shared_logit));
}

// One down row group r0..r0 + kDownRows - 1: acc over the routed items (slot, chunk), then the
// shared chunks, lanes striding over them, one trip of kDownUnroll items per lane at a time;
// `first`, when given, is the row group's first trip, already loaded.
template <int EB>
__device__ __forceinline__ void down_rows(const MoeLayerParams& p, const gemv_detail::SharedActs& acts,
                                          const int32_t* ids, const float* weights, float gate,
                                          int64_t r0, int64_t items, int lane, const DownTrip* first) {
  constexpr int R = kDownRows;
  constexpr int U = kDownUnroll;
  float acc[R] = {};
  int64_t base = lane;
  if (first != nullptr) {
    dot_down_trip<EB>(p, *first, acts, weights, gate, base, acc);
    base += 32 * U;
  }
  for (; base < items; base += 32 * U) {
    DownTrip t;
    load_down_trip<EB>(p, ids, r0, base, t);
    dot_down_trip<EB>(p, t, acts, weights, gate, base, acc);
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float v = warp_sum(acc[i]);
    if (lane == 0 && r0 + i < p.hidden) p.out[r0 + i] = v;
  }
}

// out[r] = sum_j weight_j * down_{ids[j]}[r] . h[j] + sigmoid(shared_logit) * shared_down[r] .
// shared_h, as down_combine_kernel<EB, EB, true>: one warp per kDownRows rows, lanes striding
// over the routed items (slot, chunk) and then the shared chunks. `first` holds the warp's
// first trip (rows warp * kDownRows.., items lane, lane + 32, ...), loaded by the caller before
// the second barrier: the weights depend only on the routing, so only the arithmetic waits
// for h. The warp's first row group is peeled off the loop so that `first` is dead before any
// other trip is loaded (in one loop both trips were live at once, and the kernel spilled at
// its 128 registers).
template <int EB>
__device__ void down_phase(const MoeLayerParams& p, const float4* staged, const int32_t* ids,
                           const float* weights, float gate, int64_t warp, int64_t warps,
                           const DownTrip& first) {
  constexpr int R = kDownRows;
  using C = Chunk<EB>;
  const int64_t H = p.hidden;
  const int64_t items = p.k * (p.down.in / C::kValues) + p.shared_down.in / C::kValues;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const gemv_detail::SharedActs acts{staged};
  if (warp * R < H) down_rows<EB>(p, acts, ids, weights, gate, warp * R, items, lane, &first);
  for (int64_t r0 = (warp + warps) * R; r0 < H; r0 += warps * R) {
    down_rows<EB>(p, acts, ids, weights, gate, r0, items, lane, nullptr);
  }
}

// Stages count floats written by other blocks (h, shared_h) into the block's swizzled copy,
// from flat chunk first_chunk on (gemv_detail::stage_acts, but read through L2).
template <int Bits>
__device__ void stage_results(const float* src, int64_t count, int64_t first_chunk, float4* dst) {
  constexpr int F = Chunk<Bits>::kValues / 4;
  for (int64_t f = threadIdx.x; f < count / 4; f += blockDim.x) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(src) + f);
    dst[gemv_detail::swizzled_float4<Bits>(first_chunk + f / F, static_cast<int>(f % F))] = v;
  }
}

template <int RB, int EB>
__global__ void __launch_bounds__(kThreads, 2) moe_layer_kernel(MoeLayerParams p) {
  extern __shared__ float4 smem[];
  __shared__ float partial[kWarps];
  __shared__ float logits[kMaxFusedRouteExperts];
  __shared__ int32_t ids[kMaxFusedRouteK];
  __shared__ float weights[kMaxFusedRouteK];
  __shared__ float pair_buffer[kWarps / 2][2 * kSwigluRows * 32];
  const int64_t H = p.hidden;
  const bool paired = paired_rows<EB>(H);
  const SwigluSetRef routed_set{&p.gate, &p.up, p.gate.out, p.h};
  const SwigluSetRef shared_set{&p.shared_gate, &p.shared_up, p.shared_gate.out, p.shared_h};
  // Work units go round-robin over the blocks first (warp j of block b is virtual warp
  // j * grid + b), so that a phase with fewer units than warps (the router's 257 rows) still
  // spreads over every SM instead of filling the first blocks.
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t warp = static_cast<int64_t>(threadIdx.x / 32) * gridDim.x + blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x) & 31;

  // Before the wait: weights only. This warp's router row and shared-expert gate/up rows into
  // L2 (the routed rows are known only after the routing).
  {
    const int64_t rows = p.experts + 1;
    const int64_t router_bytes = H * RB / 8;
    for (int64_t row = warp; row < rows; row += warps) {
      const char* base = row == p.experts
                             ? reinterpret_cast<const char*>(p.shared_expert_gate.codes)
                             : reinterpret_cast<const char*>(p.router.codes) + row * router_bytes;
      for (int64_t s = lane; s < router_bytes / 32; s += 32) prefetch_l2(base + s * 32);
    }
    const int64_t expert_bytes = H * EB / 8;
    for (int64_t row = warp; row < 2 * p.shared_gate.out; row += warps) {
      const bool up = row >= p.shared_gate.out;
      const char* base = reinterpret_cast<const char*>(up ? p.shared_up.codes : p.shared_gate.codes) +
                         (up ? row - p.shared_gate.out : row) * expert_bytes;
      for (int64_t s = lane; s < expert_bytes / 32; s += 32) prefetch_l2(base + s * 32);
    }
  }
  float4 gain[kNormGainQuads];
  load_norm_gain(p, gain);
  grid_dependency_wait();
  stamp(p, 0);

  // Phase 1: the norm (every block its own copy), the router and shared-gate logits.
  // Shared memory: [H] normed for the router, [H] normed for the experts, [2H] sums (and, for
  // H <= 256, the normed row); phase 3 reuses it from 0 for h and shared_h.
  float4* for_router = smem;
  float4* for_experts = smem + H / 4;
  float* sums = reinterpret_cast<float*>(smem + H / 2);
  if (H <= 2048) {
    stage_norm<RB, EB, 2>(p, gain, for_router, for_experts, sums, partial);
  } else {
    stage_norm<RB, EB, 4>(p, gain, for_router, for_experts, sums, partial);
  }
  __syncthreads();
  stamp(p, 1);
  router_phase<RB>(p, for_router, warp, warps);
  // The shared expert's SwiGLU needs no routing: it runs here, on the warps the router's
  // rows leave idle (pairs 1-3 of each block, or the last virtual warps), and its h is
  // published by the first barrier. Phase 2 then has only the routed units, one trip each.
  if (paired) {
    swiglu_units_by_pair<EB, kSharedSwigluRows>(p, shared_set, nullptr, 1, for_experts, 1,
                                                kWarps / 2, &pair_buffer[0][0]);
  } else {
    swiglu_units_by_warp<EB, kSharedSwigluRows>(p, shared_set, nullptr, 1, for_experts,
                                                warps - 1 - warp, warps);
  }
  stamp(p, 2);
  grid_barrier(p.barrier);
  stamp(p, 3);

  // Block 0 now owns the residual: every block has read it.
  if (blockIdx.x == 0) {
    for (int64_t q = threadIdx.x; q < H / 4; q += kThreads) {
      reinterpret_cast<float4*>(p.residual)[q] = reinterpret_cast<const float4*>(sums)[q];
    }
  }

  // Phase 2: every block routes for itself (warp 0), block 0 stores the routing; then the
  // routed SwiGLU rows. The chosen experts' down rows go to L2 for phase 3. (Running the
  // shared expert's units in warps 1.. while warp 0 routes measured slower: 29.3 against
  // 27.0 us; they now run in phase 1.)
  for (int64_t e = threadIdx.x; e < p.experts; e += kThreads) logits[e] = load_shared_result(p.router_logits + e);
  // The shared expert's down gate, published by barrier 1 too: loaded here, off the path from
  // the last SwiGLU to the second barrier's arrival.
  const float down_gate = shared_down_gate(p);
  __syncthreads();
  if (threadIdx.x < 32) {
    int32_t id = 0;
    float weight = 0.0f;
    route_row<kFusedRouteLanes>(logits, static_cast<int>(p.experts), static_cast<int>(p.k), lane,
                                &id, &weight);
    if (lane < p.k) {
      ids[lane] = id < 0 ? 0 : (id >= p.experts ? static_cast<int32_t>(p.experts - 1) : id);
      weights[lane] = weight;
      if (blockIdx.x == 0) {
        p.ids[lane] = id;
        p.weights[lane] = weight;
      }
    }
  }
  __syncthreads();
  stamp(p, 4);
  prefetch_down<EB>(p, ids, warp, warps);
  if (paired) {
    swiglu_units_by_pair<EB, kSwigluRows>(p, routed_set, ids, p.k, for_experts, 0, kWarps / 2,
                                          &pair_buffer[0][0]);
  } else {
    swiglu_units_by_warp<EB, kSwigluRows>(p, routed_set, ids, p.k, for_experts, warp, warps);
  }
  stamp(p, 5);
  // The second barrier in two halves: between this block's arrival and its wait, each warp
  // loads its first down trip (the routing chose the experts; the weights depend on no other
  // block), so the loads overlap the wait and only the arithmetic waits for h. (Loaded before
  // a whole grid_barrier, they delayed the arrival: thread 0's fence waits for its own loads.)
  DownTrip first_down;
  const unsigned long long target = grid_arrive(p.barrier);
  if (warp * kDownRows < H) load_down_trip<EB>(p, ids, warp * kDownRows, lane, first_down);
  grid_wait(p.barrier, target);
  stamp(p, 6);

  // Phase 3: down + combine over h and shared_h, staged like down_combine_kernel's.
  const int64_t I = p.down.in;
  stage_results<EB>(p.h, p.k * I, 0, smem);
  stage_results<EB>(p.shared_h, p.shared_down.in, p.k * (I / Chunk<EB>::kValues), smem);
  __syncthreads();
  stamp(p, 7);
  down_phase<EB>(p, smem, ids, weights, down_gate, warp, warps, first_down);
  allow_dependent_launch();
  __syncthreads();
  stamp(p, 8);  // every block is past the barriers: the next kernel cannot starve one
}

}  // namespace

size_t moe_layer_shared_bytes(const MoeLayerParams& p) {
  const size_t normed = 4 * static_cast<size_t>(p.hidden) * sizeof(float);
  const size_t down = static_cast<size_t>(p.k * p.down.in + p.shared_down.in) * sizeof(float);
  return normed > down ? normed : down;
}

namespace {
template <int RB, int EB>
void* kernel_for() {
  return reinterpret_cast<void*>(moe_layer_kernel<RB, EB>);
}
void* moe_layer_kernel_for(int router_bits, int expert_bits) {
  if (router_bits == 8 && expert_bits == 4) return kernel_for<8, 4>();
  if (router_bits == 4 && expert_bits == 4) return kernel_for<4, 4>();
  return nullptr;
}
}  // namespace

std::string moe_layer_unsupported(const MoeLayerParams& p) {
  const auto same = [](const QuantMatrix& a, const QuantMatrix& b) { return a.bits == b.bits; };
  if (moe_layer_kernel_for(p.router.bits, p.gate.bits) == nullptr) {
    return "router " + std::to_string(p.router.bits) + "-bit with " + std::to_string(p.gate.bits) +
           "-bit experts (built: 8/4 and 4/4)";
  }
  if (p.shared_expert_gate.bits != p.router.bits) return "the shared-expert gate's width differs from the router's";
  if (!same(p.gate, p.up) || !same(p.gate, p.down) || !same(p.gate, p.shared_gate) ||
      !same(p.gate, p.shared_up) || !same(p.gate, p.shared_down)) {
    return "the expert matrices have different code widths";
  }
  if (p.hidden % 64 != 0 || p.hidden > 4096) return "hidden width " + std::to_string(p.hidden) + " (needs a multiple of 64, <= 4096)";
  if (p.hidden > 256 && p.hidden % 4 != 0) return "hidden width not a multiple of 4";
  if (p.experts > kMaxFusedRouteExperts || p.k > kMaxFusedRouteK || p.k > p.experts || p.k > 32) {
    return "routing of k " + std::to_string(p.k) + " of " + std::to_string(p.experts) + " experts";
  }
  if (p.gate.in != p.hidden || p.shared_gate.in != p.hidden || p.router.in != p.hidden ||
      p.down.out != p.hidden || p.shared_down.out != p.hidden || p.down.in != p.gate.out ||
      p.shared_down.in != p.shared_gate.out) {
    return "expert shapes do not chain (gate/up in = hidden, down in = gate out)";
  }
  if (moe_layer_shared_bytes(p) > kMaxStagedBytes) return "staged activations exceed 40 KB (4 x hidden floats, or k x moe_intermediate + shared floats)";
  return "";
}

int moe_layer_grid(const MoeLayerParams& p) {
  void* kernel = moe_layer_kernel_for(p.router.bits, p.gate.bits);
  if (kernel == nullptr) return 0;
  int per_sm = 0;
  LILY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads,
                                                                moe_layer_shared_bytes(p)));
  return per_sm * sm_count();
}

void moe_layer(const MoeLayerParams& p, int grid, Stream s) {
  const size_t bytes = moe_layer_shared_bytes(p);
  if (p.router.bits == 8) {
    launch(moe_layer_kernel<8, 4>, static_cast<unsigned>(grid), kThreads, bytes, s, p);
  } else {
    launch(moe_layer_kernel<4, 4>, static_cast<unsigned>(grid), kThreads, bytes, s, p);
  }
}

}  // namespace lily::cuda

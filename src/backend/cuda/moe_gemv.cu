// Decode mixture of experts (n <= 8): gathered gate/up GEMV + SwiGLU, and down GEMV + weighted combine + shared expert.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/quant_dot.cuh"

namespace lily::cuda {

using gemv_detail::Chunk;

namespace {

constexpr int kMoeThreads = 128;

// Expert ids are read on the device (written by moe_route; a graph replay sees the current
// step's routing). They are in range by construction; the clamp only keeps a corrupt id from
// reading outside the stacked weights.
__device__ __forceinline__ int64_t expert_at(const int32_t* ids, int64_t slot, int64_t experts) {
  if (ids == nullptr) return 0;
  const int64_t e = ids[slot];  // not __ldg: ids may point at shared memory (fused routing)
  return e < 0 ? 0 : (e >= experts ? experts - 1 : e);
}

// ---- expert_swiglu_gemv -------------------------------------------------------------------
// A segment of `lanes` lanes owns one "unit": kSwigluRows consecutive intermediate rows
// i0.. of one slot (t, j). It computes the gate and the up rows together, so each activation
// it loads serves 2 * kSwigluRows rows. Units of a warp may belong to different slots.
constexpr int kSwigluRows = 4;
// Chunks per lane loaded before any is used: 2 * kSwigluRows loads in flight per lane already.
// Measured on an H200 at 256 (decode tok/s): 2 chunks per trip (one trip for a 2048-wide row)
// takes 168 registers instead of 128 and ran far slower (361 vs 406: under programmatic
// dependent launch the next kernels' waiting blocks share the SMs, and fewer of these fit);
// prefetching the lane's later chunks into L2 right after the routing ran slower too (400 vs 405).
constexpr int kSwigluUnroll = 1;

// Routing fused into the SwiGLU launch (logits == nullptr: the ids are given). Every block
// routes all n tokens itself (n <= kGemvMaxTokens, E <= 32 * kFusedRouteLanes, k <= 16: a
// warp per token, about a microsecond) rather than wait for a routing kernel; block 0 also
// stores ids and weights [n, k] for the down projection.
struct FusedRoute {
  const float* logits = nullptr;  // [n, E] f32
  int experts = 0;
  int32_t* ids = nullptr;    // [n, k] out
  float* weights = nullptr;  // [n, k] out
  QuantMatrix next_down;     // codes == nullptr: nothing to prefetch
};

// Pulls the chosen experts' down-projection rows (codes, scales, biases of ids[0 .. slots))
// into L2, each thread of the launch a strided share, so that the down projection launched
// next finds them there: its weights cannot be fetched before the routing is known, and this
// launch spends most of its time waiting on memory anyway.
__device__ void prefetch_routed_down(const QuantMatrix& down, const int32_t* ids, int64_t slots) {
  constexpr int64_t kSector = 32;  // bytes per prefetch: one L2 sector
  const int64_t code_bytes = down.out * down.in * down.bits / 8;           // per expert
  const int64_t param_bytes = down.out * (down.in / kGroupSize) * 2;       // scales, and biases
  const int64_t code_sectors = (code_bytes + kSector - 1) / kSector;
  const int64_t param_sectors = (param_bytes + kSector - 1) / kSector;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // (Slots outer, no division: at the model's shapes each thread takes about one sector of
  // each slot's codes.)
  for (int64_t slot = 0; slot < slots; ++slot) {
    const int64_t e = expert_at(ids, slot, down.experts);
    const char* codes = reinterpret_cast<const char*>(down.codes) + e * code_bytes;
    const char* scales = reinterpret_cast<const char*>(down.scales) + e * param_bytes;
    const char* biases = reinterpret_cast<const char*>(down.biases) + e * param_bytes;
    for (int64_t i = first; i < code_sectors; i += stride) prefetch_l2(codes + i * kSector);
    for (int64_t i = first; i < param_sectors; i += stride) {
      prefetch_l2(scales + i * kSector);
      prefetch_l2(biases + i * kSector);
    }
  }
}

// One set of gathered SwiGLU rows: slot (t, j) uses expert ids[t * k + j] (ids == nullptr:
// expert 0, k == 1) and writes h [slots, I] f32, I = gate.out.
struct SwigluSet {
  QuantMatrix gate;
  QuantMatrix up;
  const int32_t* ids = nullptr;
  int64_t slots = 0;  // n * k
  int64_t k = 1;
  float* h = nullptr;
};

// The routed experts' units first, then the shared expert's (shared.slots may be 0): one
// launch for both. Both sets have the same code widths and input width (x [n, in] f32).
// A warp's segments may fall in different sets, so the set is chosen field by field (no
// divergent branch around the shuffles).
// kShared (only with BitsG == BitsU): x [n, in] is staged in shared memory (n * in * 4 bytes).
template <int BitsG, int BitsU, bool kShared>
__global__ void __launch_bounds__(kMoeThreads)
    swiglu_kernel(SwigluSet routed, SwigluSet shared, FusedRoute route,
                  const float* __restrict__ x, int64_t n, int lanes, bool x_vec) {
  grid_dependency_wait();
  __shared__ int32_t routed_ids[kGemvMaxTokens * kMaxFusedRouteK];
  // The activations' loads go out first, so that they land while the block routes.
  extern __shared__ float4 staged[];
  if constexpr (kShared) gemv_detail::stage_acts<BitsG>(x, n * routed.gate.in, x_vec, 0, staged);
  if (route.logits != nullptr) {  // the same for every thread of the launch
    const int warp_id = static_cast<int>(threadIdx.x) / 32;
    const int lane_id = static_cast<int>(threadIdx.x) & 31;
    const int k = static_cast<int>(routed.k);
    for (int64_t t = warp_id; t < n; t += kMoeThreads / 32) {
      int32_t id = 0;
      float weight = 0.0f;
      route_row<kFusedRouteLanes>(route.logits + t * route.experts, route.experts, k, lane_id,
                                  &id, &weight);
      if (lane_id < k) {
        routed_ids[t * k + lane_id] = id;
        if (blockIdx.x == 0) {
          route.ids[t * k + lane_id] = id;
          route.weights[t * k + lane_id] = weight;
        }
      }
    }
  }
  __syncthreads();  // staged activations and routed ids
  if (route.logits != nullptr) {
    routed.ids = routed_ids;  // generic addressing reads shared memory through this pointer
    if (route.next_down.codes != nullptr) prefetch_routed_down(route.next_down, routed_ids, routed.slots);
  }
  constexpr int R = kSwigluRows;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int li = lane & (lanes - 1);
  const int segments = 32 / lanes;
  const int64_t routed_tiles = (routed.gate.out + R - 1) / R;  // units per slot
  const int64_t shared_tiles = (shared.gate.out + R - 1) / R;
  const int64_t routed_units = routed.slots * routed_tiles;
  const int64_t units = routed_units + shared.slots * shared_tiles;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (kMoeThreads / 32) + threadIdx.x / 32;
  if (warp * segments >= units) return;  // whole warp: the shuffles need every live lane
  int64_t unit = warp * segments + lane / lanes;
  const bool live = unit < units;
  if (!live) unit = units - 1;  // recompute the last unit in step with the warp; never stored
  const bool is_shared = unit >= routed_units;
  const QuantMatrix gate = is_shared ? shared.gate : routed.gate;
  const QuantMatrix up = is_shared ? shared.up : routed.up;
  const int32_t* ids = is_shared ? shared.ids : routed.ids;
  const int64_t k = is_shared ? shared.k : routed.k;
  float* h = is_shared ? shared.h : routed.h;
  const int64_t tiles = is_shared ? shared_tiles : routed_tiles;
  if (is_shared) unit -= routed_units;
  const int64_t I = gate.out;
  const int64_t slot = unit / tiles;
  const int64_t i0 = (unit % tiles) * R;
  const int64_t e = expert_at(ids, slot, gate.experts);

  const int64_t words_g = gate.in * BitsG / 32;
  const int64_t words_u = up.in * BitsU / 32;
  const int64_t groups = gate.in / kGroupSize;
  const int chunks_g = static_cast<int>(gate.in / Chunk<BitsG>::kValues);
  const int chunks_u = static_cast<int>(up.in / Chunk<BitsU>::kValues);
  float g[R];
  float u[R];
  if constexpr (BitsG == BitsU) {
    // One pass over gate rows 0..R-1 and up rows R..2R-1 with shared activation loads.
    const uint32_t* codes[2 * R];
    const __nv_bfloat16* scales[2 * R];
    const __nv_bfloat16* biases[2 * R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = e * I + (i0 + i < I ? i0 + i : I - 1);
      codes[i] = gate.codes + row * words_g;
      scales[i] = gate.scales + row * groups;
      biases[i] = gate.biases + row * groups;
      codes[R + i] = up.codes + row * words_u;
      scales[R + i] = up.scales + row * groups;
      biases[R + i] = up.biases + row * groups;
    }
    float acc[2 * R][1] = {};
    const int64_t row_chunk[1] = {(slot / k) * chunks_g};
    if constexpr (kShared) {
      gemv_detail::rows_dot<BitsG, 2 * R, 1, kSwigluUnroll>(
          codes, scales, biases, gemv_detail::SharedActs{staged}, row_chunk, chunks_g, li, lanes, acc);
    } else {
      gemv_detail::rows_dot<BitsG, 2 * R, 1, kSwigluUnroll>(
          codes, scales, biases, gemv_detail::GlobalActs{x, x_vec}, row_chunk, chunks_g, li, lanes,
          acc);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      g[i] = acc[i][0];
      u[i] = acc[R + i][0];
    }
  } else {
    // Different code widths: two passes (the second re-reads the activations from L1).
    const uint32_t* gc[R];
    const __nv_bfloat16* gs[R];
    const __nv_bfloat16* gb[R];
    const uint32_t* uc[R];
    const __nv_bfloat16* us[R];
    const __nv_bfloat16* ub[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = e * I + (i0 + i < I ? i0 + i : I - 1);
      gc[i] = gate.codes + row * words_g;
      gs[i] = gate.scales + row * groups;
      gb[i] = gate.biases + row * groups;
      uc[i] = up.codes + row * words_u;
      us[i] = up.scales + row * groups;
      ub[i] = up.biases + row * groups;
    }
    float ga[R][1] = {};
    float ua[R][1] = {};
    const gemv_detail::GlobalActs acts{x, x_vec};
    const int64_t row_chunk_g[1] = {(slot / k) * chunks_g};
    const int64_t row_chunk_u[1] = {(slot / k) * chunks_u};
    gemv_detail::rows_dot<BitsG, R, 1, kSwigluUnroll>(gc, gs, gb, acts, row_chunk_g, chunks_g, li,
                                                      lanes, ga);
    gemv_detail::rows_dot<BitsU, R, 1, kSwigluUnroll>(uc, us, ub, acts, row_chunk_u, chunks_u, li,
                                                      lanes, ua);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      g[i] = ga[i][0];
      u[i] = ua[i][0];
    }
  }
  allow_dependent_launch();
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float gv = gemv_detail::segment_sum(g[i], lanes);
    const float uv = gemv_detail::segment_sum(u[i], lanes);
    if (live && li == 0 && i0 + i < I) h[slot * I + i0 + i] = siluf_(gv) * uv;
  }
}

template <int BitsG, int BitsU>
void launch_swiglu(const SwigluSet& routed, const SwigluSet& shared, const FusedRoute& route,
                   const float* x, Stream s) {
  const int64_t chunks = routed.gate.in / Chunk<BitsG>::kValues > routed.up.in / Chunk<BitsU>::kValues
                             ? routed.gate.in / Chunk<BitsG>::kValues
                             : routed.up.in / Chunk<BitsU>::kValues;
  const int lanes = gemv_detail::lanes_for_chunks(chunks);
  const int64_t units = routed.slots * ((routed.gate.out + kSwigluRows - 1) / kSwigluRows) +
                        shared.slots * ((shared.gate.out + kSwigluRows - 1) / kSwigluRows);
  const int64_t units_per_block = (kMoeThreads / 32) * (32 / lanes);
  const int64_t blocks = (units + units_per_block - 1) / units_per_block;
  const int64_t n = routed.slots / routed.k;
  const size_t act_bytes = static_cast<size_t>(n) * routed.gate.in * sizeof(float);
  if constexpr (BitsG == BitsU) {
    if (act_bytes <= kMaxStagedBytes) {
      return launch(swiglu_kernel<BitsG, BitsU, true>, static_cast<unsigned>(blocks), kMoeThreads,
                    act_bytes, s, routed, shared, route, x, n, lanes, aligned16(x));
    }
  }
  launch(swiglu_kernel<BitsG, BitsU, false>, static_cast<unsigned>(blocks), kMoeThreads, 0, s,
         routed, shared, route, x, n, lanes, aligned16(x));
}

// ---- expert_down_combine_gemv -------------------------------------------------------------
// A warp owns kDownRows consecutive output rows r0.. of one token t (grid y). Its work is
// k * Cd routed chunks (slot j, chunk c of expert row ids[t, j] * H + r) followed by Cs chunks
// of the shared expert's rows; the 32 lanes stride over that flat list. Each lane loads
// kDownUnroll items (kDownRows 16-byte loads each) before using any, so the k + 1 rows are
// fetched concurrently rather than one expert after another. Each item's activations
// (h[t, j] or shared_h[t]) serve the kDownRows rows. Per-lane partial sums are already
// weighted, so one warp sum per row gives the output: no atomics, no second pass.
constexpr int kDownRows = 2;
constexpr int kDownUnroll = 8;  // k = 8: the 144 items of a warp in one or two trips

// h [n * k, I]; ids, weights [n * k]; shared_h [n, S]; shared_logit [n]; out [n, H].
// kShared (only with BitsD == BitsS): h then shared_h are staged in shared memory,
// (n * k * I + n * S) * 4 bytes; shared_h's chunks follow h's.
template <int BitsD, int BitsS, bool kShared>
__global__ void __launch_bounds__(kMoeThreads)
    down_combine_kernel(QuantMatrix down, const float* __restrict__ h,
                        const int32_t* __restrict__ ids, const float* __restrict__ weights,
                        int64_t k, QuantMatrix shared_down, const float* __restrict__ shared_h,
                        const float* __restrict__ shared_logit, float* __restrict__ out,
                        bool x_vec) {
  constexpr int R = kDownRows;
  constexpr int U = kDownUnroll;
  using CD = Chunk<BitsD>;
  using CS = Chunk<BitsS>;
  const int64_t I = down.in;
  const int64_t S = shared_down.in;
  const int64_t cd = I / CD::kValues;  // chunks per routed row
  const int64_t cs = S / CS::kValues;  // chunks per shared row
  const int64_t words_s = S * BitsS / 32;
  const int64_t H = down.out;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * (kMoeThreads / 32) + threadIdx.x / 32) * R;
  // The shared expert's rows of this warp do not depend on the routing: into L2 before the
  // wait (the routed experts' rows were prefetched by the SwiGLU launch, when it had them).
  for (int i = 0; i < R && r0 + i < H; ++i) {
    for (int64_t c = threadIdx.x & 31; c < cs; c += 32) {
      prefetch_l2(shared_down.codes + (r0 + i) * words_s + 4 * c);
    }
  }
  grid_dependency_wait();
  const int64_t n = gridDim.y;
  extern __shared__ float4 staged[];
  if constexpr (kShared) {
    gemv_detail::stage_acts<BitsD>(h, n * k * I, x_vec, 0, staged);
    gemv_detail::stage_acts<BitsS>(shared_h, n * S, x_vec, n * k * cd, staged);
    __syncthreads();
  }
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t t = blockIdx.y;
  if (r0 >= H) return;  // whole warp
  int64_t r[R];
#pragma unroll
  for (int i = 0; i < R; ++i) r[i] = r0 + i < H ? r0 + i : H - 1;  // tail rows: never stored

  const int64_t words_d = I * BitsD / 32;
  const int64_t groups_d = I / kGroupSize;
  const int64_t groups_s = S / kGroupSize;
  const int64_t routed = k * cd;
  const int64_t items = routed + cs;
  const float gate = sigmoidf_(shared_logit[t]);
  // The shared expert's flat chunk 0 for token t: after h's chunks when staged together.
  const int64_t shared_chunk0 = (kShared ? n * k * cd : 0) + t * cs;

  float acc[R] = {};
  for (int64_t base = lane; base < items; base += 32 * U) {
    uint4 q[U][R];
    float sc[U][R];
    float bi[U][R];
    int64_t chunk[U];
    float weight[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t item = base + u * 32;
      weight[u] = 0.0f;
      chunk[u] = 0;
#pragma unroll
      for (int i = 0; i < R; ++i) {
        q[u][i] = make_uint4(0, 0, 0, 0);
        sc[u][i] = 0.0f;
        bi[u][i] = 0.0f;
      }
      if (item < routed) {
        const int64_t j = item / cd;
        const int64_t c = item - j * cd;
        const int64_t slot = t * k + j;
        const int64_t e = expert_at(ids, slot, down.experts);
        weight[u] = __ldg(weights + slot);
        chunk[u] = slot * cd + c;
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const int64_t row = e * H + r[i];
          q[u][i] = gemv_detail::load_stream(down.codes + row * words_d + 4 * c);
          sc[u][i] = gemv_detail::load_bf16(down.scales + row * groups_d + c / CD::kPerGroup);
          bi[u][i] = gemv_detail::load_bf16(down.biases + row * groups_d + c / CD::kPerGroup);
        }
      } else if (item < items) {
        const int64_t c = item - routed;
        weight[u] = gate;
        chunk[u] = shared_chunk0 + c;
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const int64_t row = r[i];
          q[u][i] = gemv_detail::load_stream(shared_down.codes + row * words_s + 4 * c);
          sc[u][i] = gemv_detail::load_bf16(shared_down.scales + row * groups_s + c / CS::kPerGroup);
          bi[u][i] = gemv_detail::load_bf16(shared_down.biases + row * groups_s + c / CS::kPerGroup);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t item = base + u * 32;
      if (item >= items) continue;
      float dot[R][1] = {};
      const int64_t at[1] = {chunk[u]};
      if constexpr (kShared) {
        const gemv_detail::SharedActs acts{staged};
        if (item < routed) {
          gemv_detail::chunk_dot<BitsD, R, 1>(q[u], sc[u], bi[u], acts, at, dot);
        } else {
          gemv_detail::chunk_dot<BitsS, R, 1>(q[u], sc[u], bi[u], acts, at, dot);
        }
      } else {
        if (item < routed) {
          gemv_detail::chunk_dot<BitsD, R, 1>(q[u], sc[u], bi[u], gemv_detail::GlobalActs{h, x_vec},
                                              at, dot);
        } else {
          gemv_detail::chunk_dot<BitsS, R, 1>(q[u], sc[u], bi[u],
                                              gemv_detail::GlobalActs{shared_h, x_vec}, at, dot);
        }
      }
#pragma unroll
      for (int i = 0; i < R; ++i) acc[i] = fmaf(weight[u], dot[i][0], acc[i]);
    }
  }
  allow_dependent_launch();
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float v = warp_sum(acc[i]);
    if (lane == 0 && r0 + i < H) out[t * H + r0 + i] = v;
  }
}

template <int BitsD, int BitsS>
void launch_down(const QuantMatrix& down, const float* h, const int32_t* ids,
                 const float* weights, int64_t n, int64_t k, const QuantMatrix& shared_down,
                 const float* shared_h, const float* shared_logit, float* out, Stream s) {
  const int64_t rows_per_block = (kMoeThreads / 32) * kDownRows;
  const dim3 grid(static_cast<unsigned>((down.out + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(n));
  const bool x_vec = aligned16(h) && aligned16(shared_h);
  const size_t act_bytes = static_cast<size_t>(n * k * down.in + n * shared_down.in) * sizeof(float);
  if constexpr (BitsD == BitsS) {
    if (act_bytes <= kMaxStagedBytes) {
      return launch(down_combine_kernel<BitsD, BitsS, true>, grid, kMoeThreads, act_bytes, s, down,
                    h, ids, weights, k, shared_down, shared_h, shared_logit, out, x_vec);
    }
  }
  launch(down_combine_kernel<BitsD, BitsS, false>, grid, kMoeThreads, 0, s, down, h, ids, weights,
         k, shared_down, shared_h, shared_logit, out, x_vec);
}

void check_bits(int bits, const char* op) {
  if (bits != 4 && bits != 8) {
    throw std::invalid_argument(std::string("cuda::") + op + ": bits must be 4 or 8");
  }
}

}  // namespace

namespace {
void swiglu_sets(const QuantMatrix& gate, const QuantMatrix& up, const int32_t* ids, int64_t k,
                 float* h, const QuantMatrix* shared_gate, const QuantMatrix* shared_up,
                 float* shared_h, const FusedRoute& route, const float* x, int64_t n,
                 Stream s) {
  if (n <= 0 || k <= 0 || gate.out <= 0) return;
  check_bits(gate.bits, "expert_swiglu_gemv");
  check_bits(up.bits, "expert_swiglu_gemv");
  const SwigluSet routed{gate, up, ids, n * k, k, h};
  SwigluSet shared{gate, up, nullptr, 0, 1, nullptr};
  if (shared_gate != nullptr) {
    if (shared_up == nullptr || shared_h == nullptr || shared_gate->bits != gate.bits ||
        shared_up->bits != up.bits || shared_gate->in != gate.in || shared_up->in != up.in) {
      throw std::invalid_argument(
          "cuda::expert_swiglu_shared_gemv: the shared expert needs the routed experts' code "
          "and input widths");
    }
    shared = SwigluSet{*shared_gate, *shared_up, nullptr, n, 1, shared_h};
  }
  if (gate.bits == 4 && up.bits == 4) return launch_swiglu<4, 4>(routed, shared, route, x, s);
  if (gate.bits == 8 && up.bits == 8) return launch_swiglu<8, 8>(routed, shared, route, x, s);
  if (gate.bits == 4) return launch_swiglu<4, 8>(routed, shared, route, x, s);
  return launch_swiglu<8, 4>(routed, shared, route, x, s);
}
}  // namespace

void expert_swiglu_gemv(const QuantMatrix& gate, const QuantMatrix& up, const float* x,
                        const int32_t* ids, int64_t n, int64_t k, float* h, Stream s) {
  expert_swiglu_shared_gemv(gate, up, ids, k, h, nullptr, nullptr, nullptr, x, n, s);
}

void route_expert_swiglu_gemv(const float* logits, int64_t experts, int32_t* ids, float* weights,
                              const QuantMatrix& gate, const QuantMatrix& up, int64_t k, float* h,
                              const QuantMatrix& shared_gate, const QuantMatrix& shared_up,
                              float* shared_h, const float* x, int64_t n,
                              const QuantMatrix* next_down, Stream s) {
  if (n > kGemvMaxTokens || k > kMaxFusedRouteK || experts > kMaxFusedRouteExperts ||
      k > experts) {
    throw std::invalid_argument(
        "cuda::route_expert_swiglu_gemv: needs n <= 8, k <= 16, k <= experts <= 256");
  }
  FusedRoute route{logits, static_cast<int>(experts), ids, weights};
  if (next_down != nullptr) route.next_down = *next_down;
  swiglu_sets(gate, up, ids, k, h, &shared_gate, &shared_up, shared_h, route, x, n, s);
}

void expert_swiglu_shared_gemv(const QuantMatrix& gate, const QuantMatrix& up, const int32_t* ids,
                               int64_t k, float* h, const QuantMatrix* shared_gate,
                               const QuantMatrix* shared_up, float* shared_h, const float* x,
                               int64_t n, Stream s) {
  swiglu_sets(gate, up, ids, k, h, shared_gate, shared_up, shared_h, FusedRoute{}, x, n, s);
}

void expert_down_combine_gemv(const QuantMatrix& down, const float* h, const int32_t* ids,
                              const float* weights, int64_t n, int64_t k,
                              const QuantMatrix& shared_down, const float* shared_h,
                              const float* shared_logit, float* out, Stream s) {
  if (n <= 0 || down.out <= 0) return;
  if (n > 65535) throw std::invalid_argument("cuda::expert_down_combine_gemv: n too large");
  check_bits(down.bits, "expert_down_combine_gemv");
  check_bits(shared_down.bits, "expert_down_combine_gemv");
  const int bd = down.bits;
  const int bs = shared_down.bits;
  if (bd == 4 && bs == 4) {
    return launch_down<4, 4>(down, h, ids, weights, n, k, shared_down, shared_h, shared_logit, out, s);
  }
  if (bd == 8 && bs == 8) {
    return launch_down<8, 8>(down, h, ids, weights, n, k, shared_down, shared_h, shared_logit, out, s);
  }
  if (bd == 4) {
    return launch_down<4, 8>(down, h, ids, weights, n, k, shared_down, shared_h, shared_logit, out, s);
  }
  return launch_down<8, 4>(down, h, ids, weights, n, k, shared_down, shared_h, shared_logit, out, s);
}

}  // namespace lily::cuda

// The sampler ops on the GPU: sample (sampling.h's stages, exact, no host round trip) and token_logprobs.
//
// Everything is read from device memory when it runs (logits, SamplerParams, counts, step), so
// the launches can be captured in a graph and replayed with other parameters. The launch
// sequence is fixed; kernels with nothing to do return at once:
//   1. sample_first   per 2048-id span: stages 1-3 into the processed logits P, the span's
//                     maximum, and (top_k <= 64) the span's 64 first ids of stage 5's order. Its
//                     last block: M; stage 4 (greedy: the token), or the top-k path: merge the
//                     lists into stage 5's k first ids, stages 6-9 on them, the token.
//   2. sample_second  (top_k 0 or > 64) per span: masses q, their sums and positives, the span's
//                     64 first ids when top_p < 1. Last block: no cut -> the draw over all ids;
//                     a top_p cut inside the 64 first ids -> the token; else a selection.
//   3. sample_round   x kRounds: one step of an exact radix selection of stage 5's or stage 7's
//                     cut (histogram of 11 key bits, or gathering the ids left, or resolving a
//                     run of equal logits by id), and once the cut is known, the draw.
// Masses are integers computed by sampling.h's sampler_mass (the CPU's bits), so every sum, in
// any order or by atomics, is exact: the draw is deterministic and the CPU's token. The
// selections never sort the vocabulary.
#include <cub/block/block_scan.cuh>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/sampling.h"

namespace lily::cuda {

namespace {

constexpr int kThreads = 256;               // every kernel here
constexpr int kItems = 8;                   // ids per thread of a span (see striped)
constexpr int kSpan = kThreads * kItems;    // 2048 ids per block
constexpr int kTopL = 64;                   // the per-span lists of the top-k path
constexpr int kMergeItems = 32;             // span heads per thread in a merge (<= 8192 spans)
constexpr int kMergeCap = kThreads * kMergeItems;       // 8192
// The list paths are taken up to this many spans (262,144 ids; past it, and as tested on a GPU,
// the selections serve every case). The merge itself would take up to kMergeCap spans.
constexpr int64_t kMaxListBlocks = kMergeCap / kTopL;   // 128
constexpr int kGatherItems = 16;            // per thread when a selection's last block resolves
constexpr int kGatherCap = kThreads * kGatherItems;     // 4096 ids gathered at most
constexpr int kBins = 2048;                 // histogram bins of one selection level (11 key bits)
constexpr int kLevels = 3;                  // 11 + 11 + 10 bits of the logit key
constexpr int kRounds = 8;                  // stage 5's selection (<= 4 rounds) + stage 7's (<= 4)
constexpr float kNegInf = -INFINITY;

// Device arrays of 64-bit words use the type of CUDA's atomics and cache-hinted loads.
using u64 = unsigned long long;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

enum Mode : int32_t { kModeDone = 0, kModeSecond = 1, kModeSelect = 2 };
enum Phase : int32_t { kPhaseHist = 0, kPhaseCompact = 1, kPhaseTies = 2 };
enum Kind : int32_t { kByCount = 0, kByMass = 1 };
enum Counter : int { kFirstCounter = 0, kSecondCounter, kRoundCounter, kLogprobCounter, kCounters };

// What the kernels of one sample call hand on to the next ones (device memory that starts
// zeroed: the backend allocates it with its zero-filling alloc). The last block of each
// kernel writes it; later kernels read it after their grid dependency wait.
struct SampleState {
  int32_t mode;
  int32_t argmax;
  float max;        // M
  uint32_t u24;     // stage 9's uniform
  uint64_t q_min;   // stage 8's threshold (>= 1: a mass of 0 is never drawn)
  // The selection in progress: among the eligible ids (q > 0, rank >= limit), the first in
  // stage 5's order at which the running weight (count or mass) reaches a target. `levels`
  // digits of the logit key are fixed to `prefix`; `remaining` is the weight still to cover
  // inside it, `above_mass` the mass of the eligible ids before it, `population` its count.
  int32_t kind;
  int32_t phase;
  int32_t levels;
  int32_t final_cut;  // the cut found ends the stages (else stage 7 follows stage 5)
  uint32_t prefix;
  uint32_t compact_count;
  uint64_t limit;
  uint64_t remaining;
  uint64_t above_mass;
  uint64_t population;
  unsigned counters[kCounters];  // last-block counts, reset by each last block
};

struct StateBlock {
  SampleState s;
  uint32_t hist_count[kBins];  // one selection level's histogram; zero between rounds
  u64 hist_mass[kBins];
};

// Per-call scratch in the workspace: nothing in it needs initialising.
struct Scratch {
  float* processed;   // [V] f32: P, the logits after stages 1-3
  float* part_max;    // [G] f32: each span's maximum of P
  int32_t* part_arg;  // [G] i32: its lowest id
  u64* part_a;        // [G] u64: span sums (masses of all ids / of the sure survivors)
  u64* part_b;        // [G] u64: span sums (drawable masses) / member masses
  uint32_t* part_c;   // [G] u32: span counts (ids with a mass / ids of a run of equal logits)
  u64* lists;         // [G, kTopL] rank keys: each span's first ids (0: none)
  u64* gathered;      // [kGatherCap] rank keys a selection gathers
  static size_t align(size_t bytes) { return (bytes + 255) / 256 * 256; }
  static size_t bytes(int64_t vocab, int64_t spans) {
    const auto V = static_cast<size_t>(vocab);
    const auto G = static_cast<size_t>(spans);
    return align(V * 4) + 2 * align(G * 4) + 2 * align(G * 8) + align(G * 4) +
           align(G * kTopL * 8) + align(size_t{kGatherCap} * 8);
  }
  Scratch(void* base, int64_t vocab, int64_t spans) {
    auto* p = static_cast<unsigned char*>(base);
    const auto V = static_cast<size_t>(vocab);
    const auto G = static_cast<size_t>(spans);
    const auto take = [&](size_t n) {
      unsigned char* at = p;
      p += align(n);
      return at;
    };
    processed = reinterpret_cast<float*>(take(V * 4));
    part_max = reinterpret_cast<float*>(take(G * 4));
    part_arg = reinterpret_cast<int32_t*>(take(G * 4));
    part_a = reinterpret_cast<u64*>(take(G * 8));
    part_b = reinterpret_cast<u64*>(take(G * 8));
    part_c = reinterpret_cast<uint32_t*>(take(G * 4));
    lists = reinterpret_cast<u64*>(take(G * kTopL * 8));
    gathered = reinterpret_cast<u64*>(take(size_t{kGatherCap} * 8));
  }
};

// The sampler buffers and sizes every kernel gets.
struct SampleArgs {
  const float* logits;        // [V] f32 (read only)
  const SamplerParams* params;
  int32_t* counts;            // [V] i32: read for stage 2, +1 at the token
  const int32_t* prompt_seen; // [V] i32
  int32_t* step;              // [1] i32: the Philox counter, +1
  int32_t* token_out;         // [1] i32
  int64_t vocab;
  int32_t spans;              // G = ceil(V / kSpan)
};

// The streaming passes give thread t ids t, t + 256, ... of its span (coalesced loads); only the
// rescans in id order (one span, in a last block) give it ids 8t .. 8t + 7.
__device__ __forceinline__ int64_t striped(int64_t base, int j) {
  return base + int64_t{j} * kThreads + threadIdx.x;
}

using BlockScanU64 = cub::BlockScan<unsigned long long, kThreads>;
using BlockScanInt = cub::BlockScan<int, kThreads>;

// ---- stage arithmetic (sampling.h; bit-identical to the CPU's) ----------------------------

// Stages 1 and 2 (sampler_add & co. round once each: nvcc would otherwise fuse multiply-adds).
__device__ __forceinline__ float process_logit(float l, int32_t count, int32_t seen,
                                               const SamplerParams& p) {
  const float r = p.repetition_penalty;
  if (r != 1.0f && (seen != 0 || count > 0)) l = l > 0.0f ? sampler_div(l, r) : sampler_mul(l, r);
  if (count > 0) {
    l = sampler_sub(l, sampler_add(sampler_mul(p.frequency_penalty, static_cast<float>(count)),
                                   p.presence_penalty));
  }
  return l;
}

__device__ __forceinline__ float sanitize(float l) { return isnan(l) ? kNegInf : fminf(l, FLT_MAX); }

// Stage 6's q: the same function, and so the same bits, as the CPU's.
__device__ __forceinline__ uint64_t mass_of(float l, float max, float t) { return sampler_mass(l, max, t); }

__device__ __forceinline__ uint64_t mass_of_rank(uint64_t rank, float max, float t) {
  return mass_of(key_logit(rank_key_logit_key(rank)), max, t);
}

// Stage 5's k (0 or >= vocab: every id).
__device__ __forceinline__ int64_t top_k_of(const SamplerParams& p, int64_t vocab) {
  return p.top_k <= 0 || p.top_k >= vocab ? vocab : p.top_k;
}

// Temperature 0, or anything that is not a positive number, is stage 4 (the host validates).
__device__ __forceinline__ bool greedy(const SamplerParams& p) { return !(p.temperature > 0.0f); }

__device__ __forceinline__ bool top_p_on(const SamplerParams& p) { return p.top_p < 1.0f; }

// ---- block utilities ----------------------------------------------------------------------

// (value, id) pairs: the larger value wins, then the lower id (values have no NaN).
__device__ __forceinline__ void keep_better(float& v, int32_t& i, float ov, int32_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// The block's best (value, id) in every thread.
__device__ void block_best(float& v, int32_t& i) {
  __shared__ float vals[kThreads / 32];
  __shared__ int32_t ids[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) keep_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  __syncthreads();  // earlier users of vals/ids are done
  if ((threadIdx.x & 31) == 0) {
    vals[threadIdx.x / 32] = v;
    ids[threadIdx.x / 32] = i;
  }
  __syncthreads();
  v = vals[0];
  i = ids[0];
  for (int w = 1; w < kThreads / 32; ++w) keep_better(v, i, vals[w], ids[w]);
}

// The block's sum in every thread.
__device__ uint64_t block_sum(uint64_t v) {
  __shared__ uint64_t sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sums[threadIdx.x / 32] = v;
  __syncthreads();
  uint64_t total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += sums[w];
  return total;
}

__device__ double block_sum_double(double v) {
  __shared__ double sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sums[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += sums[w];
  return total;
}

// After a block has written its partial results: whether it is the grid's last block to get
// here (it then sees every other block's writes). The last block resets the counter.
__device__ bool arrive_last(unsigned* counter, unsigned blocks) {
  __shared__ bool last;
  __threadfence();  // this thread's writes are visible device-wide before the count
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == blocks - 1;
  __syncthreads();
  if (last) {
    __threadfence();
    if (threadIdx.x == 0) *counter = 0;
  }
  return last;
}

// The block's AND and OR of its items (0: none), in every thread.
template <int N>
__device__ void block_and_or(const uint64_t (&rank)[N], uint64_t& all, uint64_t& any) {
  __shared__ uint64_t ands[kThreads / 32];
  __shared__ uint64_t ors[kThreads / 32];
  all = ~uint64_t{0};
  any = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (rank[j] != 0) {
      all &= rank[j];
      any |= rank[j];
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    all &= __shfl_xor_sync(0xffffffffu, all, o);
    any |= __shfl_xor_sync(0xffffffffu, any, o);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    ands[threadIdx.x / 32] = all;
    ors[threadIdx.x / 32] = any;
  }
  __syncthreads();
  all = ~uint64_t{0};
  any = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    all &= ands[w];
    any |= ors[w];
  }
}

// Block radix select: among the block's items (N rank keys per thread, 0: none) the first in
// descending rank order at which the running weight reaches `target` (1 <= target <= the
// total weight). 8-bit digits from the first bit in which the items differ (the bits above are
// common to all); a digit holding one item ends it early. Each warp adds one count and weight
// per distinct digit among its lanes (most items share the top digits: per-item atomics on one
// shared counter would serialise). Weights are below 2^41. Returns that rank in every thread;
// *before gets the weight ranking before it.
struct SelectShared {
  unsigned long long weight[256];
  unsigned count[256];
  uint64_t remaining;
  uint64_t before;
  uint64_t prefix;
  unsigned chosen_count;
  uint64_t result;
};

template <bool kUnitWeight, int N, typename Weight>
__device__ uint64_t block_select(const uint64_t (&rank)[N], const Weight& weight, uint64_t target,
                                 SelectShared& sh, uint64_t* before) {
  uint64_t all = 0;
  uint64_t any = 0;
  block_and_or(rank, all, any);  // synchronises: earlier users of sh are done
  const uint64_t differ = all ^ any;
  if (differ == 0) {  // one item (ranks are distinct) or none
    *before = 0;
    return any;
  }
  const int start = (63 - __clzll(static_cast<long long>(differ))) / 8 * 8;  // <= 48: keys < 2^56
  if (threadIdx.x == 0) {
    sh.remaining = target;
    sh.before = 0;
    sh.prefix = all >> start >> 8;  // the common bits above the first digit
  }
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int shift = start;; shift -= 8) {
    __syncthreads();
    sh.weight[threadIdx.x] = 0;  // kThreads == 256 bins
    sh.count[threadIdx.x] = 0;
    __syncthreads();
    const uint64_t prefix = sh.prefix;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const bool match = rank[j] != 0 && (rank[j] >> shift >> 8) == prefix;
      const unsigned active = __ballot_sync(0xffffffffu, match);
      if (match) {
        const auto digit = static_cast<unsigned>((rank[j] >> shift) & 255u);
        const unsigned peers = __match_any_sync(active, digit);
        uint64_t sum = __popc(peers);
        if constexpr (!kUnitWeight) {
          // The peers' weights: two exact 32-bit reductions of 20-bit parts (w < 2^41).
          const uint64_t w = weight(rank[j], j);
          const unsigned low = __reduce_add_sync(peers, static_cast<unsigned>(w & 0xFFFFFu));
          const unsigned high = __reduce_add_sync(peers, static_cast<unsigned>(w >> 20));
          sum = (static_cast<uint64_t>(high) << 20) + low;
        }
        if (lane == __ffs(static_cast<int>(peers)) - 1) {
          atomicAdd(&sh.weight[digit], static_cast<unsigned long long>(sum));
          atomicAdd(&sh.count[digit], static_cast<unsigned>(__popc(peers)));
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l sums digits 255 - 8l .. 248 - 8l (descending order); the lane whose range
      // holds the crossing finds its digit.
      uint64_t own = 0;
      for (int i = 0; i < 8; ++i) own += sh.weight[255 - (lane * 8 + i)];
      uint64_t inclusive = own;
      for (int o = 1; o < 32; o <<= 1) {
        const uint64_t up = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += up;
      }
      const uint64_t exclusive = inclusive - own;
      const uint64_t remaining = sh.remaining;
      __syncwarp();  // every lane has read sh.remaining before one lane rewrites it
      if (exclusive < remaining && remaining <= inclusive) {
        uint64_t above = exclusive;
        for (int i = 0; i < 8; ++i) {
          const int digit = 255 - (lane * 8 + i);
          const uint64_t w = sh.weight[digit];
          if (above + w >= remaining) {
            sh.remaining = remaining - above;
            sh.before += above;
            sh.prefix = (sh.prefix << 8) | static_cast<uint64_t>(digit);
            sh.chosen_count = sh.count[digit];
            break;
          }
          above += w;
        }
      }
    }
    __syncthreads();
    if (sh.chosen_count == 1 || shift == 0) {
      // One item left with this prefix (at shift 0 the whole key: ranks are distinct).
      const uint64_t found = sh.prefix;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if (rank[j] != 0 && (rank[j] >> shift) == found) sh.result = rank[j];
      }
      __syncthreads();
      *before = sh.before;
      return sh.result;
    }
  }
}

// block_select by count.
template <int N>
__device__ uint64_t block_select_count(const uint64_t (&rank)[N], uint64_t target, SelectShared& sh) {
  uint64_t before = 0;
  return block_select<true>(rank, [](uint64_t, int) { return uint64_t{1}; }, target, sh, &before);
}

// The want-th largest of n distinct rank keys in shared memory (1 <= want <= n), by counting:
// each thread takes the items t, t + 256, ... and counts the larger ones. O(n^2 / 256) shared
// loads (all threads read the same word: no bank conflicts); for the small sets it is used on
// this is cheaper than any radix pass. The result in every thread.
__device__ uint64_t kth_by_counting(const uint64_t* items, int n, int want, uint64_t* result) {
  for (int i = static_cast<int>(threadIdx.x); i < n; i += kThreads) {
    const uint64_t mine = items[i];
    int larger = 0;
    for (int j = 0; j < n; ++j) larger += items[j] > mine ? 1 : 0;
    if (larger == want - 1) *result = mine;
  }
  __syncthreads();
  return *result;
}

// The want-th item of the block's items in descending rank order (1 <= want <= kTopL, at most
// the number of items). The threads' best items are distinct, so the want-th best of them
// bounds the answer from below, and only the `want` threads reaching it hold items at or above
// it (at most want * N, gathered into a pool); both are chosen by counting, the pool by a
// radix select when it is large (many items near the top in a few threads).
constexpr int kPoolCap = kTopL * kMergeItems;  // 2048
constexpr int kCountingCap = 512;              // pools up to this are ranked by counting
struct KthShared {  // one per kernel, shared by its block_kth calls (they run one at a time)
  SelectShared select;
  uint64_t pool[kPoolCap];
  uint64_t bests[kThreads];
  int pooled;
  uint64_t result;
};
template <int N>
__device__ uint64_t block_kth(const uint64_t (&rank)[N], int want, KthShared& ks) {
  static_assert(N <= kMergeItems, "the pool holds kTopL * kMergeItems items");
  uint64_t best = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) best = rank[j] > best ? rank[j] : best;
  __syncthreads();  // earlier users of ks are done
  ks.bests[threadIdx.x] = best;
  if (threadIdx.x == 0) {
    ks.pooled = 0;
    ks.result = 0;
  }
  const int holders = __syncthreads_count(best != 0);
  uint64_t bound = 0;
  if (holders > want) {
    // The want-th best of the threads' bests (the zeros rank last).
    int larger = 0;
    for (int t = 0; t < kThreads; ++t) larger += ks.bests[t] > best ? 1 : 0;
    if (best != 0 && larger == want - 1) ks.result = best;
    __syncthreads();
    bound = ks.result;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (rank[j] != 0 && rank[j] >= bound) {
      const int at = atomicAdd(&ks.pooled, 1);
      if (at < kPoolCap) ks.pool[at] = rank[j];
    }
  }
  __syncthreads();
  const int n = min(ks.pooled, kPoolCap);
  if (n <= kCountingCap) return kth_by_counting(ks.pool, n, want, &ks.result);
  uint64_t item[kPoolCap / kThreads];
#pragma unroll
  for (int j = 0; j < kPoolCap / kThreads; ++j) {
    const int at = j * kThreads + static_cast<int>(threadIdx.x);
    item[j] = at < n ? ks.pool[at] : 0;
  }
  return block_select_count(item, static_cast<uint64_t>(want), ks.select);
}

// Writes the block's items with rank >= cut to out (any order); returns their count in every
// thread.
template <int N, typename Out>
__device__ int block_compact(const uint64_t (&rank)[N], uint64_t cut, Out* out) {
  __shared__ typename BlockScanInt::TempStorage scan;
  int mine = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) mine += rank[j] != 0 && rank[j] >= cut ? 1 : 0;
  int offset = 0;
  int total = 0;
  __syncthreads();
  BlockScanInt(scan).ExclusiveSum(mine, offset, total);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (rank[j] != 0 && rank[j] >= cut) out[offset++] = rank[j];
  }
  __syncthreads();
  return total;
}

// In a last block: the first `count` (<= kTopL) ids of stage 5's order among lists [lists,
// per_list] of rank keys (list b: the per_list first ids of span b, 0-padded), sorted
// descending into sorted[0..count) (shared memory). heads(b) is list b's first rank key (its
// span's maximum with its lowest id). The `count` largest heads are distinct ids, so the
// count-th of them bounds the answer from below: only the lists whose head reaches it (at most
// `count` of them, so at most count * per_list <= kTopL * kTopL items) are merged.
template <typename Heads>
__device__ void merge_first(const u64* lists, int spans, int per_list, int count, const Heads& heads,
                            uint64_t* sorted, KthShared& sh) {
  __shared__ uint64_t picked[kTopL];
  __shared__ int chosen[kTopL];
  __shared__ int chosen_count;
  uint64_t head[kMergeItems];  // spans <= kThreads * kMergeItems (vocab < 2^24)
#pragma unroll
  for (int j = 0; j < kMergeItems; ++j) {
    const int b = j * kThreads + static_cast<int>(threadIdx.x);
    head[j] = b < spans ? heads(b) : 0;
  }
  const uint64_t bound = count < spans ? block_kth(head, count, sh) : 0;
  if (threadIdx.x == 0) chosen_count = 0;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kMergeItems; ++j) {
    if (head[j] != 0 && head[j] >= bound) chosen[atomicAdd(&chosen_count, 1)] = j * kThreads + static_cast<int>(threadIdx.x);
  }
  __syncthreads();
  const int n = chosen_count * per_list;  // <= kTopL * kTopL
  constexpr int kPerThread = kTopL * kTopL / kThreads;  // 16
  uint64_t rank[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int at = j * kThreads + static_cast<int>(threadIdx.x);
    rank[j] = at < n ? __ldcg(lists + int64_t{chosen[at / per_list]} * per_list + at % per_list) : 0;
  }
  const uint64_t cut = block_kth(rank, count, sh);
  block_compact(rank, cut, picked);
  // Rank by counting: exactly `count` distinct keys.
  if (static_cast<int>(threadIdx.x) < count) {
    const uint64_t mine = picked[threadIdx.x];
    int position = 0;
    for (int i = 0; i < count; ++i) position += picked[i] > mine ? 1 : 0;
    sorted[position] = mine;
  }
  __syncthreads();
}

// A span's first rank key from its maximum and that maximum's lowest id.
struct SpanHeads {
  const float* part_max;
  const int32_t* part_arg;
  __device__ uint64_t operator()(int b) const {
    return rank_key(logit_key(__ldcg(part_max + b)), __ldcg(part_arg + b));
  }
};

// ---- finishing a draw -----------------------------------------------------------------------

// The token is known: write it, count it, advance the step, end the call's later kernels.
__device__ void finish(const SampleArgs& a, SampleState& st, int32_t token) {
  if (threadIdx.x == 0) {
    if (token < 0 || token >= a.vocab) token = st.argmax;  // not reached: a draw always finds one
    *a.token_out = token;
    a.counts[token] += 1;
    *a.step = static_cast<int32_t>(static_cast<uint32_t>(*a.step) + 1u);
    st.mode = kModeDone;
  }
}

// Stages 7-9 on stage 5's first n ids, sorted (shared memory, n <= kTopL). z: stage 5's mass,
// or 0 to take the list's own (the list is all of stage 5). Returns the token in every
// thread, or -1 when the top_p cut is not inside the list.
__device__ int32_t draw_from_list(const uint64_t* sorted, int n, uint64_t z, const SamplerParams& p,
                                  const SampleState& st) {
  __shared__ uint64_t mass[kTopL];
  __shared__ int slot[kTopL];
  __shared__ int kept;
  __shared__ int32_t token;
  const int j = static_cast<int>(threadIdx.x);
  if (j < n) mass[j] = mass_of_rank(sorted[j], st.max, p.temperature);
  __syncthreads();
  if (j == 0) {
    uint64_t total = z;
    if (total == 0) {
      for (int i = 0; i < n; ++i) total += mass[i];
    }
    kept = n;
    if (top_p_on(p)) {
      const uint64_t threshold = top_p_threshold(p.top_p, total);
      uint64_t running = 0;
      kept = -1;
      for (int i = 0; i < n; ++i) {
        running += mass[i];
        if (running >= threshold) {
          kept = i + 1;
          break;
        }
      }
    }
  }
  __syncthreads();
  const int c = kept;
  if (c < 0) return -1;
  // Stage 8, then each survivor's place in id order.
  const bool survives = j < c && mass[j] >= st.q_min;
  if (survives) {
    const int32_t id = rank_key_id(sorted[j]);
    int place = 0;
    for (int i = 0; i < c; ++i) {
      place += mass[i] >= st.q_min && rank_key_id(sorted[i]) < id ? 1 : 0;
    }
    slot[place] = j;
  }
  __syncthreads();
  if (j == 0) {
    int survivors = 0;
    uint64_t total = 0;
    for (int i = 0; i < c; ++i) {
      if (mass[i] >= st.q_min) {
        ++survivors;
        total += mass[i];
      }
    }
    const uint64_t target = draw_target(st.u24, total);
    uint64_t running = 0;
    token = rank_key_id(sorted[slot[survivors - 1]]);
    for (int i = 0; i < survivors; ++i) {
      running += mass[slot[i]];
      if (running > target) {
        token = rank_key_id(sorted[slot[i]]);
        break;
      }
    }
  }
  __syncthreads();
  return token;
}

// Stage 9 over the whole vocabulary in id order, in a last block: span b's drawable mass is
// span_mass(b); the draw's span is found from those, then that span's ids are rescanned: a
// drawable id has q >= q_min and rank >= cut (0: no cut). Returns the token in every thread.
template <typename SpanMass>
__device__ int32_t draw_over_spans(const SampleArgs& a, const Scratch& sc, const SampleState& st,
                                   uint64_t cut, const SpanMass& span_mass) {
  __shared__ typename BlockScanU64::TempStorage scan;
  __shared__ int span;
  __shared__ uint64_t target_in_span;
  __shared__ int32_t token;
  // Spans in contiguous chunks per thread, in order.
  const int G = a.spans;
  const int per = (G + kThreads - 1) / kThreads;
  const int begin = static_cast<int>(threadIdx.x) * per;
  const int end = min(G, begin + per);
  uint64_t mine = 0;
  for (int b = begin; b < end; ++b) mine += span_mass(b);
  unsigned long long before = 0;
  unsigned long long total = 0;
  __syncthreads();
  BlockScanU64(scan).ExclusiveSum(static_cast<unsigned long long>(mine), before, total);
  const uint64_t target = draw_target(st.u24, total);
  if (before <= target && target < before + mine) {  // exactly one thread
    uint64_t running = before;
    for (int b = begin; b < end; ++b) {
      const uint64_t m = span_mass(b);
      if (target < running + m) {
        span = b;
        target_in_span = target - running;
        break;
      }
      running += m;
    }
  }
  __syncthreads();
  // The span's ids in id order: thread t holds ids 8t..8t+7.
  const int64_t first = int64_t{span} * kSpan + int64_t{threadIdx.x} * kItems;
  const SamplerParams& p = *a.params;
  uint64_t q[kItems];
  uint64_t own = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int64_t id = first + j;
    q[j] = 0;
    if (id < a.vocab) {
      const float v = sc.processed[id];
      const uint64_t m = mass_of(v, st.max, p.temperature);
      if (m >= st.q_min && (cut == 0 || rank_key(logit_key(v), static_cast<int32_t>(id)) >= cut)) q[j] = m;
    }
    own += q[j];
  }
  __syncthreads();
  BlockScanU64(scan).ExclusiveSum(static_cast<unsigned long long>(own), before, total);
  const uint64_t t = target_in_span;
  if (before <= t && t < before + own) {
    uint64_t running = before;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      running += q[j];
      if (running > t) {
        token = static_cast<int32_t>(first + j);
        break;
      }
    }
  }
  __syncthreads();
  return token;
}

// Starts a selection (its first round runs in the next sample_round launch).
__device__ void start_select(SampleState& st, int32_t kind, uint64_t target, uint64_t limit,
                             uint64_t population, bool final_cut) {
  st.kind = kind;
  st.remaining = target;
  st.limit = limit;
  st.population = population;
  st.final_cut = final_cut ? 1 : 0;
  st.levels = 0;
  st.prefix = 0;
  st.above_mass = 0;
  st.compact_count = 0;
  st.phase = population <= static_cast<uint64_t>(kGatherCap) ? kPhaseCompact : kPhaseHist;
  st.mode = kModeSelect;
}

// ---- kernels ------------------------------------------------------------------------------

// Stages 1-3 into P, each span's maximum, and for the top-k path each span's kTopL first ids;
// the last block: M, then the greedy token, the top-k path's token, or sample_second's turn.
__global__ void __launch_bounds__(kThreads)
    sample_first_kernel(SampleArgs a, StateBlock* state, Scratch sc) {
  grid_dependency_wait();
  __shared__ float tile[kSpan];  // the span's penalised logits, for logit_bias
  __shared__ KthShared sh;
  __shared__ uint64_t sorted[kTopL];
  const SamplerParams& p = *a.params;
  SampleState& st = state->s;
  const int64_t base = int64_t{blockIdx.x} * kSpan;
  float v[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int64_t id = striped(base, j);
    v[j] = id < a.vocab ? process_logit(a.logits[id], a.counts[id], a.prompt_seen[id], p) : kNegInf;
  }
  const int bias_count = min(max(p.bias_count, 0), kMaxLogitBias);
  if (bias_count > 0) {
    // Stage 3 through shared memory: each block applies the entries that fall in its span
    // (ids are distinct, so every sum is one f32 rounding, as on the CPU).
#pragma unroll
    for (int j = 0; j < kItems; ++j) tile[j * kThreads + threadIdx.x] = v[j];
    __syncthreads();
    for (int e = static_cast<int>(threadIdx.x); e < bias_count; e += kThreads) {
      const int64_t id = p.bias_ids[e];
      if (id >= base && id < base + kSpan && id < a.vocab) atomicAdd(&tile[id - base], p.bias_values[e]);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kItems; ++j) v[j] = tile[j * kThreads + threadIdx.x];
  }
  float best = kNegInf;
  int32_t best_id = INT32_MAX;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int64_t id = striped(base, j);
    if (id < a.vocab) {
      v[j] = sanitize(v[j]);
      sc.processed[id] = v[j];
      keep_better(best, best_id, v[j], static_cast<int32_t>(id));
    }
  }
  block_best(best, best_id);
  if (threadIdx.x == 0) {
    sc.part_max[blockIdx.x] = best;
    sc.part_arg[blockIdx.x] = best_id;
  }
  const int64_t k = top_k_of(p, a.vocab);
  const bool list_path = !greedy(p) && k <= kTopL && k < a.vocab && a.spans <= kMaxListBlocks;
  if (list_path) {
    // The span's kTopL first ids of stage 5's order (or all of them).
    uint64_t rank[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t id = striped(base, j);
      rank[j] = id < a.vocab ? rank_key(logit_key(v[j]), static_cast<int32_t>(id)) : 0;
    }
    // A global first-k id is among its span's k first ids: lists of k (0-padded to kTopL).
    const auto valid = static_cast<int>(min64(kSpan, a.vocab - base));
    const int want = min(static_cast<int>(k), valid);
    const uint64_t cut = block_kth(rank, want, sh);
    u64* list = sc.lists + int64_t{blockIdx.x} * kTopL;
    block_compact(rank, cut, list);
    for (int j = want + static_cast<int>(threadIdx.x); j < kTopL; j += kThreads) list[j] = 0;
  }
  allow_dependent_launch();
  if (!arrive_last(&st.counters[kFirstCounter], static_cast<unsigned>(a.spans))) return;

  // The last block: M and its lowest id.
  best = kNegInf;
  best_id = INT32_MAX;
  for (int b = static_cast<int>(threadIdx.x); b < a.spans; b += kThreads) {
    keep_better(best, best_id, __ldcg(sc.part_max + b), __ldcg(sc.part_arg + b));
  }
  block_best(best, best_id);
  if (threadIdx.x == 0) {
    st.max = best;
    st.argmax = best_id;
    st.u24 = sampler_u24(p.seed_lo, p.seed_hi, static_cast<uint32_t>(*a.step));
    st.q_min = max_u64(min_p_threshold(p.min_p), 1);
  }
  __syncthreads();
  if (greedy(p) || best == kNegInf) {
    finish(a, st, best_id);  // stage 4
    return;
  }
  if (!list_path) {
    if (threadIdx.x == 0) st.mode = kModeSecond;
    return;
  }
  // The top-k path: stage 5's k first ids from the spans' lists, then stages 6-9 on them.
  merge_first(sc.lists, a.spans, kTopL, static_cast<int>(k), SpanHeads{sc.part_max, sc.part_arg},
              sorted, sh);
  finish(a, st, draw_from_list(sorted, static_cast<int>(k), 0, p, st));
}

// top_k 0 or beyond the top-k path: masses of every id, their sums, and the lists for a top_p
// cut inside the first kTopL ids; the last block draws or starts a selection.
__global__ void __launch_bounds__(kThreads)
    sample_second_kernel(SampleArgs a, StateBlock* state, Scratch sc) {
  // Usually there is nothing to do: let the next launch start waiting at once, so that a chain
  // of idle kernels costs little more than one (the next one waits for this one anyway).
  allow_dependent_launch();
  grid_dependency_wait();
  SampleState& st = state->s;
  if (st.mode != kModeSecond) return;
  __shared__ KthShared sh;
  __shared__ uint64_t sorted[kTopL];
  const SamplerParams& p = *a.params;
  const float M = st.max;
  const float T = p.temperature;
  const uint64_t q_min = st.q_min;
  const int64_t base = int64_t{blockIdx.x} * kSpan;
  uint64_t rank[kItems];
  uint64_t z = 0;
  uint64_t drawable = 0;
  uint64_t positive = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int64_t id = striped(base, j);
    rank[j] = 0;
    if (id < a.vocab) {
      const float v = sc.processed[id];
      const uint64_t q = mass_of(v, M, T);
      z += q;
      drawable += q >= q_min ? q : 0;
      positive += q > 0 ? 1 : 0;
      rank[j] = rank_key(logit_key(v), static_cast<int32_t>(id));
    }
  }
  z = block_sum(z);
  drawable = block_sum(drawable);
  positive = block_sum(positive);
  if (threadIdx.x == 0) {
    sc.part_a[blockIdx.x] = z;
    sc.part_b[blockIdx.x] = drawable;
    sc.part_c[blockIdx.x] = static_cast<uint32_t>(positive);
  }
  const bool lists = top_p_on(p) && a.spans <= kMaxListBlocks;
  if (lists) {
    const auto valid = static_cast<int>(min64(kSpan, a.vocab - base));
    const int want = min(kTopL, valid);
    const uint64_t cut = block_kth(rank, want, sh);
    u64* list = sc.lists + int64_t{blockIdx.x} * kTopL;
    block_compact(rank, cut, list);
    for (int j = want + static_cast<int>(threadIdx.x); j < kTopL; j += kThreads) list[j] = 0;
  }
  if (!arrive_last(&st.counters[kSecondCounter], static_cast<unsigned>(a.spans))) return;

  uint64_t z_part = 0;
  uint64_t positive_part = 0;
  for (int b = static_cast<int>(threadIdx.x); b < a.spans; b += kThreads) {
    z_part += __ldcg(sc.part_a + b);
    positive_part += __ldcg(sc.part_c + b);
  }
  const uint64_t z_all = block_sum(z_part);
  const uint64_t ids_with_mass = block_sum(positive_part);
  const auto k = static_cast<uint64_t>(top_k_of(p, a.vocab));
  if (k < ids_with_mass) {
    // Stage 5 cuts among the ids with a mass: select its k-th id (then stage 7, if on).
    if (threadIdx.x == 0) start_select(st, kByCount, k, 0, ids_with_mass, !top_p_on(p));
    return;
  }
  // Stage 5 keeps every id with a mass (beyond them q = 0: never drawn).
  if (!top_p_on(p)) {
    const int32_t token = draw_over_spans(a, sc, st, 0, [&](int b) { return __ldcg(sc.part_b + b); });
    finish(a, st, token);
    return;
  }
  const uint64_t threshold = top_p_threshold(p.top_p, z_all);
  if (lists) {
    const auto n = static_cast<int>(min64(kTopL, a.vocab));
    merge_first(sc.lists, a.spans, kTopL, n, SpanHeads{sc.part_max, sc.part_arg}, sorted, sh);
    const int32_t token = draw_from_list(sorted, n, z_all, p, st);
    if (token >= 0) {
      finish(a, st, token);
      return;
    }
  }
  if (threadIdx.x == 0) start_select(st, kByMass, threshold, 0, ids_with_mass, true);
}

// One round of the selection in progress (see SampleState), or nothing.
__global__ void __launch_bounds__(kThreads)
    sample_round_kernel(SampleArgs a, StateBlock* state, Scratch sc) {
  allow_dependent_launch();  // as in sample_second: most rounds have nothing to do
  grid_dependency_wait();
  SampleState& st = state->s;
  if (st.mode != kModeSelect) return;
  __shared__ unsigned bin_count[kBins];
  __shared__ unsigned long long bin_mass[kBins];
  __shared__ SelectShared sh;
  __shared__ typename BlockScanInt::TempStorage scan;
  __shared__ int gathered_at;
  const SamplerParams& p = *a.params;
  const float M = st.max;
  const float T = p.temperature;
  const int phase = st.phase;
  const int kind = st.kind;
  const int levels = st.levels;
  const uint32_t prefix = st.prefix;
  const uint64_t limit = st.limit;
  const bool final_cut = st.final_cut != 0;
  const uint64_t q_min = st.q_min;
  const uint32_t fixed = levels == 0 ? 0u : levels == 1 ? 0xFFE00000u : levels == 2 ? 0xFFFFFC00u : 0xFFFFFFFFu;
  // This thread's ids: members of the selection (eligible, a mass, the fixed key bits) and
  // sure survivors (eligible, drawable, ranked before every member).
  const int64_t base = int64_t{blockIdx.x} * kSpan;
  uint32_t key[kItems];
  uint64_t rank[kItems];
  uint64_t mass[kItems];
  bool member[kItems];
  uint64_t sure = 0;
  int members = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int64_t id = striped(base, j);
    member[j] = false;
    rank[j] = 0;
    mass[j] = 0;
    key[j] = 0;
    if (id < a.vocab) {
      const float v = sc.processed[id];
      key[j] = logit_key(v);
      rank[j] = rank_key(key[j], static_cast<int32_t>(id));
      mass[j] = mass_of(v, M, T);
      const bool eligible = mass[j] > 0 && (limit == 0 || rank[j] >= limit);
      member[j] = eligible && (key[j] & fixed) == prefix;
      if (eligible && mass[j] >= q_min && (key[j] & fixed) > prefix) sure += mass[j];
      members += member[j] ? 1 : 0;
    }
  }

  if (phase == kPhaseHist) {
    // The next digit of the members' keys: count and mass per bin, into the global histogram.
    const int shift = levels == 0 ? 21 : levels == 1 ? 10 : 0;
    const uint32_t digit_mask = levels == 2 ? 0x3FFu : 0x7FFu;
    for (int i = static_cast<int>(threadIdx.x); i < kBins; i += kThreads) {
      bin_count[i] = 0;
      bin_mass[i] = 0;
    }
    __syncthreads();
    // One atomic per distinct digit of a warp (most members share a few bins).
    const int lane = static_cast<int>(threadIdx.x & 31);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const unsigned active = __ballot_sync(0xffffffffu, member[j]);
      if (member[j]) {
        const uint32_t d = (key[j] >> shift) & digit_mask;
        const unsigned peers = __match_any_sync(active, d);
        const unsigned low = __reduce_add_sync(peers, static_cast<unsigned>(mass[j] & 0xFFFFFu));
        const unsigned high = __reduce_add_sync(peers, static_cast<unsigned>(mass[j] >> 20));
        if (lane == __ffs(static_cast<int>(peers)) - 1) {
          atomicAdd(&bin_count[d], static_cast<unsigned>(__popc(peers)));
          atomicAdd(&bin_mass[d], (static_cast<unsigned long long>(high) << 20) + low);
        }
      }
    }
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < kBins; i += kThreads) {
      if (bin_count[i] != 0) {
        atomicAdd(&state->hist_count[i], bin_count[i]);
        atomicAdd(&state->hist_mass[i], bin_mass[i]);
      }
    }
    if (!arrive_last(&st.counters[kRoundCounter], static_cast<unsigned>(a.spans))) return;
    // The last block: the bin holding the crossing, from the top digit down. Thread t owns
    // bins 2047 - 8t .. 2040 - 8t.
    __shared__ typename BlockScanU64::TempStorage scan64;
    uint64_t w[8];
    uint64_t m[8];
    uint32_t c[8];
    uint64_t own_w = 0;
    uint64_t own_m = 0;
    for (int i = 0; i < 8; ++i) {
      const int bin = kBins - 1 - (static_cast<int>(threadIdx.x) * 8 + i);
      c[i] = __ldcg(&state->hist_count[bin]);
      m[i] = __ldcg(&state->hist_mass[bin]);
      w[i] = kind == kByCount ? c[i] : m[i];
      state->hist_count[bin] = 0;  // zero for the next level or call
      state->hist_mass[bin] = 0;
      own_w += w[i];
      own_m += m[i];
    }
    unsigned long long before_w = 0;
    unsigned long long before_m = 0;
    unsigned long long total = 0;
    BlockScanU64(scan64).ExclusiveSum(static_cast<unsigned long long>(own_w), before_w, total);
    __syncthreads();
    BlockScanU64(scan64).ExclusiveSum(static_cast<unsigned long long>(own_m), before_m, total);
    const uint64_t remaining = st.remaining;
    __syncthreads();  // every thread has read st.remaining
    if (before_w < remaining && remaining <= before_w + own_w) {
      uint64_t above_w = before_w;
      uint64_t above_m = before_m;
      for (int i = 0; i < 8; ++i) {
        if (above_w + w[i] >= remaining) {
          const int bin = kBins - 1 - (static_cast<int>(threadIdx.x) * 8 + i);
          st.remaining = remaining - above_w;
          st.above_mass += above_m;
          st.prefix = prefix | (static_cast<uint32_t>(bin) << shift);
          st.levels = levels + 1;
          st.population = c[i];
          st.phase = c[i] <= static_cast<uint32_t>(kGatherCap) ? kPhaseCompact
                     : levels + 1 == kLevels                    ? kPhaseTies
                                                                : kPhaseHist;
          break;
        }
        above_w += w[i];
        above_m += m[i];
      }
    }
    return;
  }

  // The cut is found this round (gathering: in the last block; a run of equal logits: by id).
  uint64_t cut = 0;
  uint64_t z_through = 0;  // mass of the eligible ids up to and including the cut
  if (phase == kPhaseCompact) {
    int offset = 0;
    int total = 0;
    BlockScanInt(scan).ExclusiveSum(members, offset, total);
    if (threadIdx.x == 0) gathered_at = total > 0 ? static_cast<int>(atomicAdd(&st.compact_count, static_cast<unsigned>(total))) : 0;
    __syncthreads();
    offset += gathered_at;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (member[j] && offset < kGatherCap) sc.gathered[offset++] = rank[j];
    }
    if (final_cut) {
      const uint64_t sure_span = block_sum(sure);
      if (threadIdx.x == 0) sc.part_a[blockIdx.x] = sure_span;
    }
    if (!arrive_last(&st.counters[kRoundCounter], static_cast<unsigned>(a.spans))) return;
    const int n = min(static_cast<int>(__ldcg(&st.compact_count)), kGatherCap);
    uint64_t item[kGatherItems];
    uint64_t item_mass[kGatherItems];  // computed once, not per radix pass
#pragma unroll
    for (int j = 0; j < kGatherItems; ++j) {
      const int at = j * kThreads + static_cast<int>(threadIdx.x);
      item[j] = at < n ? __ldcg(sc.gathered + at) : 0;
      item_mass[j] = item[j] != 0 ? mass_of_rank(item[j], M, T) : 0;
    }
    if (kind == kByCount) {
      cut = block_select_count(item, st.remaining, sh);
    } else {
      uint64_t before = 0;
      cut = block_select<false>(item, [&](uint64_t, int j) { return item_mass[j]; }, st.remaining,
                                sh, &before);
    }
    uint64_t through = 0;
#pragma unroll
    for (int j = 0; j < kGatherItems; ++j) {
      if (item[j] != 0 && item[j] >= cut) through += item_mass[j];
    }
    z_through = st.above_mass + block_sum(through);
    if (final_cut) {
      // Each span's drawable members (rank >= cut), added to its sure survivors' mass.
      for (int b = static_cast<int>(threadIdx.x); b < a.spans; b += kThreads) sc.part_b[b] = 0;
      __syncthreads();
      const int lane = static_cast<int>(threadIdx.x & 31);
#pragma unroll
      for (int j = 0; j < kGatherItems; ++j) {
        const uint64_t q = item[j] != 0 && item[j] >= cut ? item_mass[j] : 0;
        const bool add = q >= q_min && q > 0;
        const unsigned active = __ballot_sync(0xffffffffu, add);
        if (add) {
          const int span_of = rank_key_id(item[j]) / kSpan;
          const unsigned peers = __match_any_sync(active, span_of);
          const unsigned low = __reduce_add_sync(peers, static_cast<unsigned>(q & 0xFFFFFu));
          const unsigned high = __reduce_add_sync(peers, static_cast<unsigned>(q >> 20));
          if (lane == __ffs(static_cast<int>(peers)) - 1) {
            atomicAdd(&sc.part_b[span_of], (static_cast<u64>(high) << 20) + low);
          }
        }
      }
      __threadfence_block();
      __syncthreads();
    }
    if (threadIdx.x == 0) st.compact_count = 0;
  } else {  // kPhaseTies: every member has the logit key `prefix` and the same mass
    const uint64_t q_run = mass_of(key_logit(prefix), M, T);
    if (final_cut) {
      const uint64_t sure_span = block_sum(sure);
      if (threadIdx.x == 0) sc.part_a[blockIdx.x] = sure_span;
    }
    const uint64_t run_span = block_sum(static_cast<uint64_t>(members));
    if (threadIdx.x == 0) sc.part_c[blockIdx.x] = static_cast<uint32_t>(run_span);
    if (!arrive_last(&st.counters[kRoundCounter], static_cast<unsigned>(a.spans))) return;
    // The j-th member in id order, j = ceil(remaining / weight).
    const uint64_t weight = kind == kByCount ? 1 : q_run;
    const uint64_t want = (st.remaining + weight - 1) / weight;
    __shared__ int span;
    __shared__ uint64_t before_span;
    __shared__ typename BlockScanU64::TempStorage scan64;
    const int G = a.spans;
    const int per = (G + kThreads - 1) / kThreads;
    const int begin = static_cast<int>(threadIdx.x) * per;
    const int end = min(G, begin + per);
    uint64_t mine = 0;
    for (int b = begin; b < end; ++b) mine += __ldcg(sc.part_c + b);
    unsigned long long before = 0;
    unsigned long long total = 0;
    BlockScanU64(scan64).ExclusiveSum(static_cast<unsigned long long>(mine), before, total);
    if (before < want && want <= before + mine) {
      uint64_t running = before;
      for (int b = begin; b < end; ++b) {
        const uint64_t c = __ldcg(sc.part_c + b);
        if (want <= running + c) {
          span = b;
          before_span = running;
          break;
        }
        running += c;
      }
    }
    __syncthreads();
    // Rescan that span: the members in id order.
    __shared__ int32_t found;
    const int64_t span_first = int64_t{span} * kSpan + int64_t{threadIdx.x} * kItems;
    int own = 0;
    bool is_member[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t id = span_first + j;
      is_member[j] = false;
      if (id < a.vocab) {
        const float v = sc.processed[id];
        const uint64_t r = rank_key(logit_key(v), static_cast<int32_t>(id));
        is_member[j] = logit_key(v) == prefix && mass_of(v, M, T) > 0 && (limit == 0 || r >= limit);
      }
      own += is_member[j] ? 1 : 0;
    }
    int offset = 0;
    int count = 0;
    __syncthreads();
    BlockScanInt(scan).ExclusiveSum(own, offset, count);
    const auto need = static_cast<int>(want - before_span);  // 1-based within the span
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (is_member[j]) {
        ++offset;
        if (offset == need) found = static_cast<int32_t>(span_first + j);
      }
    }
    __syncthreads();
    cut = rank_key(prefix, found);
    z_through = st.above_mass + want * q_run;
    if (final_cut) {
      // Span b's drawable members: all of its run before the cut's span, part of it there.
      const bool run_drawable = q_run >= q_min;
      for (int b = static_cast<int>(threadIdx.x); b < a.spans; b += kThreads) {
        const uint64_t run = __ldcg(sc.part_c + b);
        const uint64_t counted = b < span ? run : b == span ? want - before_span : 0;
        sc.part_b[b] = run_drawable ? counted * q_run : 0;
      }
      __threadfence_block();
      __syncthreads();
    }
  }

  // The cut is known.
  if (!final_cut) {
    // Stage 5's cut: stage 7 follows among its k ids (kind == kByCount; limit: the cut).
    if (threadIdx.x == 0) {
      start_select(st, kByMass, top_p_threshold(p.top_p, z_through), cut,
                   static_cast<uint64_t>(top_k_of(p, a.vocab)), true);
    }
    return;
  }
  const int32_t token = draw_over_spans(a, sc, st, cut, [&](int b) {
    return __ldcg(sc.part_a + b) + __ldcg(sc.part_b + b);
  });
  finish(a, st, token);
}

// ---- token_logprobs -----------------------------------------------------------------------

struct LogprobScratch {
  float* part_max;     // [G] f32: each span's maximum (sanitised logits)
  int32_t* part_arg;   // [G] i32: its lowest id
  double* part_sum;    // [G] f64: sum of e^(l - span max) over the span
  u64* lists;          // [G, 20] rank keys of each span's 20 largest logits
  static size_t bytes(int64_t spans) {
    const auto G = static_cast<size_t>(spans);
    return 2 * Scratch::align(G * 4) + Scratch::align(G * 8) +
           Scratch::align(G * kMaxTopLogprobs * 8);
  }
  LogprobScratch(void* base, int64_t spans) {
    auto* p = static_cast<unsigned char*>(base);
    const auto G = static_cast<size_t>(spans);
    part_max = reinterpret_cast<float*>(p);
    p += Scratch::align(G * 4);
    part_arg = reinterpret_cast<int32_t*>(p);
    p += Scratch::align(G * 4);
    part_sum = reinterpret_cast<double*>(p);
    p += Scratch::align(G * 8);
    lists = reinterpret_cast<u64*>(p);
  }
};

__device__ __forceinline__ void put_float(int32_t* record, int at, float f) {
  record[at] = __float_as_int(f);
}

// log-sum-exp of the raw logits and their n largest (n = top_logprobs, 0..20), per span; the
// last block combines them and writes the record.
__global__ void __launch_bounds__(kThreads)
    logprobs_kernel(const float* logits, int64_t vocab, int spans, const int32_t* token,
                    const SamplerParams* params, int32_t* record, StateBlock* state,
                    LogprobScratch sc) {
  grid_dependency_wait();
  __shared__ KthShared sh;
  __shared__ uint64_t sorted[kTopL];
  // The record's n: top_logprobs within 0..20, and at most the vocabulary.
  const int n = static_cast<int>(min64(min(max(params->top_logprobs, 0), kMaxTopLogprobs), vocab));
  const int64_t base = int64_t{blockIdx.x} * kSpan;
  float v[kItems];
  float best = kNegInf;
  int32_t best_id = INT32_MAX;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int64_t id = striped(base, j);
    v[j] = id < vocab ? sanitize(logits[id]) : kNegInf;
    if (id < vocab) keep_better(best, best_id, v[j], static_cast<int32_t>(id));
  }
  block_best(best, best_id);
  double sum = 0;
  if (best != kNegInf) {
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (striped(base, j) < vocab) sum += static_cast<double>(sampler_exp(sampler_sub(v[j], best)));
    }
  }
  sum = block_sum_double(sum);
  if (threadIdx.x == 0) {
    sc.part_max[blockIdx.x] = best;
    sc.part_arg[blockIdx.x] = best_id;
    sc.part_sum[blockIdx.x] = sum;
  }
  if (n > 0) {
    uint64_t rank[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t id = striped(base, j);
      rank[j] = id < vocab ? rank_key(logit_key(v[j]), static_cast<int32_t>(id)) : 0;
    }
    const int want = min(n, static_cast<int>(min64(kSpan, vocab - base)));
    const uint64_t cut = block_kth(rank, want, sh);
    u64* list = sc.lists + int64_t{blockIdx.x} * kMaxTopLogprobs;
    block_compact(rank, cut, list);
    for (int j = want + static_cast<int>(threadIdx.x); j < kMaxTopLogprobs; j += kThreads) list[j] = 0;
  }
  allow_dependent_launch();
  if (!arrive_last(&state->s.counters[kLogprobCounter], static_cast<unsigned>(spans))) return;

  best = kNegInf;
  best_id = INT32_MAX;
  for (int b = static_cast<int>(threadIdx.x); b < spans; b += kThreads) {
    keep_better(best, best_id, __ldcg(sc.part_max + b), b);
  }
  block_best(best, best_id);
  double part = 0;
  for (int b = static_cast<int>(threadIdx.x); b < spans; b += kThreads) {
    const float m = __ldcg(sc.part_max + b);
    if (m != kNegInf) part += __ldcg(sc.part_sum + b) * exp(static_cast<double>(m) - static_cast<double>(best));
  }
  const double lse = static_cast<double>(best) + log(block_sum_double(part));
  const int32_t chosen = *token >= 0 && *token < vocab ? *token : 0;  // < vocab by the contract
  if (threadIdx.x == 0) {
    record[TokenRecordLayout::kToken] = *token;
    put_float(record, TokenRecordLayout::kLogprob,
              static_cast<float>(static_cast<double>(sanitize(logits[chosen])) - lse));
    record[TokenRecordLayout::kTopCount] = n;
  }
  for (int j = static_cast<int>(threadIdx.x); j < kMaxTopLogprobs; j += kThreads) {
    record[TokenRecordLayout::kTopIds + j] = 0;
    record[TokenRecordLayout::kTopLogprobs + j] = 0;
  }
  if (n == 0) return;
  // The n largest of all lists, sorted.
  merge_first(sc.lists, spans, kMaxTopLogprobs, n, SpanHeads{sc.part_max, sc.part_arg}, sorted, sh);
  if (static_cast<int>(threadIdx.x) < n) {
    const uint64_t r = sorted[threadIdx.x];
    record[TokenRecordLayout::kTopIds + threadIdx.x] = rank_key_id(r);
    put_float(record, TokenRecordLayout::kTopLogprobs + static_cast<int>(threadIdx.x),
              static_cast<float>(static_cast<double>(key_logit(rank_key_logit_key(r))) - lse));
  }
}

int64_t spans_of(int64_t vocab) { return (vocab + kSpan - 1) / kSpan; }

}  // namespace

size_t sampler_state_bytes() { return sizeof(StateBlock); }

void sample(const float* logits, int64_t vocab, const SamplerBuffers& sampler, int32_t* token_out,
            void* state, Workspace& ws, Stream s) {
  const int64_t G = spans_of(vocab);
  const Scratch sc(ws.get(kWsSampler, Scratch::bytes(vocab, G)), vocab, G);
  const SampleArgs a{logits, reinterpret_cast<const SamplerParams*>(sampler.params), sampler.counts,
                     sampler.prompt_seen, sampler.step, token_out, vocab, static_cast<int32_t>(G)};
  auto* st = static_cast<StateBlock*>(state);
  const auto grid = static_cast<unsigned>(G);
  launch(sample_first_kernel, grid, kThreads, 0, s, a, st, sc);
  launch(sample_second_kernel, grid, kThreads, 0, s, a, st, sc);
  for (int r = 0; r < kRounds; ++r) launch(sample_round_kernel, grid, kThreads, 0, s, a, st, sc);
}

void token_logprobs(const float* logits, int64_t vocab, const int32_t* token, const int32_t* params,
                    int32_t* record, void* state, Workspace& ws, Stream s) {
  const int64_t G = spans_of(vocab);
  const LogprobScratch sc(ws.get(kWsLogprobs, LogprobScratch::bytes(G)), G);
  launch(logprobs_kernel, static_cast<unsigned>(G), kThreads, 0, s, logits, vocab,
         static_cast<int>(G), token, reinterpret_cast<const SamplerParams*>(params), record,
         static_cast<StateBlock*>(state), sc);
}

}  // namespace lily::cuda

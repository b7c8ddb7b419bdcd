// The CPU sampler ops: sample (the stages of sampling.h, exactly), token_logprobs, word reads.

// Every f32 operation here is rounded once, as the contract says: GCC would otherwise fuse
// multiply-adds into FMAs in the x86-64-v3/v4 clones (its C++ default is -ffp-contract=fast,
// even with -std=c++20), and the clones would then differ from the scalar code, the CUDA
// backend and the reference. No trapping math: the loops compute both sides of a comparison
// and select (values are the same; only FP exception flags are left unspecified), which lets
// them vectorise. Before the includes, so that every inline function of this file has the same
// options (GCC does not inline across differing ones). Clang contracts within an expression by
// default (-ffp-contract=on) and already assumes no trapping math; its own pragma turns
// contraction off for every function defined after it.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace lily::cpu {

namespace {

constexpr int64_t kBlock = 64;  // ids per block of SamplerWork::block_max
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kMassBands = kMassBits + 1;  // band b holds q in [2^b, 2^(b+1)); the maximum is in band 40

// Stage 6's q (sampling.h): every path of this file gets its masses here, so the same id
// always has the same q.
inline uint64_t mass_of(float logit, float max, float temperature) {
  return sampler_mass(logit, max, temperature);
}

inline uint64_t rank_of(float logit, int64_t id) {
  return rank_key(logit_key(logit), static_cast<int32_t>(id));
}

inline int mass_band(uint64_t q) { return 63 - __builtin_clzll(q); }  // q > 0

// The block maxima reduce over MaxKey values, whose order is the order of the floats (never
// NaN here). Clang vectorises a float max reduction only when it may assume no NaN and no
// infinity, an integer one always: under clang the key is an int32 (-0 < +0; the map is its own
// inverse). GCC vectorises the float reduction as it is, which is faster there.
#if defined(__clang__)
using MaxKey = int32_t;
inline MaxKey max_key(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits ^ ((bits >> 31) & 0x7FFFFFFF);
}
inline float key_value(MaxKey key) {
  const int32_t bits = key ^ ((key >> 31) & 0x7FFFFFFF);
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
#else
using MaxKey = float;
inline MaxKey max_key(float x) { return x; }
inline float key_value(MaxKey key) { return key; }
#endif

inline float sanitize(float x) {
  x = x != x ? -kInf : x;
  return x > FLT_MAX ? FLT_MAX : x;
}

// Stages 1 and 2 into out [n], sanitised, and the maximum of each block of kBlock ids: f32
// operations in the contract's order (sampling.h). Every candidate value is computed and then
// selected, so that the loop vectorises. (Stage 3 follows in sample_row: sanitising before and
// after a bias in [-100, 100] gives what sanitising after it alone gives.)
LILY_CPU_CLONES void first_pass(const float* logits, const int32_t* counts, const int32_t* seen,
                                int64_t n, float r, float f, float p, float* out,
                                float* block_max, int64_t block_begin, int64_t block_end) {
  const int32_t repeat = r != 1.0f ? 1 : 0;
  for (int64_t b = block_begin; b < block_end; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    MaxKey m = max_key(-kInf);
#pragma omp simd reduction(max : m)
    for (int64_t i = b * kBlock; i < end; ++i) {
      const float l = logits[i];
      const int32_t c = counts[i];
      const float divided = l / r;
      const float multiplied = l * r;
      const float scaled = l > 0.0f ? divided : multiplied;
      const int32_t hit = repeat & ((seen[i] != 0 ? 1 : 0) | (c > 0 ? 1 : 0));
      const float repeated = hit != 0 ? scaled : l;
      const float penalised = repeated - (f * static_cast<float>(c) + p);
      const float x = sanitize(c > 0 ? penalised : repeated);
      out[i] = x;
      const MaxKey k = max_key(x);
      m = k > m ? k : m;
    }
    block_max[b] = key_value(m);
  }
}

// out [n] = sanitised logits, and the maximum of each block of kBlock ids.
LILY_CPU_CLONES void sanitize_blocks(const float* logits, int64_t n, float* out, float* block_max,
                                     int64_t block_begin, int64_t block_end) {
  for (int64_t b = block_begin; b < block_end; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    MaxKey m = max_key(-kInf);
#pragma omp simd reduction(max : m)
    for (int64_t i = b * kBlock; i < end; ++i) {
      const float x = sanitize(logits[i]);
      out[i] = x;
      const MaxKey k = max_key(x);
      m = k > m ? k : m;
    }
    block_max[b] = key_value(m);
  }
}

// The maximum of ids [begin, end).
float range_max(const float* values, int64_t begin, int64_t end) {
  float m = -kInf;
  for (int64_t i = begin; i < end; ++i) m = values[i] > m ? values[i] : m;
  return m;
}

// For blocks [block_begin, block_end): q of every id into mass [n] where the block can hold a
// positive mass (else nothing is written: every q is 0, block_z 0), and per block the sum of
// q (block_z), of the drawable q >= q_min (block_drawable) and the count of q > 0.
LILY_CPU_CLONES void mass_pass(const float* values, int64_t n, const float* block_max, float max,
                               float temperature, uint64_t q_min, uint64_t* mass,
                               uint64_t* block_z, uint64_t* block_drawable,
                               uint64_t* block_positive, int64_t block_begin, int64_t block_end) {
  for (int64_t b = block_begin; b < block_end; ++b) {
    uint64_t z = 0;
    uint64_t drawable = 0;
    uint64_t positive = 0;
    if ((block_max[b] - max) / temperature > kMassCutoff) {
      const int64_t end = std::min(n, (b + 1) * kBlock);
#pragma omp simd reduction(+ : z, drawable, positive)
      for (int64_t i = b * kBlock; i < end; ++i) {
        const uint64_t q = mass_of(values[i], max, temperature);
        mass[i] = q;
        z += q;
        drawable += q >= q_min ? q : 0;
        positive += q > 0 ? 1 : 0;
      }
    }
    block_z[b] = z;
    block_drawable[b] = drawable;
    block_positive[b] = positive;
  }
}

// fn(block_begin, block_end) over [0, blocks): split over the pool's threads for a large
// vocabulary. Every pass writes per id or per block only, so the result does not depend on
// the number of threads.
template <typename Fn>
void for_blocks(ThreadPool* pool, int64_t blocks, const Fn& fn) {
  constexpr int64_t kMinParallelBlocks = 512;  // 32768 ids
  if (pool == nullptr || pool->size() == 1 || blocks < kMinParallelBlocks) {
    fn(int64_t{0}, blocks);
    return;
  }
  pool->parallel_for(blocks, [&](int64_t begin, int64_t end) { fn(begin, end); });
}

// block_sum[b] = sum of e^(x - max) over block b of values [n] (terms with x - max <= -87
// left out: below e^-87), in f32 (at most 64 terms <= 1: within 1e-6 relative).
LILY_CPU_CLONES void exp_sums(const float* values, int64_t n, float max, double* block_sum,
                              int64_t block_begin, int64_t block_end) {
  for (int64_t b = block_begin; b < block_end; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = b * kBlock; i < end; ++i) {
      const float d = values[i] - max;
      const float e = sampler_exp(d);
      sum += d > -87.0f ? e : 0.0f;
    }
    block_sum[b] = static_cast<double>(sum);
  }
}

// The lowest id holding `max` (which some block holds).
int32_t argmax_of(const std::vector<float>& values, const std::vector<float>& block_max, float max) {
  const auto b = static_cast<int64_t>(std::find(block_max.begin(), block_max.end(), max) - block_max.begin());
  const auto* first = values.data() + b * kBlock;
  return static_cast<int32_t>(std::find(first, values.data() + values.size(), max) - values.data());
}

// The rank keys of every id whose value is >= the threshold, from the blocks whose maximum
// reaches it, into items (unsorted). Block maxima are distinct ids, so when `threshold` is the
// n-th largest block maximum at least n ids are collected, and they include the n first ids of
// stage 5's order.
void collect_at_least(const std::vector<float>& values, const std::vector<float>& block_max,
                      float threshold, std::vector<uint64_t>& items) {
  items.clear();
  const auto n = static_cast<int64_t>(values.size());
  for (size_t b = 0; b < block_max.size(); ++b) {
    if (!(block_max[b] >= threshold)) continue;
    const int64_t end = std::min(n, static_cast<int64_t>(b + 1) * kBlock);
    for (int64_t i = static_cast<int64_t>(b) * kBlock; i < end; ++i) {
      if (values[static_cast<size_t>(i)] >= threshold) {
        items.push_back(rank_of(values[static_cast<size_t>(i)], i));
      }
    }
  }
}

// The first `count` ids of stage 5's order, as rank keys sorted descending (count <= vocab).
void top_ranks(SamplerWork& work, int64_t count) {
  float threshold = -kInf;
  const auto blocks = static_cast<int64_t>(work.block_max.size());
  if (count <= blocks) {
    // An index loop, not assign(): GCC 13 -O3 sees a null destination in vector::assign's
    // reallocation path and raises a false -Wnull-dereference.
    const size_t m = work.block_max.size();
    work.order_scratch.resize(m);
    for (size_t i = 0; i < m; ++i) work.order_scratch[i] = work.block_max[i];
    std::nth_element(work.order_scratch.begin(), work.order_scratch.begin() + (count - 1),
                     work.order_scratch.end(), std::greater<float>());
    threshold = work.order_scratch[static_cast<size_t>(count - 1)];
  }
  collect_at_least(work.processed, work.block_max, threshold, work.items);
  std::sort(work.items.begin(), work.items.end(), std::greater<uint64_t>());
  work.items.resize(static_cast<size_t>(count));
}

// The rank key of the first item of stage 5's order (rank keys descending) at which the running
// weight reaches `target`: a radix select over 11-bit digits of the 56-bit keys, each level
// keeping only the digit that holds the crossing. items (distinct) and weights (nullptr: all
// 1) are consumed; a target beyond the total weight selects the last item with a weight, and
// no weight at all gives 0.
uint64_t select_rank(std::vector<uint64_t>& items, std::vector<uint64_t>* weights, uint64_t target,
                     SamplerWork& work) {
  constexpr int kDigitBits = 11;
  constexpr size_t kBins = size_t{1} << kDigitBits;
  uint64_t total = 0;
  for (size_t j = 0; j < items.size(); ++j) total += weights != nullptr ? (*weights)[j] : 1;
  if (total == 0) return 0;
  uint64_t remaining = std::min(std::max<uint64_t>(target, 1), total);  // now a crossing exists
  std::vector<uint64_t>& next = work.items_b;
  std::vector<uint64_t>& next_w = work.item_mass_b;
  uint64_t hist[kBins];
  for (int shift = 56 - kDigitBits; shift >= 0 && items.size() > 64; shift -= kDigitBits) {
    std::fill(hist, hist + kBins, 0);
    for (size_t j = 0; j < items.size(); ++j) {
      hist[(items[j] >> shift) & (kBins - 1)] += weights != nullptr ? (*weights)[j] : 1;
    }
    size_t digit = kBins;
    uint64_t above = 0;
    while (digit > 0) {
      --digit;
      if (above + hist[digit] >= remaining) break;
      above += hist[digit];
    }
    remaining -= above;
    next.clear();
    next_w.clear();
    for (size_t j = 0; j < items.size(); ++j) {
      if (((items[j] >> shift) & (kBins - 1)) == digit) {
        next.push_back(items[j]);
        if (weights != nullptr) next_w.push_back((*weights)[j]);
      }
    }
    items.swap(next);
    if (weights != nullptr) weights->swap(next_w);
  }
  // At most 64 items left (or keys that differ in fewer than 11 bits): sort them.
  std::vector<size_t> order(items.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return items[a] > items[b]; });
  uint64_t running = 0;
  for (size_t j : order) {
    running += weights != nullptr ? (*weights)[j] : 1;
    if (running >= remaining) return items[j];
  }
  return items[order.back()];
}

// Stage 9 over the survivors (id, q), listed in id order by for_each_survivor: the first whose
// running mass exceeds the draw target. The maximum is always a survivor, so Zs >= 2^40.
template <typename ForEach>
int32_t draw(uint32_t u24, const ForEach& for_each_survivor) {
  uint64_t total = 0;
  for_each_survivor([&](int64_t, uint64_t q) {
    total += q;
    return false;
  });
  const uint64_t target = draw_target(u24, total);
  uint64_t running = 0;
  int64_t token = -1;
  for_each_survivor([&](int64_t id, uint64_t q) {
    running += q;
    if (running > target) {
      token = id;
      return true;
    }
    return false;
  });
  return static_cast<int32_t>(token);
}

// Stages 7-9 over stage 5's first ids (rank keys sorted descending, masses alongside, `z` the
// mass of stage 5's survivors): the token, or -1 when the top_p cut lies beyond the list.
int32_t draw_from_list(const std::vector<uint64_t>& ranks, const std::vector<uint64_t>& mass,
                       uint64_t z, const SamplerParams& params, uint64_t q_min, uint32_t u24,
                       SamplerWork& work, SamplerTrace& t, bool want_trace) {
  size_t kept = ranks.size();
  if (params.top_p < 1.0f) {
    const uint64_t threshold = top_p_threshold(params.top_p, z);
    uint64_t running = 0;
    kept = 0;
    for (size_t c = 0; c < ranks.size(); ++c) {
      running += mass[c];
      if (running >= threshold) {
        kept = c + 1;
        break;
      }
    }
    if (kept == 0) return -1;
  }
  t.cut = ranks[kept - 1];
  t.z = z;
  work.picked.clear();
  for (size_t j = 0; j < kept; ++j) {
    if (mass[j] >= q_min) work.picked.emplace_back(rank_key_id(ranks[j]), mass[j]);
  }
  std::sort(work.picked.begin(), work.picked.end());  // by id
  const auto for_each = [&](const auto& fn) {
    for (const auto& [id, q] : work.picked) {
      if (fn(int64_t{id}, q)) return;
    }
  };
  if (want_trace) {
    for_each([&](int64_t id, uint64_t q) {
      t.survivors.push_back(static_cast<int32_t>(id));
      t.masses.push_back(q);
      return false;
    });
  }
  return draw(u24, for_each);
}

}  // namespace

int32_t sample_row(const float* logits, int64_t vocab, const SamplerParams& params,
                   const int32_t* counts, const int32_t* prompt_seen, uint32_t step,
                   SamplerWork& work, SamplerTrace* trace, SamplerPath path, ThreadPool* pool) {
  const auto V = static_cast<size_t>(vocab);
  const size_t blocks = (V + kBlock - 1) / kBlock;
  work.processed.resize(V);
  work.block_max.resize(blocks);
  float* P = work.processed.data();
  // Stages 1-3 and the block maxima (the biased ids' blocks again afterwards).
  for_blocks(pool, static_cast<int64_t>(blocks), [&](int64_t begin, int64_t end) {
    first_pass(logits, counts, prompt_seen, vocab, params.repetition_penalty,
               params.frequency_penalty, params.presence_penalty, P, work.block_max.data(), begin,
               end);
  });
  for (int32_t j = 0; j < params.bias_count; ++j) {
    const auto id = static_cast<size_t>(params.bias_ids[static_cast<size_t>(j)]);
    P[id] = sanitize(P[id] + params.bias_values[static_cast<size_t>(j)]);
  }
  for (int32_t j = 0; j < params.bias_count; ++j) {
    const auto b = static_cast<int64_t>(params.bias_ids[static_cast<size_t>(j)]) / kBlock;
    work.block_max[static_cast<size_t>(b)] = range_max(P, b * kBlock, std::min(vocab, (b + 1) * kBlock));
  }
  const float max = *std::max_element(work.block_max.begin(), work.block_max.end());
  SamplerTrace local;
  SamplerTrace& t = trace != nullptr ? *trace : local;
  t = SamplerTrace{};
  const bool want_trace = trace != nullptr;

  // Stage 4.
  if (params.temperature == 0.0f || max == -kInf) {
    t.greedy = true;
    t.token = argmax_of(work.processed, work.block_max, max);
    return t.token;
  }
  const float T = params.temperature;
  const int64_t k = params.top_k <= 0 || params.top_k >= vocab ? vocab : params.top_k;
  const uint64_t q_min = std::max<uint64_t>(min_p_threshold(params.min_p), 1);  // q = 0: never drawn
  const uint32_t u24 = sampler_u24(params.seed_lo, params.seed_hi, step);

  if (k < vocab && k <= kSamplerSmallK && path == SamplerPath::automatic) {
    // The top-k path: stage 5's k first ids from the blocks whose maximum reaches the k-th
    // largest block maximum, sorted; masses for those k only.
    t.fast_path = true;
    top_ranks(work, k);
    work.item_mass.resize(static_cast<size_t>(k));
    uint64_t z = 0;
    for (size_t j = 0; j < static_cast<size_t>(k); ++j) {
      work.item_mass[j] = mass_of(P[rank_key_id(work.items[j])], max, T);
      z += work.item_mass[j];
    }
    t.token = draw_from_list(work.items, work.item_mass, z, params, q_min, u24, work, t, want_trace);
    return t.token;
  }

  // The general path. Masses for every id of the blocks that can hold one (the others are 0),
  // with each block's drawable mass.
  work.mass.resize(V);
  work.block_z.resize(blocks);
  work.block_drawable.resize(blocks);
  work.block_positive.resize(blocks);
  for_blocks(pool, static_cast<int64_t>(blocks), [&](int64_t begin, int64_t end) {
    mass_pass(P, vocab, work.block_max.data(), max, T, q_min, work.mass.data(),
              work.block_z.data(), work.block_drawable.data(), work.block_positive.data(), begin,
              end);
  });
  // The candidate blocks (a positive mass), in id order, with their drawable mass.
  work.blocks.clear();
  work.block_sums.clear();
  uint64_t z_all = 0;
  uint64_t positive = 0;
  for (size_t b = 0; b < blocks; ++b) {
    if (work.block_positive[b] == 0) continue;
    work.blocks.push_back(static_cast<int32_t>(b));
    work.block_sums.push_back(work.block_drawable[b]);
    z_all += work.block_z[b];
    positive += work.block_positive[b];
  }
  const auto block_range = [&](int32_t b) {
    const int64_t begin = int64_t{b} * kBlock;
    return std::pair<int64_t, int64_t>{begin, std::min(vocab, begin + kBlock)};
  };
  const bool k_cuts = static_cast<uint64_t>(k) < positive;  // beyond them every q is 0

  if (!k_cuts && params.top_p >= 1.0f) {
    // No cut: the draw's block from the block sums, then its ids.
    uint64_t total = 0;
    for (uint64_t s : work.block_sums) total += s;
    const uint64_t target = draw_target(u24, total);
    uint64_t running = 0;
    t.z = z_all;
    if (want_trace) {
      for (int32_t b : work.blocks) {
        const auto [begin, end] = block_range(b);
        for (int64_t i = begin; i < end; ++i) {
          if (work.mass[static_cast<size_t>(i)] >= q_min) {
            t.survivors.push_back(static_cast<int32_t>(i));
            t.masses.push_back(work.mass[static_cast<size_t>(i)]);
          }
        }
      }
    }
    for (size_t j = 0; j < work.blocks.size(); ++j) {
      if (running + work.block_sums[j] <= target) {
        running += work.block_sums[j];
        continue;
      }
      const auto [begin, end] = block_range(work.blocks[j]);
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t q = work.mass[static_cast<size_t>(i)];
        if (q < q_min) continue;
        running += q;
        if (running > target) {
          t.token = static_cast<int32_t>(i);
          return t.token;
        }
      }
    }
    t.token = argmax_of(work.processed, work.block_max, max);  // not reached: target < total
    return t.token;
  }

  // top_p without a top_k cut: first among stage 5's kSamplerList first ids.
  if (!k_cuts && path != SamplerPath::bands) {
    const int64_t n = std::min(vocab, kSamplerList);
    top_ranks(work, n);
    work.item_mass.resize(static_cast<size_t>(n));
    for (size_t j = 0; j < static_cast<size_t>(n); ++j) {
      work.item_mass[j] = mass_of(P[rank_key_id(work.items[j])], max, T);
    }
    const int32_t token =
        draw_from_list(work.items, work.item_mass, z_all, params, q_min, u24, work, t, want_trace);
    if (token >= 0) {
      t.list_cut = true;
      t.token = token;
      return token;
    }
  }

  // Selections over mass bands (powers of two): a band's ids form one stretch of stage 5's
  // order (q does not increase along it), so a cut lies in one band, whose ids are gathered.
  // The passes split the candidate blocks over the pool; their results are integer sums and
  // sets (select_rank does not depend on the order of its items), so they do not depend on it.
  const auto candidate_count = static_cast<int64_t>(work.blocks.size());
  std::mutex merge;
  uint64_t band_count[kMassBands] = {};
  uint64_t band_mass[kMassBands] = {};
  for_blocks(pool, candidate_count, [&](int64_t from, int64_t to) {
    uint64_t count[kMassBands] = {};
    uint64_t mass[kMassBands] = {};
    for (int64_t j = from; j < to; ++j) {
      const auto [begin, end] = block_range(work.blocks[static_cast<size_t>(j)]);
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t q = work.mass[static_cast<size_t>(i)];
        if (q > 0) {
          ++count[mass_band(q)];
          mass[mass_band(q)] += q;
        }
      }
    }
    const std::lock_guard<std::mutex> lock(merge);
    for (int b = 0; b < kMassBands; ++b) {
      band_count[b] += count[b];
      band_mass[b] += mass[b];
    }
  });
  // The rank keys and masses of band `band`'s ids ranking at or before `limit` (0: all).
  const auto gather_band = [&](int band, uint64_t limit) {
    work.items.clear();
    work.item_mass.clear();
    for_blocks(pool, candidate_count, [&](int64_t from, int64_t to) {
      std::vector<uint64_t> ranks;
      std::vector<uint64_t> masses;
      for (int64_t j = from; j < to; ++j) {
        const auto [begin, end] = block_range(work.blocks[static_cast<size_t>(j)]);
        for (int64_t i = begin; i < end; ++i) {
          const uint64_t q = work.mass[static_cast<size_t>(i)];
          if (q == 0 || mass_band(q) != band) continue;
          const uint64_t rank = rank_of(P[i], i);
          if (limit == 0 || rank >= limit) {
            ranks.push_back(rank);
            masses.push_back(q);
          }
        }
      }
      const std::lock_guard<std::mutex> lock(merge);
      work.items.insert(work.items.end(), ranks.begin(), ranks.end());
      work.item_mass.insert(work.item_mass.end(), masses.begin(), masses.end());
    });
  };
  uint64_t cut = 0;
  uint64_t z = z_all;
  int k_band = -1;
  uint64_t k_band_kept_mass = 0;  // mass of k_band's ids at or before the cut
  if (k_cuts) {
    // Stage 5: the k-th id of the order.
    uint64_t above_count = 0;
    uint64_t above_mass = 0;
    int band = kMassBands - 1;
    while (above_count + band_count[band] < static_cast<uint64_t>(k)) {
      above_count += band_count[band];
      above_mass += band_mass[band];
      --band;
    }
    gather_band(band, 0);
    std::vector<uint64_t> ranks = work.items;
    cut = select_rank(ranks, nullptr, static_cast<uint64_t>(k) - above_count, work);
    for (size_t j = 0; j < work.items.size(); ++j) {
      if (work.items[j] >= cut) k_band_kept_mass += work.item_mass[j];
    }
    k_band = band;
    z = above_mass + k_band_kept_mass;
  }
  if (params.top_p < 1.0f) {
    // Stage 7 among stage 5's survivors (the bands above k_band, part of k_band).
    const uint64_t threshold = top_p_threshold(params.top_p, z);
    uint64_t above = 0;
    int band = kMassBands - 1;
    for (;; --band) {
      const uint64_t here = band == k_band ? k_band_kept_mass : band_mass[band];
      if (above + here >= threshold || band == 0 || band == k_band) break;
      above += here;
    }
    gather_band(band, cut);
    cut = select_rank(work.items, &work.item_mass, threshold - above, work);
  }
  t.cut = cut;
  t.z = z;
  // Stages 8 and 9: the survivors rank at or before the cut, so only blocks whose maximum
  // reaches the cut's logit hold any. Each candidate block's drawable mass (in parallel), the
  // draw's block from those, then its ids.
  const float cut_logit = key_logit(rank_key_logit_key(cut));
  const auto survives = [&](int64_t i) {
    const uint64_t q = work.mass[static_cast<size_t>(i)];
    return q >= q_min && P[i] >= cut_logit && rank_of(P[i], i) >= cut;
  };
  for_blocks(pool, candidate_count, [&](int64_t from, int64_t to) {
    for (int64_t j = from; j < to; ++j) {
      const int32_t b = work.blocks[static_cast<size_t>(j)];
      uint64_t sum = 0;
      if (!(work.block_max[static_cast<size_t>(b)] < cut_logit)) {
        const auto [begin, end] = block_range(b);
        for (int64_t i = begin; i < end; ++i) sum += survives(i) ? work.mass[static_cast<size_t>(i)] : 0;
      }
      work.block_sums[static_cast<size_t>(j)] = sum;
    }
  });
  if (want_trace) {
    for (int32_t b : work.blocks) {
      const auto [begin, end] = block_range(b);
      for (int64_t i = begin; i < end; ++i) {
        if (survives(i)) {
          t.survivors.push_back(static_cast<int32_t>(i));
          t.masses.push_back(work.mass[static_cast<size_t>(i)]);
        }
      }
    }
  }
  uint64_t total = 0;
  for (uint64_t s : work.block_sums) total += s;
  const uint64_t target = draw_target(u24, total);
  uint64_t running = 0;
  for (size_t j = 0; j < work.blocks.size(); ++j) {
    if (running + work.block_sums[j] <= target) {
      running += work.block_sums[j];
      continue;
    }
    const auto [begin, end] = block_range(work.blocks[j]);
    for (int64_t i = begin; i < end; ++i) {
      if (!survives(i)) continue;
      running += work.mass[static_cast<size_t>(i)];
      if (running > target) {
        t.token = static_cast<int32_t>(i);
        return t.token;
      }
    }
  }
  t.token = argmax_of(work.processed, work.block_max, max);  // not reached: target < total
  return t.token;
}

void token_logprobs_row(const float* logits, int64_t vocab, int32_t token, int top_n,
                        SamplerWork& work, int32_t* record, ThreadPool* pool) {
  const auto V = static_cast<size_t>(vocab);
  const size_t blocks = (V + kBlock - 1) / kBlock;
  work.processed.resize(V);
  work.block_max.resize(blocks);
  work.block_exp.resize(blocks);
  float* l = work.processed.data();
  for_blocks(pool, static_cast<int64_t>(blocks), [&](int64_t begin, int64_t end) {
    sanitize_blocks(logits, vocab, l, work.block_max.data(), begin, end);
  });
  const float max = *std::max_element(work.block_max.begin(), work.block_max.end());
  for_blocks(pool, static_cast<int64_t>(blocks), [&](int64_t begin, int64_t end) {
    exp_sums(l, vocab, max, work.block_exp.data(), begin, end);
  });
  double sum = 0;
  for (double s : work.block_exp) sum += s;  // in block order
  const double lse = static_cast<double>(max) + std::log(sum);
  const auto put_float = [&](int at, double value) {
    const auto f = static_cast<float>(value);
    std::memcpy(record + at, &f, sizeof f);
  };
  std::fill(record, record + TokenRecordLayout::kWords, 0);
  record[TokenRecordLayout::kToken] = token;
  put_float(TokenRecordLayout::kLogprob, static_cast<double>(l[static_cast<size_t>(token)]) - lse);
  const int n = static_cast<int>(std::min<int64_t>(top_n, vocab));
  record[TokenRecordLayout::kTopCount] = n;
  if (n == 0) return;
  top_ranks(work, n);
  for (int j = 0; j < n; ++j) {
    const int32_t id = rank_key_id(work.items[static_cast<size_t>(j)]);
    record[TokenRecordLayout::kTopIds + j] = id;
    put_float(TokenRecordLayout::kTopLogprobs + j, static_cast<double>(l[static_cast<size_t>(id)]) - lse);
  }
}

}  // namespace lily::cpu

namespace lily {

void CpuBackend::sample(const float* logits, int64_t vocab, const SamplerBuffers& sampler,
                        int32_t* token_out) {
  cpu::require(logits != nullptr && token_out != nullptr && sampler.params != nullptr &&
                   sampler.counts != nullptr && sampler.prompt_seen != nullptr &&
                   sampler.step != nullptr,
               "sample", "needs logits, token_out and the four sampler buffers");
  SamplerParams params;
  std::memcpy(static_cast<void*>(&params), sampler.params, sizeof params);  // the words as the struct
  const std::string error = sampler_params_error(params, vocab);
  cpu::require(error.empty(), "sample", error);
  const int32_t token =
      cpu::sample_row(logits, vocab, params, sampler.counts, sampler.prompt_seen,
                      static_cast<uint32_t>(*sampler.step), sampler_work_, nullptr,
                      cpu::SamplerPath::automatic, &pool_);
  sampler.counts[token] += 1;
  *sampler.step = static_cast<int32_t>(static_cast<uint32_t>(*sampler.step) + 1u);
  *token_out = token;
}

void CpuBackend::token_logprobs(const float* logits, int64_t vocab, const int32_t* token,
                                const SamplerBuffers& sampler, int32_t* record) {
  cpu::require(logits != nullptr && token != nullptr && sampler.params != nullptr &&
                   record != nullptr,
               "token_logprobs", "needs logits, token, sampler.params and record");
  cpu::require(vocab >= 1 && vocab <= kMaxSamplerVocab, "token_logprobs",
               "vocab must be in [1, " + std::to_string(kMaxSamplerVocab) + "]");
  cpu::require(*token >= 0 && *token < vocab, "token_logprobs",
               "token " + std::to_string(*token) + " is outside [0, " + std::to_string(vocab) + ")");
  SamplerParams params;
  std::memcpy(static_cast<void*>(&params), sampler.params, sizeof params);
  cpu::require(params.top_logprobs >= -1 && params.top_logprobs <= kMaxTopLogprobs,
               "token_logprobs", "top_logprobs must be in [-1, 20]");
  cpu::token_logprobs_row(logits, vocab, *token, std::max(params.top_logprobs, 0), sampler_work_,
                          record, &pool_);
}

void CpuBackend::read_words_async(const int32_t* src, int64_t count, int slot) {
  cpu::require(slot == 0 || slot == 1, "read_words_async", "slot must be 0 or 1");
  cpu::require(src != nullptr && count >= 1 && count <= TokenRecordLayout::kWords,
               "read_words_async", "needs a source and 1..43 words");
  std::copy(src, src + count, word_reads_[slot]);
}

const int32_t* CpuBackend::wait_read_words(int slot) {
  cpu::require(slot == 0 || slot == 1, "wait_read_words", "slot must be 0 or 1");
  return word_reads_[slot];
}

}  // namespace lily

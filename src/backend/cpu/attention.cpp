// CPU gated full attention: q/k zero-centred norm, partial NeoX RoPE, KV cache (f32, bf16 or int8), causal softmax.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/op_contract.h"
#include "core/bf16.h"

namespace lily {

namespace {

void norm_in_place(float* x, const DenseView& gain, int64_t dim, float eps) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < dim; ++i) sum_sq += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) x[i] = x[i] * inv * cpu::dense_value(gain, i);
}

// Rotate-half RoPE over the first `rotary` dims: pairs (i, i + rotary/2). The angle is formed
// in f32 (inv_freq * position) exactly as transformers does, then its cos/sin are exact.
void rope_in_place(float* x, const float* cos_table, const float* sin_table, int64_t rotary) {
  const int64_t half = rotary / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i];
    const float b = x[i + half];
    x[i] = a * cos_table[i] - b * sin_table[i];
    x[i + half] = b * cos_table[i] + a * sin_table[i];
  }
}

void rope_tables(const AttentionDims& dims, int64_t position, float* cos_table, float* sin_table) {
  const int64_t half = dims.rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dims.rotary_dim);
    const float inv_freq = 1.0f / std::pow(static_cast<float>(dims.rope_theta), exponent);
    const float angle = inv_freq * static_cast<float>(position);
    cos_table[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    sin_table[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
}

// The CPU's memory is the host's, so a device position is read directly, and checked as the
// contract checks a host position (op_contract.cpp).
int64_t resolve_position(SeqPos pos, const char* op) {
  if (pos.device == nullptr) return pos.host;
  const int64_t position = *pos.device;
  cpu::require(position >= 0, op, "the device position is " + std::to_string(position) + ", expected >= 0");
  return position;
}

// Values per tile of the weighted sum (one axpy_rows_heads call), and the most query heads one
// item serves.
constexpr int64_t kTile = 8;
constexpr int64_t kMaxGroup = 16;
// Tokens per item of the prefill, and keys (values) per block that the item's tokens share:
// a block (64 KB of f32 at head_dim 256) comes from memory once and from L2 for the other
// tokens, and a bf16 or int8 block is widened once for all of them. attention_bench, the
// prefill chunk of 256 at 4,096 on 2 Zen 4 threads, best of 7, runs alternating: one token an
// item f32 242-357 ms, bf16 250-360, int8 246-250; 8 tokens 225-275, 213-223, 210-226 (4
// tokens: 239-265, 232-270, 219-245). The dot loop's stalls were on its key loads.
constexpr int64_t kItemTokens = 8;
constexpr int64_t kBlock = 64;
static_assert(kBlock % kTile == 0 && kBlock % 2 == 0, "blocks start at tile and key-pair starts");

// dst[i] = the bf16 nearest src[i] (ties to even: core/bf16.h, the bits CUDA stores).
LILY_CPU_CLONES void round_rows_to_bf16(const float* src, int64_t count, uint16_t* dst) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) dst[i] = f32_to_bf16(src[i]);
}

// `count` rows of `width` bf16 values, `stride` apart in src, widened (exactly) into dst
// [count, width] f32. Defined and called in this file: a target_clones function called from
// another file gets a resolver there that may not find the clones at link time.
LILY_CPU_CLONES void widen_rows_from_bf16(const uint16_t* src, int64_t count, int64_t width,
                                          int64_t stride, float* dst) {
  for (int64_t r = 0; r < count; ++r) {
    const uint16_t* in = src + r * stride;
    float* o = dst + r * width;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) o[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
  }
}

// `count` rows of `width` int8 codes, `stride` apart in codes, each times its own scale
// (scales[r]), into dst [count, width] f32: the values an int8 cache holds.
LILY_CPU_CLONES void widen_rows_from_int8(const int8_t* codes, const float* scales, int64_t count,
                                          int64_t width, int64_t stride, int64_t scale_stride, float* dst) {
  for (int64_t r = 0; r < count; ++r) {
    const int8_t* in = codes + r * stride;
    const float s = scales[r * scale_stride];
    float* o = dst + r * width;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) o[i] = static_cast<float>(in[i]) * s;
  }
}

}  // namespace

void CpuBackend::attention_prepare(float* qg, float* k, const DenseView& q_norm,
                                   const DenseView& k_norm, const AttentionDims& dims,
                                   SeqPos pos, int64_t n, float eps) {
  contract::check_attention_prepare(qg, k, q_norm, k_norm, dims, pos, n);
  const int64_t start_pos = resolve_position(pos, "attention_prepare");
  const int64_t D = dims.head_dim;
  pool_.parallel_for(n, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> cos_table, sin_table;
    cos_table.resize(static_cast<size_t>(dims.rotary_dim / 2));
    sin_table.resize(cos_table.size());
    for (int64_t t = begin; t < end; ++t) {
      rope_tables(dims, start_pos + t, cos_table.data(), sin_table.data());
      for (int64_t h = 0; h < dims.q_heads; ++h) {
        float* q = qg + (t * dims.q_heads + h) * 2 * D;  // query half; the gate follows it
        norm_in_place(q, q_norm, D, eps);
        rope_in_place(q, cos_table.data(), sin_table.data(), dims.rotary_dim);
      }
      for (int64_t h = 0; h < dims.kv_heads; ++h) {
        float* kh = k + (t * dims.kv_heads + h) * D;
        norm_in_place(kh, k_norm, D, eps);
        rope_in_place(kh, cos_table.data(), sin_table.data(), dims.rotary_dim);
      }
    }
  });
}

void CpuBackend::attention(const float* qg, const float* k, const float* v, KvCacheView k_view,
                           KvCacheView v_view, int64_t capacity, const AttentionDims& dims,
                           SeqPos pos, int64_t n, float* out) {
  contract::check_attention(qg, k, v, k_view, v_view, capacity, dims, pos, n, out);
  const int64_t start_pos = resolve_position(pos, "attention");
  cpu::require(start_pos + n <= capacity, "attention",
               "the device position + n is " + std::to_string(start_pos + n) +
                   ", expected at most the KV cache capacity " + std::to_string(capacity));
  const KvDtype dtype = k_view.dtype;
  const int64_t D = dims.head_dim;
  const int64_t row = dims.kv_heads * D;
  // This step's rows into the cache: copied (f32), rounded to nearest-even (bf16) or quantised
  // per (token, kv head) row (int8), which every read below then sees, the new rows' own
  // queries included.
  if (dtype == KvDtype::bf16) {
    uint16_t* k_bits = k_view.bf16_bits();
    uint16_t* v_bits = v_view.bf16_bits();
    round_rows_to_bf16(k, n * row, k_bits + start_pos * row);
    round_rows_to_bf16(v, n * row, v_bits + start_pos * row);
  } else if (dtype == KvDtype::int8) {
    for (int64_t r = 0; r < n * dims.kv_heads; ++r) {
      const int64_t at = start_pos * dims.kv_heads + r;  // (token, kv head) row of the cache
      k_view.int8_scales()[at] = quantize_kv_row(k + r * D, D, k_view.int8_codes() + at * D);
      v_view.int8_scales()[at] = quantize_kv_row(v + r * D, D, v_view.int8_codes() + at * D);
    }
  } else {
    float* k_cache = k_view.f32();
    float* v_cache = v_view.f32();
    for (int64_t t = 0; t < n; ++t) {
      std::copy(k + t * row, k + (t + 1) * row, k_cache + (start_pos + t) * row);
      std::copy(v + t * row, v + (t + 1) * row, v_cache + (start_pos + t) * row);
    }
  }
  const int64_t group = dims.q_heads / dims.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // One item is `heads` query heads of one kv head (a divisor of the group) for up to
  // kItemTokens consecutive tokens: they read each block of kBlock keys or values from memory
  // once (a bf16 or int8 block widened once into f32 for all of them) and from L2 for the
  // others, instead of once per (token, head). `heads` is as large as leaves an item per thread.
  const int64_t item_tokens = std::min(kItemTokens, n);
  const int64_t token_groups = (n + item_tokens - 1) / item_tokens;
  int64_t heads = std::min(group, kMaxGroup);
  while (group % heads != 0) --heads;
  while (heads > 1 && token_groups * dims.q_heads / heads < threads()) {
    --heads;
    while (group % heads != 0) --heads;
  }
  const int64_t chunks = group / heads;  // items per (token group, kv head)
  const int64_t per_slot = dims.kv_heads * chunks;
  // The pool hands each thread one contiguous range of items, and a causal token's work grows
  // with its position: items walk the token groups from both ends (0, last, 1, last - 1, ...)
  // so every range holds as many long rows as short ones. Each (token, head) is computed alone:
  // the same calls on the same keys in the same order (keys in pairs from key 0, values in
  // tiles of kTile) whatever the grouping of tokens or heads, so neither changes a bit.
  pool_.parallel_for(token_groups * per_slot, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;  // [item_tokens, heads, start_pos + n]
    thread_local std::vector<float> block;   // bf16, int8: one block widened, [kBlock, head_dim]
    const auto stride = static_cast<size_t>(start_pos + n);
    const auto token_stride = static_cast<size_t>(heads) * stride;
    if (scores.size() < static_cast<size_t>(item_tokens) * token_stride) {
      scores.resize(static_cast<size_t>(item_tokens) * token_stride);
    }
    if (dtype != KvDtype::f32 && block.size() < static_cast<size_t>(kBlock * D)) {
      block.resize(static_cast<size_t>(kBlock * D));
    }
    // Rows j0..j0+count-1 of kv head kvh of a cache, as f32: row i at the result + i * *step.
    const auto rows = [&](const KvCacheView& cache, int64_t kvh, int64_t j0, int64_t count,
                          int64_t* step) -> const float* {
      if (dtype == KvDtype::f32) {
        *step = row;
        return cache.f32() + j0 * row + kvh * D;
      }
      *step = D;
      if (dtype == KvDtype::int8) {
        widen_rows_from_int8(cache.int8_codes() + j0 * row + kvh * D,
                             cache.int8_scales() + j0 * dims.kv_heads + kvh, count, D, row,
                             dims.kv_heads, block.data());
      } else {
        widen_rows_from_bf16(cache.bf16_bits() + j0 * row + kvh * D, count, D, row, block.data());
      }
      return block.data();
    };
    for (int64_t item = begin; item < end; ++item) {
      const int64_t slot = item / per_slot;
      const int64_t tg = slot % 2 == 0 ? slot / 2 : token_groups - 1 - slot / 2;
      const int64_t t_begin = tg * item_tokens;
      const int64_t t_end = std::min(n, t_begin + item_tokens);
      const int64_t kvh = item % per_slot / chunks;
      const int64_t h0 = kvh * group + item % chunks * heads;  // query heads h0..h0+heads-1
      const int64_t group_last = start_pos + t_end - 1;        // the item's last key
      float max[kItemTokens][kMaxGroup];
      float total[kItemTokens][kMaxGroup];
      for (int64_t t = t_begin; t < t_end; ++t) {
        for (int64_t g = 0; g < heads; ++g) max[t - t_begin][g] = -INFINITY;
      }
      for (int64_t b0 = 0; b0 <= group_last; b0 += kBlock) {
        const int64_t block_count = std::min(kBlock, group_last + 1 - b0);
        int64_t step = 0;
        const float* keys = rows(k_view, kvh, b0, block_count, &step);
        for (int64_t t = t_begin; t < t_end; ++t) {
          const int64_t last = start_pos + t;  // causal: keys 0..last
          float* token_scores = scores.data() + static_cast<size_t>(t - t_begin) * token_stride;
          float* token_max = max[t - t_begin];
          const float* q = qg + (t * dims.q_heads + h0) * 2 * D;  // head g at q + g * 2D
          const auto record = [&](int64_t j, const float* dots) {
            for (int64_t g = 0; g < heads; ++g) {
              float* s = token_scores + static_cast<size_t>(g) * stride;
              s[j] = dots[g] * scale;
              token_max[g] = std::max(token_max[g], s[j]);
            }
          };
          // Keys in pairs from the block's start (a multiple of kBlock, so of 2): the same pairs
          // as one token alone, each query chunk loaded once for two; a lone last key alone.
          const int64_t j_end = std::min(last + 1, b0 + block_count);
          int64_t j = b0;
          for (; j + 1 < j_end; j += 2) {
            float dots0[kMaxGroup], dots1[kMaxGroup];
            cpu::dot_heads_pair(q, 2 * D, heads, keys + (j - b0) * step, keys + (j + 1 - b0) * step,
                                D, dots0, dots1);
            record(j, dots0);
            record(j + 1, dots1);
          }
          if (j < j_end) {
            float dots[kMaxGroup];
            cpu::dot_heads(q, 2 * D, heads, keys + (j - b0) * step, D, dots);
            record(j, dots);
          }
        }
      }
      for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t last = start_pos + t;
        for (int64_t g = 0; g < heads; ++g) {
          float* s = scores.data() + static_cast<size_t>(t - t_begin) * token_stride +
                     static_cast<size_t>(g) * stride;
          float& sum = total[t - t_begin][g];
          sum = 0.0f;
          for (int64_t j = 0; j <= last; ++j) {
            s[j] = std::exp(s[j] - max[t - t_begin][g]);
            sum += s[j];
          }
          float* o = out + (t * dims.q_heads + h0 + g) * D;
          std::fill(o, o + D, 0.0f);
        }
      }
      for (int64_t b0 = 0; b0 <= group_last; b0 += kBlock) {
        const int64_t block_count = std::min(kBlock, group_last + 1 - b0);
        int64_t step = 0;
        const float* values = rows(v_view, kvh, b0, block_count, &step);
        for (int64_t t = t_begin; t < t_end; ++t) {
          const int64_t last = start_pos + t;
          const float* token_scores =
              scores.data() + static_cast<size_t>(t - t_begin) * token_stride;
          for (int64_t j0 = b0; j0 < b0 + block_count && j0 <= last; j0 += kTile) {
            const int64_t count = std::min(kTile, last + 1 - j0);
            float weights[kMaxGroup][kTile];  // head g's softmax weights of this tile's values
            for (int64_t g = 0; g < heads; ++g) {
              const float* s = token_scores + static_cast<size_t>(g) * stride;
              for (int64_t j = j0; j < j0 + count; ++j)
                weights[g][j - j0] = s[j] / total[t - t_begin][g];
            }
            // Every head of the group over the tile at once: each value row loaded once for all.
            cpu::axpy_rows_heads(&weights[0][0], kTile, heads, count, values + (j0 - b0) * step,
                                 step, out + (t * dims.q_heads + h0) * D, D, D);
          }
        }
      }
      for (int64_t t = t_begin; t < t_end; ++t) {
        for (int64_t g = 0; g < heads; ++g) {
          const float* gate = qg + (t * dims.q_heads + h0 + g) * 2 * D + D;
          float* o = out + (t * dims.q_heads + h0 + g) * D;
          for (int64_t i = 0; i < D; ++i) o[i] *= cpu::sigmoid(gate[i]);
        }
      }
    }
  });
}

}  // namespace lily

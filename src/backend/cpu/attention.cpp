// CPU gated full attention: q/k zero-centred norm, partial NeoX RoPE, KV cache, causal softmax.
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/op_contract.h"

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
  // The CPU keeps f32 caches (alloc_kv_cache refuses bf16 here); a bf16 view is a caller bug.
  cpu::require(k_view.dtype == KvDtype::f32, "attention",
               std::string("the CPU backend reads f32 KV caches only, got ") +
                   kv_dtype_name(k_view.dtype) + " (--kv-cache f32)");
  float* k_cache = k_view.f32();
  float* v_cache = v_view.f32();
  const int64_t start_pos = resolve_position(pos, "attention");
  cpu::require(start_pos + n <= capacity, "attention",
               "the device position + n is " + std::to_string(start_pos + n) +
                   ", expected at most the KV cache capacity " + std::to_string(capacity));
  const int64_t D = dims.head_dim;
  const int64_t row = dims.kv_heads * D;
  for (int64_t t = 0; t < n; ++t) {
    std::copy(k + t * row, k + (t + 1) * row, k_cache + (start_pos + t) * row);
    std::copy(v + t * row, v + (t + 1) * row, v_cache + (start_pos + t) * row);
  }
  const int64_t group = dims.q_heads / dims.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // The pool hands each thread one contiguous range of items, and a causal token's work grows
  // with its position: items walk the tokens from both ends (0, n-1, 1, n-2, ...) so every
  // range holds as many long rows as short ones. Each (token, head) is computed alone, so the
  // order changes no bit of the result.
  pool_.parallel_for(n * dims.q_heads, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    if (scores.size() < static_cast<size_t>(start_pos + n)) scores.resize(static_cast<size_t>(start_pos + n));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t slot = item / dims.q_heads;
      const int64_t t = slot % 2 == 0 ? slot / 2 : n - 1 - slot / 2;
      const int64_t h = item % dims.q_heads;
      const int64_t kvh = h / group;
      const float* q = qg + (t * dims.q_heads + h) * 2 * D;
      const float* gate = q + D;
      const int64_t last = start_pos + t;  // causal: keys 0..last
      float max = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        scores[static_cast<size_t>(j)] = cpu::dot(q, k_cache + j * row + kvh * D, D) * scale;
        max = std::max(max, scores[static_cast<size_t>(j)]);
      }
      float total = 0.0f;
      for (int64_t j = 0; j <= last; ++j) {
        scores[static_cast<size_t>(j)] = std::exp(scores[static_cast<size_t>(j)] - max);
        total += scores[static_cast<size_t>(j)];
      }
      float* o = out + (t * dims.q_heads + h) * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t j = 0; j <= last; ++j) {
        cpu::axpy(scores[static_cast<size_t>(j)] / total, v_cache + j * row + kvh * D, o, D);
      }
      for (int64_t i = 0; i < D; ++i) o[i] *= cpu::sigmoid(gate[i]);
    }
  });
}

}  // namespace lily

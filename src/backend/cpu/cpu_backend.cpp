// The CPU backend: allocation, norms, routing and argmax (the other ops have their own files).
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <fstream>
#include <numeric>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/int8_dot.h"
#include "backend/op_contract.h"

namespace lily {

const char* cpu_precision_name(CpuPrecision precision) {
  switch (precision) {
    case CpuPrecision::exact:
      return "exact";
    case CpuPrecision::fast:
      return "fast";
    case CpuPrecision::q8:
      return "q8";
  }
  return "unknown";
}

int cpu_precision_planes(CpuPrecision precision) {
  switch (precision) {
    case CpuPrecision::exact:
      return 0;
    case CpuPrecision::fast:
      return 2;
    case CpuPrecision::q8:
      return 1;
  }
  return 0;
}

std::unique_ptr<Backend> make_cpu_backend(int threads, CpuPrecision precision) {
  return std::make_unique<CpuBackend>(threads, precision);
}

std::string CpuBackend::code_path() const {
  if (precision_ == CpuPrecision::exact) return "one-token GEMVs in f32 (--cpu-precision exact)";
  return std::string("GEMVs and prefill GEMMs by int8 dot products, ") +
         (precision_ == CpuPrecision::q8 ? "one activation plane (two for 8-bit weights), "
                                         : "two activation planes, ") +
         cpu::int8_dot_isa() + " (--cpu-precision " + cpu_precision_name(precision_) + ")";
}

CpuBackend::DecodeInput& CpuBackend::decode_input(size_t index) {
  while (decode_inputs_.size() <= index) decode_inputs_.emplace_back();
  return decode_inputs_[index];
}

void CpuBackend::prepare(const ModelWeights& weights, const LoadProgressFn& /*progress*/) {
  // The CPU reads the quantized weights in place from the mapping: nothing to upload.
  contract::check_weight(weights.embed, "prepare", "embed");
  contract::check_weight(weights.lm_head, "prepare", "lm_head");
}

float* CpuBackend::scratch(ScratchSlot slot, size_t count) {
  std::vector<float>& buffer = scratch_[slot];
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

std::string CpuBackend::device_name() const {
  // The first "model name" of /proc/cpuinfo (Linux x86-64), else a generic name.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

float* CpuBackend::alloc(size_t count) { return buffers_.emplace_back(count, 0.0f).data(); }
int32_t* CpuBackend::alloc_i32(size_t count) { return int_buffers_.emplace_back(count, 0).data(); }
void CpuBackend::zero(float* buffer, size_t count) { std::fill(buffer, buffer + count, 0.0f); }
KvCacheView CpuBackend::alloc_kv_cache(size_t count, KvDtype dtype, int64_t head_dim) {
  switch (dtype) {
    case KvDtype::f32: return KvCacheView(alloc(count));
    case KvDtype::bf16: return KvCacheView::bf16(bf16_kv_buffers_.emplace_back(count, uint16_t{0}).data());
    case KvDtype::int8: break;
  }
  cpu::require(head_dim > 0 && count % static_cast<size_t>(head_dim) == 0, "alloc_kv_cache",
               "an int8 KV cache of " + std::to_string(count) + " values needs rows of head_dim values, got head_dim " +
                   std::to_string(head_dim));
  int8_t* codes = int8_kv_buffers_.emplace_back(count, int8_t{0}).data();
  return KvCacheView::int8(codes, alloc(count / static_cast<size_t>(head_dim)), head_dim);
}
void CpuBackend::zero_kv_cache(const KvCacheView& cache, size_t count) {
  switch (cache.dtype) {
    case KvDtype::f32: return zero(cache.f32(), count);
    case KvDtype::bf16: std::fill(cache.bf16_bits(), cache.bf16_bits() + count, uint16_t{0}); return;  // +0.0
    case KvDtype::int8: break;
  }
  std::fill(cache.int8_codes(), cache.int8_codes() + count, int8_t{0});
  zero(cache.int8_scales(), cache.scale_count(count));
}
void CpuBackend::copy_kv_to_host(const KvCacheView& cache, size_t count, void* host_dst) {
  cpu::require(cache.data != nullptr && host_dst != nullptr, "copy_kv_to_host", "a null buffer");
  std::memcpy(host_dst, cache.data, count * kv_dtype_bytes(cache.dtype));
  if (cache.dtype == KvDtype::int8) {
    std::memcpy(static_cast<char*>(host_dst) + count, cache.int8_scales(), cache.scale_count(count) * sizeof(float));
  }
}
void CpuBackend::copy_kv_from_host(const void* host_src, size_t count, const KvCacheView& cache) {
  cpu::require(cache.data != nullptr && host_src != nullptr, "copy_kv_from_host", "a null buffer");
  std::memcpy(cache.data, host_src, count * kv_dtype_bytes(cache.dtype));
  if (cache.dtype == KvDtype::int8) {
    std::memcpy(cache.int8_scales(), static_cast<const char*>(host_src) + count, cache.scale_count(count) * sizeof(float));
  }
}
void CpuBackend::copy_to_host(const float* src, size_t count, float* host_dst) {
  std::copy(src, src + count, host_dst);
}
void CpuBackend::copy_from_host(const int32_t* host_src, size_t count, int32_t* dst) {
  std::copy(host_src, host_src + count, dst);
}
void CpuBackend::copy_from_host(const float* host_src, size_t count, float* dst) {
  std::copy(host_src, host_src + count, dst);
}
uint64_t CpuBackend::allocated_bytes() const {
  // Weights stay in the file mapping (page cache) and are not counted.
  uint64_t bytes = 0;
  for (const auto& b : buffers_) bytes += b.size() * sizeof(float);
  for (const auto& b : int_buffers_) bytes += b.size() * sizeof(int32_t);
  for (const auto& b : bf16_kv_buffers_) bytes += b.size() * sizeof(uint16_t);
  for (const auto& b : int8_kv_buffers_) bytes += b.size();
  for (const auto& b : scratch_) bytes += b.capacity() * sizeof(float);
  const cpu::SamplerWork& w = sampler_work_;
  const auto held = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
  bytes += held(w.processed) + held(w.block_max) + held(w.order_scratch) + held(w.mass) +
           held(w.blocks) + held(w.block_sums) + held(w.items) + held(w.item_mass) + held(w.items_b) +
           held(w.item_mass_b) + held(w.picked) + held(w.block_z) + held(w.block_drawable) +
           held(w.block_positive) + held(w.block_exp);
  return bytes;
}
void CpuBackend::read_async(const int32_t* src, int slot) {
  cpu::require(slot == 0 || slot == 1, "read_async", "slot must be 0 or 1");
  reads_[slot] = *src;
}
int32_t CpuBackend::wait_read(int slot) {
  cpu::require(slot == 0 || slot == 1, "wait_read", "slot must be 0 or 1");
  return reads_[slot];
}
void CpuBackend::copy_to_host_i32(const int32_t* src, size_t count, int32_t* host_dst) {
  std::copy(src, src + count, host_dst);
}
void CpuBackend::copy(const float* src, size_t count, float* dst) {
  // One contiguous slice per thread: a single core cannot saturate the memory bus.
  constexpr size_t kBlock = 1u << 16;  // floats per work item (256 KiB)
  const auto blocks = static_cast<int64_t>((count + kBlock - 1) / kBlock);
  pool_.parallel_for(blocks, [&](int64_t begin, int64_t end) {
    const size_t from = static_cast<size_t>(begin) * kBlock;
    const size_t to = std::min(count, static_cast<size_t>(end) * kBlock);
    if (from < to) std::copy(src + from, src + to, dst + from);
  });
}

namespace {

void normalize_row(const float* x, const DenseView& gain, int64_t dim, float eps, float* out) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < dim; ++i) sum_sq += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * inv * cpu::dense_value(gain, i);
}

}  // namespace

void CpuBackend::rms_norm(const float* x, const DenseView& gain, int64_t n, int64_t dim,
                          float eps, float* out) {
  contract::check_rms_norm(x, gain, n, dim, out);
  pool_.parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) normalize_row(x + t * dim, gain, dim, eps, out + t * dim);
  });
}

void CpuBackend::add_rms_norm(float* residual, const float* delta, const DenseView& gain,
                              int64_t n, int64_t dim, float eps, float* out) {
  contract::check_add_rms_norm(residual, delta, gain, n, dim, out);
  pool_.parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* r = residual + t * dim;
      for (int64_t i = 0; i < dim; ++i) r[i] += delta[t * dim + i];
      normalize_row(r, gain, dim, eps, out + t * dim);
    }
  });
}

void CpuBackend::gated_rms_norm(const float* x, const float* z, const DenseView& gain,
                                int64_t rows, int64_t dim, float eps, float* out) {
  contract::check_gated_rms_norm(x, z, gain, rows, dim, out);
  pool_.parallel_for(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      normalize_row(x + r * dim, gain, dim, eps, out + r * dim);
      for (int64_t i = 0; i < dim; ++i) {
        out[r * dim + i] *= cpu::silu(z[r * dim + i]);
      }
    }
  });
}

void CpuBackend::moe_route(const float* logits, int64_t n, int64_t experts, int64_t k,
                           int32_t* ids, float* weights) {
  contract::check_moe_route(logits, n, experts, k, ids, weights);
  float* probs = scratch(kProbs, static_cast<size_t>(experts));
  if (order_.size() < static_cast<size_t>(experts)) order_.resize(static_cast<size_t>(experts));
  const auto order = order_.begin();
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * experts;
    const float max = *std::max_element(l, l + experts);
    float total = 0.0f;
    for (int64_t e = 0; e < experts; ++e) {
      probs[e] = std::exp(l[e] - max);
      total += probs[e];
    }
    std::iota(order, order + experts, 0);
    // Larger probability first; equal probabilities keep the lower expert id first.
    std::partial_sort(order, order + k, order + experts, [&](int32_t a, int32_t b) {
      const float pa = probs[a];
      const float pb = probs[b];
      return pa != pb ? pa > pb : a < b;
    });
    float top_total = 0.0f;
    for (int64_t j = 0; j < k; ++j) top_total += probs[order[j]] / total;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[j];
      ids[t * k + j] = e;
      weights[t * k + j] = probs[e] / total / top_total;
    }
  }
}

void CpuBackend::argmax(const float* logits, int64_t n, int64_t vocab, int32_t* out) {
  contract::check_argmax(logits, n, vocab, out);
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * vocab;
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i) {
      if (l[i] > l[best]) best = i;  // strict: the lowest index wins ties
    }
    out[t] = static_cast<int32_t>(best);
  }
}

}  // namespace lily

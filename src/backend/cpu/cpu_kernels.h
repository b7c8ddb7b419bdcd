// Shared helpers of the CPU backend: weight element access, quantized row dots, checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/weights.h"
#include "core/bf16.h"

namespace lily::cpu {

// Contract violations are programming errors of the caller: reject, never fall back.
inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string(op) + ": " + what);
}

inline uint32_t load_u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // the mapping may be unaligned; compiles to a plain load
  return v;
}

inline float load_bf16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return bf16_to_f32(v);
}

// Element i of a BF16 or F32 dense tensor, as f32.
inline float dense_value(const DenseView& t, int64_t i) {
  if (t.dtype == DType::F32) {
    float v;
    std::memcpy(&v, t.data + 4 * i, 4);
    return v;
  }
  return load_bf16(t.data + 2 * i);
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x * sigmoid(x); }

// Hot loops are compiled three times (AVX-512, AVX2+FMA, plain x86-64) and the loader picks
// the best one the CPU supports at run time (function multiversioning, GCC and clang). A
// function defined with it must also carry it on its declaration here: clang refuses to make a
// function multiversioned after a call to it has been seen (DecodedRow::dot below calls dot).
// Not under ThreadSanitizer: it instruments the ifunc resolvers as well, and the dynamic loader
// runs them before the TSan runtime is up (a crash at start), so a TSan build (tools/tsan.sh,
// which looks for races, not speed) compiles the kernels for the default target only. CMake's
// TSan build defines LILY_CPU_SINGLE_TARGET everywhere, also in its uninstrumented files.
#if !defined(LILY_CPU_SINGLE_TARGET) && defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LILY_CPU_SINGLE_TARGET 1
#endif
#endif
#if !defined(LILY_CPU_SINGLE_TARGET) && defined(__SANITIZE_THREAD__)
#define LILY_CPU_SINGLE_TARGET 1
#endif
#if defined(LILY_CPU_SINGLE_TARGET)
#define LILY_CPU_CLONES
#else
#define LILY_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

// sum_i a[i] b[i] (vectorised; the summation order differs from a plain loop).
LILY_CPU_CLONES float dot(const float* a, const float* b, int64_t n);
// out[g] = sum_i q[g * q_stride + i] k[i] for g < heads: one key against a group of query
// heads, the key read once for all of them (attention's scores). Each head's sum is formed in
// a fixed order of its own (8 lane partials, a fixed tree, then the tail), whatever `heads` is.
LILY_CPU_CLONES void dot_heads(const float* q, int64_t q_stride, int64_t heads, const float* k,
                               int64_t n, float* out);
// y[i] += alpha x[i]
LILY_CPU_CLONES void axpy(float alpha, const float* x, float* y, int64_t n);
// dot_heads against two keys at once, each query chunk loaded once for both: out0 and out1 are
// bit for bit dot_heads with k0 and with k1 (attention's scores, a pair of keys at a time).
LILY_CPU_CLONES void dot_heads_pair(const float* q, int64_t q_stride, int64_t heads,
                                    const float* k0, const float* k1, int64_t n, float* out0,
                                    float* out1);
// y_g[i] += alpha_g[r] x[r * x_stride + i] for r = 0, 1, ... rows - 1 in that order, for each
// head g < heads (y_g = y + g * y_stride, alpha_g = alpha + g * alpha_stride): the same sums as
// `rows` calls of axpy per head, with y loaded and stored once and each x row loaded once for
// all heads (attention's weighted values of a group of query heads). A head's result does not
// depend on `heads`; it is bit for bit the axpy calls' over whole blocks of 8 values, while the
// last n % 8 may round differently (multiply-add contraction in the tails; attention's head
// dims are multiples of 8). cpu_kernels_test.cpp.
LILY_CPU_CLONES void axpy_rows_heads(const float* alpha, int64_t alpha_stride, int64_t heads,
                                     int64_t rows, const float* x, int64_t x_stride, float* y,
                                     int64_t y_stride, int64_t n);

// Decode-time activations in the order the packed codes come: within each group of 64, the
// even elements then the odd ones. Byte i of a Q4 group holds element 2i (low nibble) and
// 2i+1 (high nibble), so a row dot becomes two contiguous, vectorisable streams.
// permuted [in]; sums [in / 64] (group sums, for the bias term).
LILY_CPU_CLONES void prepare_input(const float* x, int64_t in, float* permuted, float* sums);

// sum_c W[row, c] x[c] for one quantized row, using s*sum(q*x) + b*sum(x) per group;
// `permuted` and `sums` come from prepare_input.
float quant_row_dot(const QuantView& w, int64_t row, const float* permuted, const float* sums);

// One quantized row dequantised for reuse across many tokens (prefill): w[c] = s*q + b in
// f32, exactly as MLX dequantises, so each token's dot is one contiguous vector reduction.
struct DecodedRow {
  std::vector<float> w;  // [in]
  void load(const QuantView& weight, int64_t row);
  // sum_c W[row, c] x[c]
  float dot(const float* x) const { return cpu::dot(w.data(), x, static_cast<int64_t>(w.size())); }
};

}  // namespace lily::cpu

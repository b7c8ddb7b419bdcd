// Shared helpers of the CPU backend: weight element access, quantized row dots, checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

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

// Sum of x over each group of 64 inputs: the bias term of every group's dot product.
void group_sums(const float* x, int64_t in, float* sums);

// sum_c W[row, c] x[c] for one quantized row, using s*sum(q*x) + b*sum(x) per group.
float quant_row_dot(const QuantView& w, int64_t row, const float* x, const float* sums);

// Validates a quantized weight view (bits, group-aligned sizes, pointers).
void check_quant(const QuantView& w, const char* op);

}  // namespace lily::cpu

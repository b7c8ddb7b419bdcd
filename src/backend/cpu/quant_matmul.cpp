// CPU quantized matmul over MLX affine Q4/Q8 weights, used in place from the mapping.
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace lily::cpu {

void group_sums(const float* x, int64_t in, float* sums) {
  for (int64_t g = 0; g < in / 64; ++g) {
    float s = 0.0f;
    for (int64_t i = 0; i < 64; ++i) s += x[g * 64 + i];
    sums[g] = s;
  }
}

namespace {

template <int Bits>
float row_dot(const QuantView& w, int64_t row, const float* x, const float* sums) {
  constexpr int kPerWord = 32 / Bits;
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  constexpr int kWordsPerGroup = 64 / kPerWord;
  const auto in = static_cast<int64_t>(w.in);
  const int64_t groups = in / 64;
  const std::byte* codes = w.codes + row * in * Bits / 8;
  const std::byte* scales = w.scales + row * groups * 2;
  const std::byte* biases = w.biases + row * groups * 2;
  float acc = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    float dot = 0.0f;
    const float* xg = x + g * 64;
    for (int word = 0; word < kWordsPerGroup; ++word) {
      const uint32_t packed = load_u32(codes + (g * kWordsPerGroup + word) * 4);
      for (int j = 0; j < kPerWord; ++j) {
        const auto q = static_cast<float>((packed >> (Bits * j)) & kMask);
        dot += q * xg[word * kPerWord + j];
      }
    }
    acc += load_bf16(scales + g * 2) * dot + load_bf16(biases + g * 2) * sums[g];
  }
  return acc;
}

}  // namespace

float quant_row_dot(const QuantView& w, int64_t row, const float* x, const float* sums) {
  return w.bits == 4 ? row_dot<4>(w, row, x, sums) : row_dot<8>(w, row, x, sums);
}

void check_quant(const QuantView& w, const char* op) {
  require(w.bits == 4 || w.bits == 8, op, w.name + " has " + std::to_string(w.bits) +
                                               " bits, expected 4 or 8");
  require(w.in > 0 && w.in % 64 == 0, op, w.name + " input width must be a positive multiple of 64");
  require(w.codes != nullptr && w.scales != nullptr && w.biases != nullptr, op,
          w.name + " has no data");
}

}  // namespace lily::cpu

namespace lily {

void CpuBackend::matmul(const QuantView& w, int64_t row_begin, int64_t rows, const float* x,
                        int64_t n, float* y) {
  cpu::check_quant(w, "matmul");
  cpu::require(row_begin >= 0 && rows > 0 && row_begin + rows <= static_cast<int64_t>(w.rows()),
               "matmul", "rows [" + std::to_string(row_begin) + ", +" + std::to_string(rows) +
                             ") outside " + w.name + " (" + std::to_string(w.rows()) + " rows)");
  cpu::require(n > 0 && x != nullptr && y != nullptr, "matmul", "empty input or output");
  const auto in = static_cast<int64_t>(w.in);
  std::vector<float> sums(static_cast<size_t>(n * in / 64));
  for (int64_t t = 0; t < n; ++t) cpu::group_sums(x + t * in, in, sums.data() + t * in / 64);
  pool_.parallel_for(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t t = 0; t < n; ++t) {
        y[t * rows + r] =
            cpu::quant_row_dot(w, row_begin + r, x + t * in, sums.data() + t * in / 64);
      }
    }
  });
}

void CpuBackend::embed(const QuantView& table, const int32_t* ids, int64_t n, float* out) {
  cpu::check_quant(table, "embed");
  const auto in = static_cast<int64_t>(table.in);
  for (int64_t t = 0; t < n; ++t) {
    cpu::require(ids[t] >= 0 && static_cast<uint64_t>(ids[t]) < table.rows(), "embed",
                 "token id " + std::to_string(ids[t]) + " outside the vocabulary of " +
                     std::to_string(table.rows()));
  }
  pool_.parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const auto row = static_cast<int64_t>(ids[t]);
      const int64_t groups = in / 64;
      const int per_word = 32 / table.bits;
      const uint32_t mask = (1u << table.bits) - 1u;
      for (int64_t c = 0; c < in; ++c) {
        const int64_t word = row * in / per_word + c / per_word;
        const uint32_t packed = cpu::load_u32(table.codes + word * 4);
        const auto q = static_cast<float>(
            (packed >> (static_cast<uint32_t>(table.bits) * static_cast<uint32_t>(c % per_word))) & mask);
        const float s = cpu::load_bf16(table.scales + (row * groups + c / 64) * 2);
        const float b = cpu::load_bf16(table.biases + (row * groups + c / 64) * 2);
        const float scaled = s * q;
        out[t * in + c] = scaled + b;
      }
    }
  });
}

}  // namespace lily

// Reference MLX affine dequantisation (Q4/Q8, group 64, BF16 scales and biases).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "checkpoint/weights.h"

namespace lily {

// Code `col` of a row of packed words: element c sits at bits [b*(c % (32/b)), ...) of
// word c / (32/b), lowest bits first (0x22111100 holds 4-bit codes 0,0,1,1,1,1,2,2).
inline uint32_t mlx_code(std::span<const uint32_t> row_words, uint64_t col, int bits) {
  const uint64_t per_word = 32 / static_cast<uint64_t>(bits);
  const uint32_t word = row_words[static_cast<size_t>(col / per_word)];
  const uint32_t mask = (1u << bits) - 1u;
  return (word >> (static_cast<uint32_t>(bits) * static_cast<uint32_t>(col % per_word))) & mask;
}

// Dequantises one row: out[c] = scale[g] * q[c] + bias[g] with g = c / 64, evaluated in
// f32 as MLX does (a multiply, then an add; not fused). `words` holds in*bits/32 codes,
// `scales`/`biases` hold in/64 BF16 values. Throws InputError on inconsistent sizes.
void dequantize_row(std::span<const uint32_t> words, std::span<const uint16_t> scales,
                    std::span<const uint16_t> biases, int bits, std::span<float> out);

// Same, reading row `row` of a (possibly unaligned) view into a checkpoint.
void dequantize_row(const QuantView& weight, uint64_t row, std::span<float> out);

}  // namespace lily

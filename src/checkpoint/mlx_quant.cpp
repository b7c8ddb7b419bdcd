// Reference MLX affine dequantisation (Q4/Q8, group 64, BF16 scales and biases).
#include "checkpoint/mlx_quant.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"

namespace lily {

void dequantize_row(std::span<const uint32_t> words, std::span<const uint16_t> scales,
                    std::span<const uint16_t> biases, int bits, std::span<float> out) {
  if (bits != 4 && bits != 8) {
    throw InputError("dequantize_row: bits is " + std::to_string(bits) + ", expected 4 or 8");
  }
  const uint64_t in = out.size();
  if (in % kQuantGroupSize != 0 || words.size() * 32 != in * static_cast<uint64_t>(bits) ||
      scales.size() != in / kQuantGroupSize || biases.size() != in / kQuantGroupSize) {
    throw InputError("dequantize_row: " + std::to_string(words.size()) + " words, " +
                     std::to_string(scales.size()) + " scales and " +
                     std::to_string(biases.size()) + " biases do not describe a " +
                     std::to_string(bits) + "-bit row of " + std::to_string(in) + " values");
  }
  for (uint64_t c = 0; c < in; ++c) {
    const float scale = bf16_to_f32(scales[static_cast<size_t>(c / kQuantGroupSize)]);
    const float bias = bf16_to_f32(biases[static_cast<size_t>(c / kQuantGroupSize)]);
    const auto q = static_cast<float>(mlx_code(words, c, bits));
    const float scaled = scale * q;  // separate statements: no contraction into an FMA
    out[static_cast<size_t>(c)] = scaled + bias;
  }
}

void dequantize_row(const QuantView& weight, uint64_t row, std::span<float> out) {
  if (row >= weight.rows()) {
    throw InputError("dequantize_row: row " + std::to_string(row) + " of " + weight.name +
                     " is out of range (" + std::to_string(weight.rows()) + " rows)");
  }
  if (out.size() != weight.in) {
    throw InputError("dequantize_row: output has " + std::to_string(out.size()) +
                     " values, expected " + std::to_string(weight.in));
  }
  const size_t words = static_cast<size_t>(weight.words_per_row());
  const size_t groups = static_cast<size_t>(weight.groups_per_row());
  // The mapping may be unaligned: copy the row into aligned storage first.
  std::vector<uint32_t> w(words);
  std::vector<uint16_t> s(groups);
  std::vector<uint16_t> b(groups);
  std::memcpy(w.data(), weight.codes + row * words * 4, words * 4);
  std::memcpy(s.data(), weight.scales + row * groups * 2, groups * 2);
  std::memcpy(b.data(), weight.biases + row * groups * 2, groups * 2);
  dequantize_row(w, s, b, weight.bits, out);
}

}  // namespace lily

// bfloat16 <-> float32 conversions shared by host code, the generator and tests.
#pragma once

#include <bit>
#include <cstdint>

namespace lily {

// bf16 is the top half of an IEEE float32: widening is exact.
inline float bf16_to_f32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Round-to-nearest-even, as MLX, PyTorch and the hardware do. NaN stays a quiet NaN
// (the plain rounding trick could carry a NaN's payload into the exponent and make Inf).
inline uint16_t f32_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float round_to_bf16(float value) { return bf16_to_f32(f32_to_bf16(value)); }

}  // namespace lily

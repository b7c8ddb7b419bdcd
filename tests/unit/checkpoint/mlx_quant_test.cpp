// MLX affine dequantisation on hand-computed cases (Q4 and Q8, group 64).
#include "checkpoint/mlx_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"

namespace lily {
namespace {

constexpr uint16_t kHalf = 0x3f00;      // bf16 0.5
constexpr uint16_t kMinusOne = 0xbf80;  // bf16 -1.0

TEST(MlxQuant, Q4CodesAreLowBitsFirst) {
  // 0x22111100 holds codes 0,0,1,1,1,1,2,2 (the case the reference fixture pins).
  std::vector<uint32_t> words(8, 0x76543210u);  // codes 0..7 in order
  words[0] = 0x22111100u;
  std::vector<float> out(64);
  dequantize_row(words, std::vector<uint16_t>{kHalf}, std::vector<uint16_t>{kMinusOne}, 4, out);
  const float first[8] = {-1.0f, -1.0f, -0.5f, -0.5f, -0.5f, -0.5f, 0.0f, 0.0f};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], first[i]) << i;
  for (size_t i = 8; i < 64; ++i) EXPECT_EQ(out[i], 0.5f * static_cast<float>(i % 8) - 1.0f) << i;
}

TEST(MlxQuant, EachGroupOf64HasItsOwnScaleAndBias) {
  std::vector<uint32_t> words(16, 0xffffffffu);  // every code 15
  const std::vector<uint16_t> scales = {kHalf, 0xc000};  // 0.5, -2.0
  const std::vector<uint16_t> biases = {kMinusOne, 0x4040};  // -1.0, 3.0
  std::vector<float> out(128);
  dequantize_row(words, scales, biases, 4, out);
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(out[i], 6.5f) << i;      // 0.5*15 - 1
  for (size_t i = 64; i < 128; ++i) EXPECT_EQ(out[i], -27.0f) << i;  // -2*15 + 3
}

TEST(MlxQuant, TinySubnormalScaleIsExact) {
  std::vector<uint32_t> words(8, 0xfffffff0u);  // codes 0 then 15 x7 per word
  std::vector<float> out(64);
  dequantize_row(words, std::vector<uint16_t>{0x0001}, std::vector<uint16_t>{0x0000}, 4, out);
  // bf16 0x0001 is 2^-133; 15 * 2^-133 is representable in f32 (subnormal range).
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], std::ldexp(15.0f, -133));
  EXPECT_GT(out[1], 0.0f);
}

TEST(MlxQuant, HugeScaleOverflowsLikeF32) {
  std::vector<uint32_t> words(8, 0x00000210u);  // codes 0,1,2,0,0,0,0,0
  // scale = largest finite bf16 (about 3.39e38), bias = -scale.
  std::vector<float> out(64);
  dequantize_row(words, std::vector<uint16_t>{0x7f7f}, std::vector<uint16_t>{0xff7f}, 4, out);
  const float max_bf16 = std::ldexp(255.0f, 120);
  EXPECT_EQ(out[0], -max_bf16);  // 0 * s + b
  EXPECT_EQ(out[1], 0.0f);       // s + b
  EXPECT_EQ(out[2], std::numeric_limits<float>::infinity());  // 2s overflows f32 before the add
}

TEST(MlxQuant, Q8CodesAreBytesLowFirst) {
  std::vector<uint32_t> words(16, 0u);
  words[0] = 0x04030201u;  // codes 1, 2, 3, 4
  words[1] = 0xff800100u;  // codes 0, 1, 128, 255
  std::vector<float> out(64);
  dequantize_row(words, std::vector<uint16_t>{0x3e80}, std::vector<uint16_t>{0xc180}, 8, out);
  // scale 0.25, bias -16
  const float expected[8] = {-15.75f, -15.5f, -15.25f, -15.0f, -16.0f, -15.75f, 16.0f, 47.75f};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], expected[i]) << i;
  EXPECT_EQ(out[8], -16.0f);
}

TEST(MlxQuant, MultiplyThenAddIsNotFused) {
  // scale = 1 + 2^-7, bias chosen so that a fused multiply-add would give a different
  // rounding than the two-step f32 evaluation MLX performs.
  const float scale = 1.0078125f;  // bf16 0x3f81
  const float product = scale * 13.0f;  // 13.1015625 exact in f32
  EXPECT_EQ(product, 13.1015625f);
  std::vector<uint32_t> words(8, 0xddddddddu);  // every code 13
  std::vector<float> out(64);
  dequantize_row(words, std::vector<uint16_t>{0x3f81}, std::vector<uint16_t>{0xc150}, 4, out);
  EXPECT_EQ(out[0], 13.1015625f - 13.0f);
}

TEST(MlxQuant, InconsistentSizesAreRejected) {
  std::vector<float> out(64);
  std::vector<uint32_t> words(7, 0u);
  EXPECT_THROW(dequantize_row(words, std::vector<uint16_t>{kHalf},
                              std::vector<uint16_t>{kHalf}, 4, out),
               InputError);
  std::vector<uint32_t> eight(8, 0u);
  EXPECT_THROW(dequantize_row(eight, std::vector<uint16_t>{kHalf},
                              std::vector<uint16_t>{kHalf}, 3, out),
               InputError);
}

TEST(MlxQuant, ViewRowsAreReadFromUnalignedStorage) {
  // Two rows of a Q4 [2, 64] matrix placed at odd byte offsets, as safetensors allows.
  std::vector<std::byte> storage(1 + 2 * 32 + 1 + 4 + 1 + 4);
  std::byte* codes = storage.data() + 1;
  std::byte* scales = codes + 64 + 1;
  std::byte* biases = scales + 5;
  const uint32_t row_words[2] = {0x11111111u, 0x33333333u};  // codes 1 and 3
  for (int r = 0; r < 2; ++r) {
    for (int w = 0; w < 8; ++w) std::memcpy(codes + (r * 8 + w) * 4, &row_words[r], 4);
  }
  const uint16_t s[2] = {kHalf, 0x4000};  // 0.5, 2.0
  const uint16_t b[2] = {0x0000, kMinusOne};
  std::memcpy(scales, s, 4);
  std::memcpy(biases, b, 4);
  QuantView view;
  view.name = "test";
  view.bits = 4;
  view.out = 2;
  view.in = 64;
  view.codes = codes;
  view.scales = scales;
  view.biases = biases;
  std::vector<float> out(64);
  dequantize_row(view, 0, out);
  EXPECT_EQ(out[5], 0.5f);
  dequantize_row(view, 1, out);
  EXPECT_EQ(out[63], 5.0f);  // 2 * 3 - 1
  EXPECT_THROW(dequantize_row(view, 2, out), InputError);
}

}  // namespace
}  // namespace lily

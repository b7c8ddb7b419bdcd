// bf16 conversion: exact widening, round-to-nearest-even narrowing, NaN and Inf handling.
#include "core/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace lily {
namespace {

TEST(Bf16, WideningIsTheTopHalfOfAFloat) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_f32(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(bf16_to_f32(0x8000)));
  EXPECT_EQ(bf16_to_f32(0x7f80), std::numeric_limits<float>::infinity());
}

TEST(Bf16, NarrowingRoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 0.00390625f), 0x3f80);
  // 1.0078125 + 2^-8 is halfway between 1.0078125 (odd mantissa) and 1.015625: rounds up.
  EXPECT_EQ(f32_to_bf16(1.0078125f + 0.00390625f), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 0.00390625f + 0.0000001f), 0x3f81);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
}

TEST(Bf16, NanStaysNanAndOverflowBecomesInf) {
  const uint16_t nan = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  // A NaN whose payload sits only in the low 16 bits must not round into Inf.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::max())),
            std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace lily

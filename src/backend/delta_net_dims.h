// The Gated DeltaNet mixer's dimensions, as the backend ops and the decode plan take them.
#pragma once

#include <cstdint>

namespace lily {

struct GatedDeltaNetDims {
  int64_t key_heads = 0;    // 16 (tiny 2)
  int64_t value_heads = 0;  // 32 (tiny 4); value head h reads key head h / (value_heads / key_heads)
  int64_t key_dim = 0;      // 128
  int64_t value_dim = 0;    // 128
  int64_t conv_kernel = 0;  // 4
  int64_t channels() const { return 2 * key_heads * key_dim + value_heads * value_dim; }
};

}  // namespace lily

// Deterministic synthetic weight values for every planned tensor (mlx on-disk encoding).
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/tensor_plan.h"
#include "synth/safetensors_writer.h"

namespace lily {

// The stored tensors for one planned entry (3 for a quantized projection, 1 otherwise),
// each a lazy byte stream seeded by (seed, stored name): the bytes do not depend on
// chunking, order or machine. Values keep a forward pass finite and non-degenerate:
// zero-mean weights with std about 1/sqrt(in_features), norm gains near 1.
std::vector<TensorSource> synthetic_tensors(const PlannedTensor& planned, uint64_t seed);

}  // namespace lily

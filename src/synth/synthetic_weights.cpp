// Deterministic synthetic weight values for every planned tensor (mlx on-disk encoding).
#include "synth/synthetic_weights.h"

#include <bit>
#include <cmath>
#include <memory>

#include "core/bf16.h"
#include "synth/prng.h"

namespace lily {

namespace {

// Writes `value` little-endian at `out` (explicit, so output is the same on any host).
template <typename T>
void store_le(std::byte* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<std::byte>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff);
  }
}

// Adapts an element generator (called once per element, in order) to chunked output.
// Chunks are whole multiples of the element size except possibly the last, which the
// writer sizes exactly, so no element straddles two chunks.
template <typename Element, typename Next>
std::function<void(std::span<std::byte>)> element_stream(Next next) {
  auto state = std::make_shared<Next>(std::move(next));
  return [state](std::span<std::byte> chunk) {
    for (size_t i = 0; i + sizeof(Element) <= chunk.size(); i += sizeof(Element)) {
      store_le<Element>(chunk.data() + i, (*state)());
    }
  };
}

// Target standard deviation of a projection's dequantised weights.
float weight_std(const PlannedTensor& t) {
  switch (t.role) {
    case TensorRole::embed: return 0.5f;
    // A wider lm_head spreads the logits so greedy choices have clear margins.
    case TensorRole::lm_head: return 2.0f / std::sqrt(static_cast<float>(t.in));
    default: return 1.0f / std::sqrt(static_cast<float>(t.in));
  }
}

// Per-group scale: the code std of a uniform b-bit code is sqrt((2^2b - 1) / 12).
struct GroupScaleStream {
  SplitMix64 rng;
  float base;
  uint16_t operator()() { return f32_to_bf16(base * (0.8f + 0.4f * rng.uniform())); }
};

std::vector<TensorSource> quantized_sources(const PlannedTensor& t, uint64_t seed) {
  const float levels = static_cast<float>((1u << t.bits) - 1);
  const float code_std = std::sqrt((levels + 2.0f) * levels / 12.0f);  // ((2^b)^2 - 1) / 12
  const float mid = levels / 2.0f;
  const float base_scale = weight_std(t) / code_std;

  TensorSource codes{t.base + ".weight", DType::U32, t.codes_shape(), {}};
  codes.produce = element_stream<uint32_t>(
      [rng = SplitMix64(stream_seed(seed, codes.name))]() mutable {
        return static_cast<uint32_t>(rng.next() >> 32);
      });

  TensorSource scales{t.base + ".scales", DType::BF16, t.groups_shape(), {}};
  const uint64_t scale_seed = stream_seed(seed, scales.name);
  scales.produce = element_stream<uint16_t>(GroupScaleStream{SplitMix64(scale_seed), base_scale});

  // bias = -mid * scale + small offset: zero-mean weights with a little per-group shift.
  TensorSource biases{t.base + ".biases", DType::BF16, t.groups_shape(), {}};
  biases.produce = element_stream<uint16_t>(
      [scale_stream = GroupScaleStream{SplitMix64(scale_seed), base_scale},
       jitter = SplitMix64(stream_seed(seed, biases.name)), mid]() mutable {
        const float scale = bf16_to_f32(scale_stream());
        const float offset = 0.5f * jitter.normalish();
        return f32_to_bf16(scale * (offset - mid));
      });
  return {std::move(codes), std::move(scales), std::move(biases)};
}

TensorSource dense_source(const PlannedTensor& t, uint64_t seed) {
  TensorSource source{t.base, t.dtypes.front(), t.shapes.front(), {}};
  SplitMix64 rng(stream_seed(seed, t.base));
  // Value generator per role, in f32; encoded to the stored dtype below.
  std::function<float()> value;
  switch (t.role) {
    case TensorRole::gdn_conv1d:  // depthwise taps, std 1/sqrt(K)
      value = [rng]() mutable { return 0.5f * rng.normalish(); };
      break;
    case TensorRole::gdn_a_log:  // A = exp(A_log) in [1, 16], as the HF initialiser
      value = [rng]() mutable { return 2.7725887f * rng.uniform(); };
      break;
    case TensorRole::gdn_dt_bias:  // inverse softplus of dt in [0.001, 0.1] ~ log(dt)
      value = [rng]() mutable { return -6.9077554f + 4.6051702f * rng.uniform(); };
      break;
    default:  // norm gains near 1 (baked 1 + w for zero-centred norms, plain for the gated norm)
      value = [rng]() mutable { return 1.0f + 0.1f * rng.normalish(); };
      break;
  }
  if (source.dtype == DType::F32) {
    source.produce = element_stream<uint32_t>(
        [value]() mutable { return std::bit_cast<uint32_t>(value()); });
  } else {
    source.produce = element_stream<uint16_t>([value]() mutable { return f32_to_bf16(value()); });
  }
  return source;
}

}  // namespace

std::vector<TensorSource> synthetic_tensors(const PlannedTensor& planned, uint64_t seed) {
  if (planned.quantized) return quantized_sources(planned, seed);
  std::vector<TensorSource> result;
  result.push_back(dense_source(planned, seed));
  return result;
}

}  // namespace lily

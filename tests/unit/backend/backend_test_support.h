// Backend test helpers: seeded random inputs, in-memory quantised/dense weights, error figures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/weights.h"

namespace lily::testing {

// splitmix64: deterministic across platforms and standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  uint32_t next_u32() { return static_cast<uint32_t>(next() >> 32); }
  float uniform(float lo, float hi);  // [lo, hi)
  int32_t below(int32_t bound);       // [0, bound)
  std::vector<float> uniform_vector(size_t count, float lo, float hi);

 private:
  uint64_t state_;
};

// [n, k] expert ids in [0, experts): distinct within a token (as top-k gives), shared between
// tokens. Needs k <= experts.
std::vector<int32_t> random_expert_ids(Rng& rng, int64_t n, int64_t k, int64_t experts);

// An MLX affine Q4/Q8 weight built in memory: random U32 codes, BF16 scales and biases shaped
// like real MLX groups (bias = group minimum, about -scale * (2^bits - 1) / 2). `misalign`
// shifts every buffer by that many bytes off its allocation, as safetensors offsets may.
// Not copyable: the view points into the owned buffers.
class QuantWeight {
 public:
  QuantWeight(Rng& rng, int bits, uint64_t experts, uint64_t out, uint64_t in,
              size_t misalign = 0, std::string name = "w");
  QuantWeight(const QuantWeight&) = delete;
  QuantWeight& operator=(const QuantWeight&) = delete;
  const QuantView& view() const { return view_; }

 private:
  std::vector<std::byte> codes_, scales_, biases_;
  QuantView view_;
};

// A dense BF16 or F32 tensor (norm gains, conv taps, A_log, dt_bias).
class DenseTensor {
 public:
  DenseTensor(DType dtype, std::vector<uint64_t> shape, std::span<const float> values,
              std::string name = "gain");
  DenseTensor(const DenseTensor&) = delete;
  DenseTensor& operator=(const DenseTensor&) = delete;
  const DenseView& view() const { return view_; }

 private:
  std::vector<std::byte> data_;
  DenseView view_;
};

// ||got - want|| / ||want|| and max |got - want|. Equal infinities count as no error; any
// other non-finite value on either side makes both figures infinite.
struct ErrorFigures {
  double normalised = 0;
  double max_abs = 0;
};
ErrorFigures compare(std::span<const float> got, std::span<const double> want);

// Compares, prints "[ref] op label: normalised=... max_abs=..." and returns the figures.
ErrorFigures report(const std::string& op, const std::string& label, std::span<const float> got,
                    std::span<const double> want);

std::unique_ptr<Backend> cpu(int threads = 2);

// The host image of an int8 KV cache of `count` values in rows of head_dim (backend.h): the
// codes, then one f32 scale per row; read from and written to a cache through the host copies.
struct Int8KvImage {
  std::vector<int8_t> codes;  // [count]
  std::vector<float> scales;  // [count / head_dim]
};
Int8KvImage read_int8_kv(Backend& be, const KvCacheView& cache, size_t count, int64_t head_dim);
void write_int8_kv(Backend& be, const KvCacheView& cache, const Int8KvImage& image);

// Best wall time of `reps` calls of f, in seconds, after one warm-up call (the kernel benches).
double best_of(int reps, const std::function<void()>& f);

}  // namespace lily::testing

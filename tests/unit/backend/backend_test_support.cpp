// Backend test helpers: seeded random inputs, in-memory quantised/dense weights, error figures.
#include "backend_test_support.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "core/bf16.h"

namespace lily::testing {

uint64_t Rng::next() {
  state_ += 0x9e3779b97f4a7c15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float Rng::uniform(float lo, float hi) {
  const float unit = static_cast<float>(next() >> 40) * 0x1p-24f;  // [0, 1) on a 2^-24 grid
  return lo + (hi - lo) * unit;
}

int32_t Rng::below(int32_t bound) {
  return static_cast<int32_t>(next() % static_cast<uint64_t>(bound));
}

std::vector<float> Rng::uniform_vector(size_t count, float lo, float hi) {
  std::vector<float> out(count);
  for (float& v : out) v = uniform(lo, hi);
  return out;
}

std::vector<int32_t> random_expert_ids(Rng& rng, int64_t n, int64_t k, int64_t experts) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> row;
    while (static_cast<int64_t>(row.size()) < k) {
      const int32_t e = rng.below(static_cast<int32_t>(experts));
      if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return ids;
}

namespace {

void put_u16(std::byte* p, uint16_t v) { std::memcpy(p, &v, 2); }

}  // namespace

QuantWeight::QuantWeight(Rng& rng, int bits, uint64_t experts, uint64_t out, uint64_t in,
                         size_t misalign, std::string name) {
  view_.name = std::move(name);
  view_.bits = bits;
  view_.experts = experts;
  view_.out = out;
  view_.in = in;
  const uint64_t rows = experts * out;
  const uint64_t words = rows * in * static_cast<uint64_t>(bits) / 32;
  const uint64_t groups = rows * (in / 64);
  codes_.resize(misalign + words * 4);
  scales_.resize(misalign + groups * 2);
  biases_.resize(misalign + groups * 2);
  for (uint64_t i = 0; i < words; ++i) {
    const uint32_t w = rng.next_u32();
    std::memcpy(codes_.data() + misalign + i * 4, &w, 4);
  }
  const float half_range = static_cast<float>((1 << bits) - 1) / 2.0f;
  for (uint64_t g = 0; g < groups; ++g) {
    const float scale = rng.uniform(0.002f, 0.03f) * (bits == 8 ? 1.0f / 16.0f : 1.0f);
    const float bias = -scale * half_range * rng.uniform(0.8f, 1.2f);
    put_u16(scales_.data() + misalign + g * 2, f32_to_bf16(scale));
    put_u16(biases_.data() + misalign + g * 2, f32_to_bf16(bias));
  }
  view_.codes = codes_.data() + misalign;
  view_.scales = scales_.data() + misalign;
  view_.biases = biases_.data() + misalign;
}

DenseTensor::DenseTensor(DType dtype, std::vector<uint64_t> shape, std::span<const float> values,
                         std::string name) {
  view_.name = std::move(name);
  view_.dtype = dtype;
  view_.shape = std::move(shape);
  const size_t width = dtype == DType::F32 ? 4 : 2;
  data_.resize(values.size() * width);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(data_.data() + i * 4, &values[i], 4);
    } else {
      put_u16(data_.data() + i * 2, f32_to_bf16(values[i]));
    }
  }
  view_.data = data_.data();
  view_.nbytes = data_.size();
}

ErrorFigures compare(std::span<const float> got, std::span<const double> want) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (got.size() != want.size()) return {kInf, kInf};
  double diff_sq = 0;
  double want_sq = 0;
  ErrorFigures f;
  for (size_t i = 0; i < got.size(); ++i) {
    const auto g = static_cast<double>(got[i]);
    const double w = want[i];
    if (std::isinf(w) && g == w) continue;
    if (!std::isfinite(g) || !std::isfinite(w)) return {kInf, kInf};
    diff_sq += (g - w) * (g - w);
    want_sq += w * w;
    f.max_abs = std::max(f.max_abs, std::fabs(g - w));
  }
  f.normalised = want_sq > 0 ? std::sqrt(diff_sq / want_sq) : (diff_sq > 0 ? kInf : 0.0);
  return f;
}

ErrorFigures report(const std::string& op, const std::string& label, std::span<const float> got,
                    std::span<const double> want) {
  const ErrorFigures f = compare(got, want);
  std::printf("[ref] %-20s %-44s normalised=%.3e max_abs=%.3e\n", op.c_str(), label.c_str(),
              f.normalised, f.max_abs);
  return f;
}

std::unique_ptr<Backend> cpu(int threads) { return make_cpu_backend(threads); }

double best_of(int reps, const std::function<void()>& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

Int8KvImage read_int8_kv(Backend& be, const KvCacheView& cache, size_t count, int64_t head_dim) {
  const size_t rows = count / static_cast<size_t>(head_dim);
  std::vector<char> bytes(kv_cache_bytes(KvDtype::int8, count, head_dim));
  be.copy_kv_to_host(cache, count, bytes.data());
  Int8KvImage image{std::vector<int8_t>(count), std::vector<float>(rows)};
  std::memcpy(image.codes.data(), bytes.data(), count);
  std::memcpy(image.scales.data(), bytes.data() + count, rows * sizeof(float));
  return image;
}

void write_int8_kv(Backend& be, const KvCacheView& cache, const Int8KvImage& image) {
  std::vector<char> bytes(image.codes.size() + image.scales.size() * sizeof(float));
  std::memcpy(bytes.data(), image.codes.data(), image.codes.size());
  std::memcpy(bytes.data() + image.codes.size(), image.scales.data(), image.scales.size() * sizeof(float));
  be.copy_kv_from_host(bytes.data(), image.codes.size(), cache);
}

}  // namespace lily::testing

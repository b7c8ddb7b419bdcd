// Micro-benchmark (not a test): CPU attention at the model's shape over an f32, a bf16 and an int8 KV cache, one decode step at long contexts and a prefill chunk.
// Usage: attention_bench [threads (default 2)] [repetitions (default 5)] [contexts, comma-separated
// (default 4096,32768)]. Prints the best of the repetitions per case and, for decode, the KV bytes it read;
// the prefill chunk only at contexts up to 4,096.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend_test_support.h"
#include "core/bf16.h"

namespace lily::testing {
namespace {

const AttentionDims kDims{16, 2, 256, 64, 1e7};  // the model's attention layers
constexpr int64_t kPrefill = 256;                 // the CPU's prefill chunk (cli/backend_choice.cpp)
constexpr int64_t kPrefillContexts = 4096;        // the longest context a prefill chunk is timed at

int run(int threads, int reps, const std::vector<int64_t>& contexts) {
  auto be = cpu(threads);
  const int64_t row = kDims.kv_heads * kDims.head_dim;
  std::printf("attention_bench: Hq=%lld Hkv=%lld D=%lld, %d threads, best of %d\n",
              static_cast<long long>(kDims.q_heads), static_cast<long long>(kDims.kv_heads),
              static_cast<long long>(kDims.head_dim), threads, reps);
  std::printf("%-8s %-24s %12s %12s %10s\n", "cache", "case", "ms/call", "KV MiB read", "GB/s");
  Rng rng(9);
  for (int64_t context : contexts) {
    const int64_t capacity = context + kPrefill;
    const auto elements = static_cast<size_t>(capacity * row);
    // Filled with random keys and values once (the same for both dtypes), then timed.
    const std::vector<float> keys = rng.uniform_vector(elements, -1.0f, 1.0f);
    const std::vector<float> values = rng.uniform_vector(elements, -1.0f, 1.0f);
    std::vector<float> qg = rng.uniform_vector(static_cast<size_t>(kPrefill * kDims.q_heads * 2 * kDims.head_dim), -1.0f, 1.0f);
    std::vector<float> out(static_cast<size_t>(kPrefill * kDims.q_heads * kDims.head_dim));
    for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16, KvDtype::int8}) {
      const KvCacheView k = be->alloc_kv_cache(elements, dtype, kDims.head_dim);
      const KvCacheView v = be->alloc_kv_cache(elements, dtype, kDims.head_dim);
      if (dtype == KvDtype::f32) {
        be->copy_kv_from_host(keys.data(), elements, k);
        be->copy_kv_from_host(values.data(), elements, v);
      } else if (dtype == KvDtype::int8) {
        for (const auto& [src, cache] : {std::pair{&keys, &k}, std::pair{&values, &v}}) {
          Int8KvImage image{std::vector<int8_t>(elements), std::vector<float>(elements / static_cast<size_t>(kDims.head_dim))};
          for (size_t r = 0; r < image.scales.size(); ++r) {
            const size_t at = r * static_cast<size_t>(kDims.head_dim);
            image.scales[r] = quantize_kv_row(src->data() + at, kDims.head_dim, image.codes.data() + at);
          }
          write_int8_kv(*be, *cache, image);
        }
      } else {
        std::vector<uint16_t> bits(elements);
        for (size_t i = 0; i < elements; ++i) bits[i] = f32_to_bf16(keys[i]);
        be->copy_kv_from_host(bits.data(), elements, k);
        for (size_t i = 0; i < elements; ++i) bits[i] = f32_to_bf16(values[i]);
        be->copy_kv_from_host(bits.data(), elements, v);
      }
      // bytes: the KV rows one call reads once (decode); 0: not counted (a prefill chunk reads
      // each row once per query token, mostly from cache).
      const auto line = [&](const std::string& what, double seconds, double bytes) {
        if (bytes == 0) {
          std::printf("%-8s %-24s %12.3f %12s %10s\n", kv_dtype_name(dtype), what.c_str(),
                      seconds * 1e3, "-", "-");
          return;
        }
        std::printf("%-8s %-24s %12.3f %12.1f %10.2f\n", kv_dtype_name(dtype), what.c_str(),
                    seconds * 1e3, bytes / (1 << 20), bytes / seconds / 1e9);
      };
      const double element = static_cast<double>(kv_cache_bytes(dtype, static_cast<uint64_t>(row), kDims.head_dim)) /
                             static_cast<double>(row);  // bytes per value, int8's scales included
      // One decode step after `context` tokens: writes row `context`, reads rows 0..context.
      const double decode = best_of(reps, [&] {
        be->attention(qg.data(), keys.data(), values.data(), k, v, capacity, kDims, context, 1, out.data());
      });
      line("decode at " + std::to_string(context), decode,
           2.0 * static_cast<double>((context + 1) * row) * element);
      // A prefill chunk after `context` tokens (rows context..context+255); only up to
      // kPrefillContexts (at 32,768 one call takes seconds).
      if (context > kPrefillContexts) continue;
      const double prefill = best_of(std::max(1, reps / 2), [&] {
        be->attention(qg.data(), keys.data(), values.data(), k, v, capacity, kDims, context,
                      kPrefill, out.data());
      });
      line("prefill 256 at " + std::to_string(context), prefill, 0);
    }
  }
  return 0;
}

}  // namespace
}  // namespace lily::testing

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  std::vector<int64_t> contexts;
  std::stringstream list(argc > 3 ? argv[3] : "4096,32768");
  for (std::string item; std::getline(list, item, ',');) contexts.push_back(std::atoll(item.c_str()));
  if (threads < 1 || reps < 1 || contexts.empty()) {
    std::fprintf(stderr, "usage: attention_bench [threads] [repetitions] [contexts]\n");
    return 2;
  }
  return lily::testing::run(threads, reps, contexts);
}

// Micro-benchmark (not a test): a 2048 x 4096 Q4 matrix-vector product on one thread, the f32
// decode dot vs the int8 kernel (two planes, then one) on each path, and the many-token (prefill)
// products. Usage: int8_dot_bench [repetitions (default 50)]. Prints the best of the repetitions
// per path.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/int8_dot.h"
#include "backend_test_support.h"

namespace lily::testing {
namespace {

constexpr int64_t kRows = 2048;
constexpr int64_t kIn = 4096;

double normalised_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    d += e * e;
    n += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(d / n);
}

int run(int reps) {
  Rng rng(7);
  const QuantWeight w(rng, 4, 1, kRows, kIn);  // Q4 [2048, 4096]: codes U32 [2048, 512], BF16 scales/biases [2048, 64]
  const QuantView& v = w.view();
  const std::vector<float> x = rng.uniform_vector(kIn, -1.0f, 1.0f);  // f32 [4096]
  const auto bytes = static_cast<double>(v.stored_bytes());

  std::printf("int8_dot_bench: Q4 %lld x %lld (%.2f MiB of codes, scales and biases), 1 thread, "
              "best of %d\n",
              static_cast<long long>(kRows), static_cast<long long>(kIn), bytes / (1 << 20), reps);
  std::printf("%-34s %10s %10s %10s\n", "path", "us/matvec", "ns/row", "GB/s");
  auto line = [&](const std::string& name, double seconds) {
    std::printf("%-34s %10.1f %10.2f %10.2f\n", name.c_str(), seconds * 1e6,
                seconds * 1e9 / static_cast<double>(kRows), bytes / seconds / 1e9);
  };

  // Today's f32 decode path (quant_matmul.cpp): the backend's matmul with n = 1 permutes x
  // (prepare_input) and runs row_dot_q4 on every row; one pool thread.
  std::unique_ptr<Backend> backend = cpu(1);
  std::vector<float> y_f32(kRows);  // f32 [2048]
  line("f32 CpuBackend::matmul (n=1)", best_of(reps, [&] {
         backend->matmul(v, 0, kRows, x.data(), 1, y_f32.data());
       }));
  // The same dots without the backend around them: x permuted here as prepare_input does (a
  // call to prepare_input from this file would need its target_clones resolver, which GCC
  // emits per calling file against the clones' local symbols, and fails to link).
  std::vector<float> permuted(kIn), sums(kIn / 64);  // f32 [4096]: per group evens then odds; f32 [64]
  for (int64_t g = 0; g < kIn / 64; ++g) {
    float s = 0.0f;
    for (int64_t i = 0; i < 32; ++i) {
      permuted[static_cast<size_t>(g * 64 + i)] = x[static_cast<size_t>(g * 64 + 2 * i)];
      permuted[static_cast<size_t>(g * 64 + 32 + i)] = x[static_cast<size_t>(g * 64 + 2 * i + 1)];
      s += x[static_cast<size_t>(g * 64 + 2 * i)] + x[static_cast<size_t>(g * 64 + 2 * i + 1)];
    }
    sums[static_cast<size_t>(g)] = s;
  }
  std::vector<float> y_rows(kRows);  // f32 [2048]
  line("f32 row_dot_q4 (dots only)", best_of(reps, [&] {
         for (int64_t r = 0; r < kRows; ++r) {
           y_rows[static_cast<size_t>(r)] = cpu::quant_row_dot(v, r, permuted.data(), sums.data());
         }
       }));
  if (y_rows != y_f32) {
    std::fprintf(stderr, "error: the bench's f32 dots differ from CpuBackend::matmul's\n");
    return 1;
  }

  // The int8 kernels with the activations in two planes (--cpu-precision fast), then one (q8).
  for (int planes : {2, 1}) {
    const std::string tag = planes == 2 ? "int8 " : "int8 1-plane ";
    Rng xr(8);  // the same tokens for both
    cpu::Q8Activations xa;
    const double quantise =
        best_of(reps, [&] { cpu::quantize_activations(x.data(), kIn, xa, planes); });
    std::printf("%-34s %10.2f\n", (tag + "quantize_activations (us)").c_str(), quantise * 1e6);
    std::vector<float> y_int8(kRows), y_scalar(kRows);  // f32 [2048]
    cpu::int8_rows_dot(v, 0, kRows, xa, y_scalar.data(), cpu::Int8Isa::scalar);
    for (cpu::Int8Isa isa : {cpu::Int8Isa::avx512_vnni, cpu::Int8Isa::avx_vnni, cpu::Int8Isa::avx2,
                             cpu::Int8Isa::scalar}) {
      if (!cpu::int8_isa_supported(isa)) {
        std::printf("%-34s (not on this CPU)\n", (tag + cpu::int8_isa_name(isa)).c_str());
        continue;
      }
      const double t =
          best_of(reps, [&] { cpu::int8_rows_dot(v, 0, kRows, xa, y_int8.data(), isa); });
      line(tag + cpu::int8_isa_name(isa) + " (dots only)", t);
      if (y_int8 != y_scalar) {
        std::fprintf(stderr, "error: the %s path differs from the scalar path\n",
                     cpu::int8_isa_name(isa));
        return 1;
      }
    }
    const cpu::Int8Isa best = cpu::Int8Isa::automatic;
    line(tag + cpu::int8_isa_name(best) + " + quantize", best_of(reps, [&] {
           cpu::quantize_activations(x.data(), kIn, xa, planes);
           cpu::int8_rows_dot(v, 0, kRows, xa, y_int8.data(), best);
         }));
    std::printf("%svs f32 result: normalised difference %.3e (the activation quantisation)\n",
                tag.c_str(), normalised_diff(y_int8, y_f32));

    // Prefill: the same matrix times 64 and 256 tokens, one thread. The f32 path is the backend's
    // matmul (dequantise each row, f32 dots per token); the int8 one int8_rows_dot_tokens on the
    // quantised tokens (quantisation timed separately), checked bit for bit against one-token dots.
    std::printf("%-34s %10s %10s %10s\n", "many tokens", "ms", "G MAC/s", "");
    for (int64_t n : {64, 256}) {
      const std::vector<float> xn =
          xr.uniform_vector(static_cast<size_t>(n * kIn), -1.0f, 1.0f);  // f32 [n, 4096]
      std::vector<cpu::Q8Activations> q(static_cast<size_t>(n));
      std::vector<const cpu::Q8Activations*> ptrs;
      for (int64_t t = 0; t < n; ++t) {
        cpu::quantize_activations(xn.data() + t * kIn, kIn, q[static_cast<size_t>(t)], planes);
        ptrs.push_back(&q[static_cast<size_t>(t)]);
      }
      const double macs = static_cast<double>(kRows) * kIn * static_cast<double>(n);
      auto mline = [&](const std::string& name, double seconds) {
        std::printf("%-34s %10.2f %10.2f\n", name.c_str(), seconds * 1e3, macs / seconds / 1e9);
      };
      const int few = std::max(1, reps / 10);
      std::vector<float> yn(static_cast<size_t>(n * kRows));  // f32 [n, 2048]
      if (planes == 2) {
        mline("f32 matmul n=" + std::to_string(n),
              best_of(few, [&] { backend->matmul(v, 0, kRows, xn.data(), n, yn.data()); }));
      }
      for (cpu::Int8Isa isa :
           {cpu::Int8Isa::avx512_vnni, cpu::Int8Isa::avx_vnni, cpu::Int8Isa::avx2}) {
        if (!cpu::int8_isa_supported(isa)) continue;
        mline(tag + "tokens " + cpu::int8_isa_name(isa) + " n=" + std::to_string(n),
              best_of(few, [&] {
                cpu::int8_rows_dot_tokens(v, 0, kRows, ptrs.data(), n, yn.data(), kRows, isa);
              }));
        for (int64_t t = 0; t < n; t += 37) {
          cpu::int8_rows_dot(v, 0, kRows, q[static_cast<size_t>(t)], y_int8.data(),
                             cpu::Int8Isa::scalar);
          if (!std::equal(y_int8.begin(), y_int8.end(), yn.begin() + t * kRows)) {
            std::fprintf(
                stderr,
                "error: int8_rows_dot_tokens (%s) differs from int8_rows_dot at token %lld\n",
                cpu::int8_isa_name(isa), static_cast<long long>(t));
            return 1;
          }
        }
      }
      const double qt = best_of(few, [&] {
        for (int64_t t = 0; t < n; ++t)
          cpu::quantize_activations(xn.data() + t * kIn, kIn, q[static_cast<size_t>(t)], planes);
      });
      std::printf("%-34s %10.2f\n",
                  (tag + "quantize " + std::to_string(n) + " tokens (ms)").c_str(), qt * 1e3);
    }
  }
  return 0;
}

}  // namespace
}  // namespace lily::testing

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  if (reps <= 0) {
    std::fprintf(stderr, "error: repetitions must be a positive integer, got '%s'\n", argv[1]);
    return 2;
  }
  return lily::testing::run(reps);
}

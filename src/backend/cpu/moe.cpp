// CPU mixture of experts: gathered gate/up + SwiGLU, and down + weighted combine + shared expert.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace lily {

void CpuBackend::expert_swiglu(const QuantView& gate, const QuantView& up, const float* x,
                               const int32_t* ids, int64_t n, int64_t k, float* h) {
  cpu::check_quant(gate, "expert_swiglu");
  cpu::check_quant(up, "expert_swiglu");
  cpu::require(gate.out == up.out && gate.in == up.in && gate.experts == up.experts,
               "expert_swiglu", "gate and up projections must have the same shape");
  const auto I = static_cast<int64_t>(gate.out);
  const auto in = static_cast<int64_t>(gate.in);
  for (int64_t i = 0; ids != nullptr && i < n * k; ++i) {
    cpu::require(ids[i] >= 0 && static_cast<uint64_t>(ids[i]) < gate.experts, "expert_swiglu",
                 "expert id " + std::to_string(ids[i]) + " out of range");
  }
  std::vector<float> sums(static_cast<size_t>(n * in / 64));
  for (int64_t t = 0; t < n; ++t) cpu::group_sums(x + t * in, in, sums.data() + t * in / 64);
  pool_.parallel_for(n * k * I, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t slot = item / I;  // t * k + j
      const int64_t r = item % I;
      const int64_t t = slot / k;
      const int64_t e = ids != nullptr ? ids[slot] : 0;
      const float* xt = x + t * in;
      const float* st = sums.data() + t * in / 64;
      const float g = cpu::quant_row_dot(gate, e * I + r, xt, st);
      const float u = cpu::quant_row_dot(up, e * I + r, xt, st);
      h[item] = g / (1.0f + std::exp(-g)) * u;
    }
  });
}

void CpuBackend::expert_down_combine(const QuantView& down, const float* h, const int32_t* ids,
                                     const float* weights, int64_t n, int64_t k,
                                     const QuantView& shared_down, const float* shared_h,
                                     const float* shared_logit, float* out) {
  cpu::check_quant(down, "expert_down_combine");
  cpu::check_quant(shared_down, "expert_down_combine");
  cpu::require(down.out == shared_down.out, "expert_down_combine",
               "routed and shared down projections must have the same output width");
  const auto H = static_cast<int64_t>(down.out);
  const auto I = static_cast<int64_t>(down.in);
  const auto S = static_cast<int64_t>(shared_down.in);
  std::vector<float> sums(static_cast<size_t>(n * k * I / 64));
  for (int64_t s = 0; s < n * k; ++s) cpu::group_sums(h + s * I, I, sums.data() + s * I / 64);
  std::vector<float> shared_sums(static_cast<size_t>(n * S / 64));
  for (int64_t t = 0; t < n; ++t) cpu::group_sums(shared_h + t * S, S, shared_sums.data() + t * S / 64);
  pool_.parallel_for(n * H, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / H;
      const int64_t r = item % H;
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t slot = t * k + j;
        const int64_t e = ids[slot];
        acc += weights[slot] *
               cpu::quant_row_dot(down, e * H + r, h + slot * I, sums.data() + slot * I / 64);
      }
      const float gate = 1.0f / (1.0f + std::exp(-shared_logit[t]));
      acc += gate * cpu::quant_row_dot(shared_down, r, shared_h + t * S,
                                       shared_sums.data() + t * S / 64);
      out[item] = acc;
    }
  });
}

}  // namespace lily

// CPU Gated DeltaNet: causal depthwise conv + SiLU, and the gated delta rule recurrence.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/op_contract.h"

namespace lily {

namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void l2_normalize(float* x, int64_t dim) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < dim; ++i) sum_sq += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum_sq + 1e-6f);
  for (int64_t i = 0; i < dim; ++i) x[i] *= inv;
}

// The conv of one token (decode) for channels [begin, end): the same sums in the same order as
// the general loop below (acc from 0, taps 0..K-1 over the window rows, then the input), with
// the window shifted in place; `Tap` reads tap i of the weight as f32. The general loop's
// per-channel history copies and per-tap dtype checks were 4% of a 2-thread decode step.
template <typename Tap>
void conv1d_silu_one_token(const float* mixed, float* window, Tap tap, int64_t C, int64_t K,
                           int64_t begin, int64_t end, float* out) {
  for (int64_t c = begin; c < end; ++c) {
    const float x = mixed[c];
    float acc = 0.0f;
    for (int64_t j = 0; j < K - 1; ++j) acc += tap(c * K + j) * window[j * C + c];
    acc += tap(c * K + K - 1) * x;
    out[c] = cpu::silu(acc);
    for (int64_t j = 0; j + 1 < K - 1; ++j) window[j * C + c] = window[(j + 1) * C + c];
    if (K > 1) window[(K - 2) * C + c] = x;
  }
}

}  // namespace

void CpuBackend::conv1d_silu(const float* mixed, float* window, const DenseView& weight,
                             const GatedDeltaNetDims& dims, int64_t n, float* out) {
  contract::check_conv1d_silu(mixed, window, weight, dims, n, out);
  const int64_t C = dims.channels();
  const int64_t K = dims.conv_kernel;
  if (n == 1) {
    const std::byte* w = weight.data;
    pool_.parallel_for(C, [&](int64_t begin, int64_t end) {
      if (weight.dtype == DType::F32) {
        conv1d_silu_one_token(mixed, window, [w](int64_t i) {
          float v;
          std::memcpy(&v, w + 4 * i, 4);  // may sit unaligned in the checkpoint's mapping
          return v;
        }, C, K, begin, end, out);
      } else {
        conv1d_silu_one_token(mixed, window, [w](int64_t i) { return cpu::load_bf16(w + 2 * i); }, C,
                              K, begin, end, out);
      }
    });
    return;
  }
  pool_.parallel_for(C, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> taps, history;
    taps.resize(static_cast<size_t>(K));
    history.resize(static_cast<size_t>(K - 1 + n));
    for (int64_t c = begin; c < end; ++c) {
      for (int64_t j = 0; j < K; ++j) taps[static_cast<size_t>(j)] = cpu::dense_value(weight, c * K + j);
      // history = the cached K-1 inputs, then this chunk's inputs, for channel c.
      for (int64_t j = 0; j < K - 1; ++j) history[static_cast<size_t>(j)] = window[j * C + c];
      for (int64_t t = 0; t < n; ++t) history[static_cast<size_t>(K - 1 + t)] = mixed[t * C + c];
      for (int64_t t = 0; t < n; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < K; ++j) acc += taps[static_cast<size_t>(j)] * history[static_cast<size_t>(t + j)];
        out[t * C + c] = cpu::silu(acc);
      }
      for (int64_t j = 0; j < K - 1; ++j) window[j * C + c] = history[static_cast<size_t>(n + j)];
    }
  });
}

void CpuBackend::gated_delta_rule(const float* conv, const float* a, const float* b,
                                  const DenseView& a_log, const DenseView& dt_bias, float* state,
                                  const GatedDeltaNetDims& dims, int64_t n, float* out) {
  contract::check_gated_delta_rule(conv, a, b, a_log, dt_bias, state, dims, n, out);
  const int64_t Hv = dims.value_heads;
  const int64_t Dk = dims.key_dim;
  const int64_t Dv = dims.value_dim;
  const int64_t key_width = dims.key_heads * Dk;
  const int64_t C = dims.channels();
  const int64_t ratio = Hv / dims.key_heads;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  pool_.parallel_for(Hv, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> q, k, m;
    q.resize(static_cast<size_t>(Dk));
    k.resize(static_cast<size_t>(Dk));
    m.resize(static_cast<size_t>(Dv));
    for (int64_t h = begin; h < end; ++h) {
      const int64_t kh = h / ratio;
      const float decay_rate = std::exp(cpu::dense_value(a_log, h));
      const float bias = cpu::dense_value(dt_bias, h);
      float* S = state + h * Dk * Dv;  // [Dk, Dv]
      for (int64_t t = 0; t < n; ++t) {
        const float* row = conv + t * C;
        std::copy(row + kh * Dk, row + (kh + 1) * Dk, q.begin());
        std::copy(row + key_width + kh * Dk, row + key_width + (kh + 1) * Dk, k.begin());
        const float* v = row + 2 * key_width + h * Dv;
        l2_normalize(q.data(), Dk);
        l2_normalize(k.data(), Dk);
        for (float& x : q) x *= q_scale;
        const float beta = cpu::sigmoid(b[t * Hv + h]);
        const float alpha = std::exp(-decay_rate * softplus(a[t * Hv + h] + bias));
        std::fill(m.begin(), m.end(), 0.0f);
        for (int64_t i = 0; i < Dk; ++i) {
          float* Si = S + i * Dv;
          for (int64_t j = 0; j < Dv; ++j) {
            Si[j] *= alpha;
            m[static_cast<size_t>(j)] += Si[j] * k[static_cast<size_t>(i)];
          }
        }
        for (int64_t j = 0; j < Dv; ++j) m[static_cast<size_t>(j)] = beta * (v[j] - m[static_cast<size_t>(j)]);
        float* o = out + (t * Hv + h) * Dv;
        std::fill(o, o + Dv, 0.0f);
        for (int64_t i = 0; i < Dk; ++i) {
          float* Si = S + i * Dv;
          const float ki = k[static_cast<size_t>(i)];
          const float qi = q[static_cast<size_t>(i)];
          for (int64_t j = 0; j < Dv; ++j) {
            Si[j] += ki * m[static_cast<size_t>(j)];
            o[j] += Si[j] * qi;
          }
        }
      }
    }
  });
}

}  // namespace lily

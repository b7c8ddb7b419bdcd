// CPU Gated DeltaNet: causal depthwise conv + SiLU, and the gated delta rule recurrence.
#include <algorithm>
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

// Channels per item of the prefill's conv (conv1d_silu, n > 1).
constexpr int64_t kConvBlock = 64;

// The prefill's conv over one block of `width` <= kConvBlock channels for n tokens: x, out at
// the block's first channel of token 0, rows `stride` apart; taps f32 [K, kConvBlock]; history
// f32 [K-1, kConvBlock], the block's last K-1 inputs oldest first, updated. Cloned per target;
// with -ffp-contract=off every target gives the same bits (see conv1d_silu).
LILY_CPU_CLONES void conv_block_tokens(const float* x, int64_t stride, const float* taps,
                                       float* history, int64_t K, int64_t width, int64_t n,
                                       float* out) {
  float acc[kConvBlock];
  float input[kConvBlock];
  for (int64_t t = 0; t < n; ++t) {
    const float* row = x + t * stride;
    for (int64_t c = 0; c < width; ++c) {
      input[c] = row[c];
      acc[c] = 0.0f;
    }
    for (int64_t j = 0; j < K - 1; ++j) {
      const float* tap = taps + j * kConvBlock;
      const float* h = history + j * kConvBlock;
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) acc[c] += tap[c] * h[c];
    }
    const float* last = taps + (K - 1) * kConvBlock;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) acc[c] += last[c] * input[c];
    float* o = out + t * stride;
    for (int64_t c = 0; c < width; ++c) o[c] = cpu::silu(acc[c]);
    // The history moves up one row, the input becomes its newest.
    for (int64_t j = 0; j + 1 < K - 1; ++j) {
      std::copy(history + (j + 1) * kConvBlock, history + (j + 1) * kConvBlock + width,
                history + j * kConvBlock);
    }
    if (K > 1) std::copy(input, input + width, history + (K - 2) * kConvBlock);
  }
}

// The delta rule's work on the value columns [j0, j0 + cols) of one head (see
// delta_rule_token): Cols of them, a constant so that m and the output sums live in registers,
// or with Cols = 0 a tail of fewer than kMaxCols.
constexpr int64_t kMaxCols = 32;
template <int64_t Cols>
__attribute__((always_inline)) inline void delta_rule_columns(float* S, const float* q, const float* k,
                                                              const float* v, float alpha, float beta,
                                                              int64_t Dk, int64_t Dv, int64_t j0,
                                                              int64_t cols, float* o) {
  float m[static_cast<size_t>(Cols > 0 ? Cols : kMaxCols)] = {};
  float acc[static_cast<size_t>(Cols > 0 ? Cols : kMaxCols)] = {};
  const int64_t n = Cols > 0 ? Cols : cols;
  for (int64_t i = 0; i < Dk; ++i) {
    float* Si = S + i * Dv + j0;
    const float ki = k[i];
#pragma omp simd
    for (int64_t l = 0; l < n; ++l) {
      Si[l] *= alpha;
      m[l] += Si[l] * ki;
    }
  }
  for (int64_t l = 0; l < n; ++l) m[l] = beta * (v[j0 + l] - m[l]);
  for (int64_t i = 0; i < Dk; ++i) {
    float* Si = S + i * Dv + j0;
    const float ki = k[i];
    const float qi = q[i];
#pragma omp simd
    for (int64_t l = 0; l < n; ++l) {
      Si[l] += ki * m[l];
      acc[l] += Si[l] * qi;
    }
  }
  for (int64_t l = 0; l < n; ++l) o[j0 + l] = acc[l];
}

// One token of the delta rule for one value head: S f32 [Dk, Dv] (row i: key dim i) decayed
// by alpha, m = beta * (v - S^T k), S += k m^T, o = S^T q (o f32 [Dv]; q, k f32 [Dk], v f32
// [Dv]). In blocks of 32 value columns: a block's S (16 KB at Dk = 128) stays in L1 between the
// two passes and its m and o in registers (two independent chains of adds), where row-long
// passes streamed the head's 64 KB of state from L2 twice. Each element sees the same
// operations in the same order as row-long passes, and the file is built with
// -ffp-contract=off (CMakeLists.txt), so every target gives the same bits. Cloned per target
// (the rest of this file is baseline x86-64: SSE2, no FMA).
LILY_CPU_CLONES void delta_rule_token(float* S, const float* q, const float* k, const float* v,
                                      float alpha, float beta, int64_t Dk, int64_t Dv, float* o) {
  int64_t j0 = 0;
  for (; j0 + kMaxCols <= Dv; j0 += kMaxCols) {
    delta_rule_columns<kMaxCols>(S, q, k, v, alpha, beta, Dk, Dv, j0, kMaxCols, o);
  }
  if (j0 < Dv) delta_rule_columns<0>(S, q, k, v, alpha, beta, Dk, Dv, j0, Dv - j0, o);
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
  // Prefill: items of kConvBlock channels. Per token, the block's taps run over rows of
  // contiguous channels (one vector instruction per 8 or 16 channels) where a channel at a time
  // gathered every token's input a row (32 KB) apart. Each channel's sum is the one-token
  // path's: acc from 0, taps 0..K-2 over the history rows oldest first, then tap K-1 times the
  // input, as multiplies then adds (this file is built with -ffp-contract=off), so a prefill
  // gives each token the bits of its decode step. An input row is copied into the block's
  // history before the token's output row is written, so out may even be mixed.
  pool_.parallel_for((C + kConvBlock - 1) / kConvBlock, [&](int64_t begin, int64_t end) {
    // f32 [K, kConvBlock] each (history: K-1 rows used).
    thread_local std::vector<float> taps, history;
    taps.resize(static_cast<size_t>(K * kConvBlock));
    history.resize(static_cast<size_t>(K * kConvBlock));
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * kConvBlock;
      const int64_t width = std::min(kConvBlock, C - c0);
      for (int64_t j = 0; j < K; ++j) {
        for (int64_t c = 0; c < width; ++c) {
          taps[static_cast<size_t>(j * kConvBlock + c)] =
              cpu::dense_value(weight, (c0 + c) * K + j);
        }
      }
      for (int64_t j = 0; j < K - 1; ++j) {
        std::copy(window + j * C + c0, window + j * C + c0 + width,
                  history.data() + j * kConvBlock);
      }
      conv_block_tokens(mixed + c0, C, taps.data(), history.data(), K, width, n, out + c0);
      for (int64_t j = 0; j < K - 1; ++j) {
        std::copy(history.data() + j * kConvBlock, history.data() + j * kConvBlock + width,
                  window + j * C + c0);
      }
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
    thread_local std::vector<float> q, k;
    q.resize(static_cast<size_t>(Dk));
    k.resize(static_cast<size_t>(Dk));
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
        delta_rule_token(S, q.data(), k.data(), v, alpha, beta, Dk, Dv, out + (t * Hv + h) * Dv);
      }
    }
  });
}

}  // namespace lily

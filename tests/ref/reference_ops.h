// Float64 reference of every backend op, written from backend.h's op contracts (test-only).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

// Conventions: inputs are the same f32 values the backend receives, widened to double (the
// widening is exact); all arithmetic is in double; shapes follow backend.h. Ops that update
// state in place (residual, q/k, caches, conv window, recurrent state) take it as a double
// vector that they update. Nothing here shares code with src/backend.
namespace lily::ref {

std::vector<double> widen(std::span<const float> values);

// Element i of a BF16 or F32 dense tensor (exact).
double dense(const DenseView& t, int64_t i);

// W[row, col] of an MLX affine Q4/Q8 view: scale[g] * code + bias[g], g = col / 64. The
// product of a BF16 scale and a code below 256 and its sum with a BF16 bias are exact in
// double, so this is the real-valued weight the quantisation describes.
double quant_weight(const QuantView& w, int64_t row, int64_t col);

// out[t, :] = W[ids[t], :]                                        [n, in]
std::vector<double> embed(const QuantView& table, std::span<const int32_t> ids);

// y[t, r] = sum_c W[row_begin + r, c] x[t, c]                      [n, rows]
std::vector<double> matmul(const QuantView& w, int64_t row_begin, int64_t rows,
                           std::span<const double> x, int64_t n);

// out = x / sqrt(mean(x^2) + eps) * gain, per row of dim values.
std::vector<double> rms_norm(std::span<const double> x, const DenseView& gain, int64_t n,
                             int64_t dim, double eps);

// residual += delta (in place); returns rms_norm(residual).
std::vector<double> add_rms_norm(std::vector<double>& residual, std::span<const double> delta,
                                 const DenseView& gain, int64_t n, int64_t dim, double eps);

// How the RoPE angle is formed. transformers (and the CPU backend, by its own account) form
// inv_freq = 1 / theta^(2i/rot) and angle = inv_freq * position in f32; `exact` forms both in
// double (only used to show that the tests can tell the two apart).
enum class RopeAngle { f32_like_transformers, exact };
double rope_angle(const AttentionDims& dims, int64_t i, int64_t position, RopeAngle mode);

// In place on qg [n, q_heads, 2, head_dim] (query half only) and k [n, kv_heads, head_dim]:
// zero-centred RMSNorm per head with the baked gains, then NeoX rotate-half RoPE over the
// first rotary_dim dims at position start_pos + t.
void attention_prepare(std::vector<double>& qg, std::vector<double>& k, const DenseView& q_norm,
                       const DenseView& k_norm, const AttentionDims& dims, int64_t start_pos,
                       int64_t n, double eps, RopeAngle mode = RopeAngle::f32_like_transformers);

// Stores k, v at cache rows start_pos.., then out[t, h] = sigmoid(gate_h) * sum_j p_j v_j with
// p = softmax over j <= start_pos + t of (q_h . k_j) / sqrt(head_dim), kv head h / (Hq / Hkv).
std::vector<double> attention(std::span<const double> qg, std::span<const double> k,
                              std::span<const double> v, std::vector<double>& k_cache,
                              std::vector<double>& v_cache, int64_t capacity,
                              const AttentionDims& dims, int64_t start_pos, int64_t n);

// c_t[ch] = silu(sum_j w[ch, j] x_{t-(K-1)+j}[ch]), where x at negative times is read from the
// window (oldest first); the window becomes the last K-1 inputs.        out [n, C]
std::vector<double> conv1d_silu(std::span<const double> mixed, std::vector<double>& window,
                                const DenseView& weight, const GatedDeltaNetDims& dims,
                                int64_t n);

// The gated delta rule over n tokens (transformers' Qwen3.5 semantics); state [Hv, Dk, Dv]. Per
// token, conv splits into q [Hk, Dk] | k [Hk, Dk] | v [Hv, Dv]; value head h reads key head
// h / (Hv / Hk); q and k are L2-normalised (eps 1e-6), q also scaled by 1/sqrt(Dk);
// beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); then S <- exp(g) S,
// delta = beta (v - S^T k), S <- S + k delta^T, out = S^T q (the read sees the updated state).
std::vector<double> gated_delta_rule(std::span<const double> conv, std::span<const double> a,
                                     std::span<const double> b, const DenseView& a_log,
                                     const DenseView& dt_bias, std::vector<double>& state,
                                     const GatedDeltaNetDims& dims, int64_t n);

// out = x / sqrt(mean(x^2) + eps) * gain * silu(z), per row.
std::vector<double> gated_rms_norm(std::span<const double> x, std::span<const double> z,
                                   const DenseView& gain, int64_t rows, int64_t dim, double eps);

struct Routing {
  std::vector<int32_t> ids;     // [n, k]
  std::vector<double> weights;  // [n, k]
};
// p = softmax(logits); the k largest p (equal p: lower id first), weights p / sum of those k.
Routing moe_route(std::span<const double> logits, int64_t n, int64_t experts, int64_t k);

// h[t, j, :] = silu(G_e x_t) * U_e x_t, e = ids[t, j] (empty ids: expert 0).   [n, k, I]
std::vector<double> expert_swiglu(const QuantView& gate, const QuantView& up,
                                  std::span<const double> x, std::span<const int32_t> ids,
                                  int64_t n, int64_t k);

// out[t] = sum_j w[t, j] D_{ids[t, j]} h[t, j] + sigmoid(shared_logit[t]) D_s shared_h[t].
std::vector<double> expert_down_combine(const QuantView& down, std::span<const double> h,
                                        std::span<const int32_t> ids,
                                        std::span<const double> weights, int64_t n, int64_t k,
                                        const QuantView& shared_down,
                                        std::span<const double> shared_h,
                                        std::span<const double> shared_logit);

// Index of the largest value of each row (the first one on ties).
std::vector<int32_t> argmax(std::span<const double> logits, int64_t n, int64_t vocab);

}  // namespace lily::ref

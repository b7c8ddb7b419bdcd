// Float64 reference of every backend op: straight loops over the math, no vectorisation, no reuse of src/backend.
#include "ref/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/bf16.h"

namespace lily::ref {

namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

double silu(double x) { return x * sigmoid(x); }

// log(1 + e^x) without overflow for large x.
double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

// x / sqrt(mean(x^2) + eps) for one row.
double inverse_rms(const double* x, size_t dim, double eps) {
  double sum_sq = 0;
  for (size_t i = 0; i < dim; ++i) sum_sq += x[i] * x[i];
  return 1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps);
}

// One row of W (all `in` values).
std::vector<double> weight_row(const QuantView& w, int64_t row) {
  std::vector<double> out(sz(static_cast<int64_t>(w.in)));
  for (size_t c = 0; c < out.size(); ++c) out[c] = quant_weight(w, row, static_cast<int64_t>(c));
  return out;
}

double dot(const std::vector<double>& w, const double* x) {
  double acc = 0;
  for (size_t c = 0; c < w.size(); ++c) acc += w[c] * x[c];
  return acc;
}

}  // namespace

std::vector<double> widen(std::span<const float> values) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = static_cast<double>(values[i]);
  return out;
}

double dense(const DenseView& t, int64_t i) {
  if (t.dtype == DType::F32) {
    float v;
    std::memcpy(&v, t.data + sz(i) * 4, 4);
    return static_cast<double>(v);
  }
  uint16_t bits;
  std::memcpy(&bits, t.data + sz(i) * 2, 2);
  return static_cast<double>(bf16_to_f32(bits));
}

double quant_weight(const QuantView& w, int64_t row, int64_t col) {
  const auto bits = static_cast<uint64_t>(w.bits);
  const uint64_t codes_per_word = 32 / bits;
  const uint64_t words_per_row = w.in / codes_per_word;
  const uint64_t groups_per_row = w.in / 64;
  const auto r = static_cast<uint64_t>(row);
  const auto c = static_cast<uint64_t>(col);
  uint32_t word;
  std::memcpy(&word, w.codes + (r * words_per_row + c / codes_per_word) * 4, 4);
  const uint32_t code =
      (word >> (bits * (c % codes_per_word))) & ((1u << static_cast<uint32_t>(bits)) - 1u);
  uint16_t scale_bits;
  uint16_t bias_bits;
  std::memcpy(&scale_bits, w.scales + (r * groups_per_row + c / 64) * 2, 2);
  std::memcpy(&bias_bits, w.biases + (r * groups_per_row + c / 64) * 2, 2);
  return static_cast<double>(bf16_to_f32(scale_bits)) * static_cast<double>(code) +
         static_cast<double>(bf16_to_f32(bias_bits));
}

std::vector<double> embed(const QuantView& table, std::span<const int32_t> ids) {
  const auto in = static_cast<int64_t>(table.in);
  std::vector<double> out;
  out.reserve(ids.size() * sz(in));
  for (int32_t id : ids) {
    for (int64_t c = 0; c < in; ++c) out.push_back(quant_weight(table, id, c));
  }
  return out;
}

std::vector<double> matmul(const QuantView& w, int64_t row_begin, int64_t rows,
                           std::span<const double> x, int64_t n) {
  const auto in = sz(static_cast<int64_t>(w.in));
  std::vector<double> y(sz(n * rows));
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> wr = weight_row(w, row_begin + r);
    for (int64_t t = 0; t < n; ++t) y[sz(t * rows + r)] = dot(wr, x.data() + sz(t) * in);
  }
  return y;
}

std::vector<double> rms_norm(std::span<const double> x, const DenseView& gain, int64_t n,
                             int64_t dim, double eps) {
  std::vector<double> out(sz(n * dim));
  for (size_t t = 0; t < sz(n); ++t) {
    const double* row = x.data() + t * sz(dim);
    const double inv = inverse_rms(row, sz(dim), eps);
    for (size_t i = 0; i < sz(dim); ++i) {
      out[t * sz(dim) + i] = row[i] * inv * dense(gain, static_cast<int64_t>(i));
    }
  }
  return out;
}

std::vector<double> add_rms_norm(std::vector<double>& residual, std::span<const double> delta,
                                 const DenseView& gain, int64_t n, int64_t dim, double eps) {
  for (size_t i = 0; i < sz(n * dim); ++i) residual[i] += delta[i];
  return rms_norm(residual, gain, n, dim, eps);
}

double rope_angle(const AttentionDims& dims, int64_t i, int64_t position, RopeAngle mode) {
  if (mode == RopeAngle::exact) {
    const double exponent = static_cast<double>(2 * i) / static_cast<double>(dims.rotary_dim);
    return static_cast<double>(position) / std::pow(dims.rope_theta, exponent);
  }
  // transformers: inv_freq = 1.0 / (base ** (arange(0, rot, 2).float() / rot)) and
  // freqs = inv_freq.float() @ position_ids.float(), all f32 tensors. Each f32 operation is
  // mirrored as one correctly rounded step: the exponent is an f32 division, the power is
  // computed in double and rounded once to f32, 1/power is an f32 division, and the angle
  // is the f32 product of inv_freq and the position as f32.
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(dims.rotary_dim);
  const auto base = static_cast<float>(dims.rope_theta);
  const auto power =
      static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
  const float inv_freq = 1.0f / power;
  const float angle = inv_freq * static_cast<float>(position);
  return static_cast<double>(angle);  // cos and sin of this angle are then taken in double
}

void attention_prepare(std::vector<double>& qg, std::vector<double>& k, const DenseView& q_norm,
                       const DenseView& k_norm, const AttentionDims& dims, int64_t start_pos,
                       int64_t n, double eps, RopeAngle mode) {
  const size_t D = sz(dims.head_dim);
  const size_t half = sz(dims.rotary_dim / 2);
  auto norm_and_rotate = [&](double* x, const DenseView& gain, int64_t position) {
    const double inv = inverse_rms(x, D, eps);
    for (size_t i = 0; i < D; ++i) x[i] = x[i] * inv * dense(gain, static_cast<int64_t>(i));
    // rotate-half: (x_i, x_{i+half}) -> (x_i cos - x_{i+half} sin, x_{i+half} cos + x_i sin)
    for (size_t i = 0; i < half; ++i) {
      const double theta = rope_angle(dims, static_cast<int64_t>(i), position, mode);
      const double c = std::cos(theta);
      const double s = std::sin(theta);
      const double lo = x[i];
      const double hi = x[i + half];
      x[i] = lo * c - hi * s;
      x[i + half] = hi * c + lo * s;
    }
  };
  for (int64_t t = 0; t < n; ++t) {
    for (size_t h = 0; h < sz(dims.q_heads); ++h) {
      norm_and_rotate(qg.data() + (sz(t) * sz(dims.q_heads) + h) * 2 * D, q_norm, start_pos + t);
    }
    for (size_t h = 0; h < sz(dims.kv_heads); ++h) {
      norm_and_rotate(k.data() + (sz(t) * sz(dims.kv_heads) + h) * D, k_norm, start_pos + t);
    }
  }
}

std::vector<double> attention(std::span<const double> qg, std::span<const double> k,
                              std::span<const double> v, std::vector<double>& k_cache,
                              std::vector<double>& v_cache, int64_t capacity,
                              const AttentionDims& dims, int64_t start_pos, int64_t n) {
  const size_t D = sz(dims.head_dim);
  const size_t Hq = sz(dims.q_heads);
  const size_t Hkv = sz(dims.kv_heads);
  const size_t row = Hkv * D;
  k_cache.resize(sz(capacity) * row);
  v_cache.resize(sz(capacity) * row);
  for (size_t t = 0; t < sz(n); ++t) {
    for (size_t i = 0; i < row; ++i) {
      k_cache[(sz(start_pos) + t) * row + i] = k[t * row + i];
      v_cache[(sz(start_pos) + t) * row + i] = v[t * row + i];
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> out(sz(n) * Hq * D);
  for (size_t t = 0; t < sz(n); ++t) {
    const size_t keys = sz(start_pos) + t + 1;  // causal: cache rows 0..start_pos+t
    for (size_t h = 0; h < Hq; ++h) {
      const size_t kvh = h / (Hq / Hkv);
      const double* q = qg.data() + (t * Hq + h) * 2 * D;
      const double* gate = q + D;
      std::vector<double> p(keys);
      for (size_t j = 0; j < keys; ++j) {
        double s = 0;
        for (size_t i = 0; i < D; ++i) s += q[i] * k_cache[j * row + kvh * D + i];
        p[j] = s * scale;
      }
      double top = -HUGE_VAL;
      for (double x : p) top = std::max(top, x);
      double total = 0;
      for (double& x : p) {
        x = std::exp(x - top);
        total += x;
      }
      for (size_t i = 0; i < D; ++i) {
        double acc = 0;
        for (size_t j = 0; j < keys; ++j) acc += p[j] / total * v_cache[j * row + kvh * D + i];
        out[(t * Hq + h) * D + i] = acc * sigmoid(gate[i]);
      }
    }
  }
  return out;
}

std::vector<double> conv1d_silu(std::span<const double> mixed, std::vector<double>& window,
                                const DenseView& weight, const GatedDeltaNetDims& dims,
                                int64_t n) {
  const auto C = static_cast<int64_t>(dims.channels());
  const int64_t K = dims.conv_kernel;
  // input at time u (u < 0: window row K-1+u, the window holding times -(K-1)..-1).
  auto input = [&](int64_t u, int64_t c) {
    return u < 0 ? window[sz((K - 1 + u) * C + c)] : mixed[sz(u * C + c)];
  };
  std::vector<double> out(sz(n * C));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) acc += dense(weight, c * K + j) * input(t - (K - 1) + j, c);
      out[sz(t * C + c)] = silu(acc);
    }
  }
  std::vector<double> next(window.size());
  for (int64_t r = 0; r < K - 1; ++r) {  // new window row r holds time n-(K-1)+r
    for (int64_t c = 0; c < C; ++c) next[sz(r * C + c)] = input(n - (K - 1) + r, c);
  }
  window = next;
  return out;
}

std::vector<double> gated_delta_rule(std::span<const double> conv, std::span<const double> a,
                                     std::span<const double> b, const DenseView& a_log,
                                     const DenseView& dt_bias, std::vector<double>& state,
                                     const GatedDeltaNetDims& dims, int64_t n) {
  const size_t Hk = sz(dims.key_heads);
  const size_t Hv = sz(dims.value_heads);
  const size_t Dk = sz(dims.key_dim);
  const size_t Dv = sz(dims.value_dim);
  const size_t C = sz(dims.channels());
  std::vector<double> out(sz(n) * Hv * Dv);
  for (size_t t = 0; t < sz(n); ++t) {
    const double* row = conv.data() + t * C;
    for (size_t h = 0; h < Hv; ++h) {
      const size_t kh = h / (Hv / Hk);
      // split: q [Hk, Dk] | k [Hk, Dk] | v [Hv, Dv]
      std::vector<double> q(row + kh * Dk, row + (kh + 1) * Dk);
      std::vector<double> kk(row + Hk * Dk + kh * Dk, row + Hk * Dk + (kh + 1) * Dk);
      const double* v = row + 2 * Hk * Dk + h * Dv;
      double qq = 0;
      double kn = 0;
      for (size_t i = 0; i < Dk; ++i) {
        qq += q[i] * q[i];
        kn += kk[i] * kk[i];
      }
      for (size_t i = 0; i < Dk; ++i) {
        q[i] = q[i] / std::sqrt(qq + 1e-6) / std::sqrt(static_cast<double>(Dk));
        kk[i] = kk[i] / std::sqrt(kn + 1e-6);
      }
      const double beta = sigmoid(b[t * Hv + h]);
      const double g = -std::exp(dense(a_log, static_cast<int64_t>(h))) *
                       softplus(a[t * Hv + h] + dense(dt_bias, static_cast<int64_t>(h)));
      const double alpha = std::exp(g);
      double* S = state.data() + h * Dk * Dv;  // S[i][j], i over keys, j over values
      for (size_t e = 0; e < Dk * Dv; ++e) S[e] *= alpha;
      std::vector<double> delta(Dv);
      for (size_t j = 0; j < Dv; ++j) {
        double m = 0;  // (S^T k)_j
        for (size_t i = 0; i < Dk; ++i) m += S[i * Dv + j] * kk[i];
        delta[j] = beta * (v[j] - m);
      }
      for (size_t i = 0; i < Dk; ++i) {
        for (size_t j = 0; j < Dv; ++j) S[i * Dv + j] += kk[i] * delta[j];
      }
      for (size_t j = 0; j < Dv; ++j) {
        double o = 0;  // (S^T q)_j with the updated S
        for (size_t i = 0; i < Dk; ++i) o += S[i * Dv + j] * q[i];
        out[(t * Hv + h) * Dv + j] = o;
      }
    }
  }
  return out;
}

std::vector<double> gated_rms_norm(std::span<const double> x, std::span<const double> z,
                                   const DenseView& gain, int64_t rows, int64_t dim,
                                   double eps) {
  std::vector<double> out = rms_norm(x, gain, rows, dim, eps);
  for (size_t i = 0; i < out.size(); ++i) out[i] *= silu(z[i]);
  return out;
}

Routing moe_route(std::span<const double> logits, int64_t n, int64_t experts, int64_t k) {
  Routing r;
  const size_t E = sz(experts);
  for (size_t t = 0; t < sz(n); ++t) {
    const double* l = logits.data() + t * E;
    double top = -HUGE_VAL;
    for (size_t e = 0; e < E; ++e) top = std::max(top, l[e]);
    std::vector<double> p(E);
    double total = 0;
    for (size_t e = 0; e < E; ++e) {
      p[e] = std::exp(l[e] - top);
      total += p[e];
    }
    for (double& x : p) x /= total;
    std::vector<int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    // Ties keep the lower expert first. std::sort with the id as tie-break rather than
    // std::stable_sort, whose libstdc++ 12 implementation clang 19 flags as deprecated.
    std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
      return p[sz(x)] > p[sz(y)] || (p[sz(x)] == p[sz(y)] && x < y);
    });
    double top_sum = 0;
    for (size_t j = 0; j < sz(k); ++j) top_sum += p[sz(order[j])];
    for (size_t j = 0; j < sz(k); ++j) {
      r.ids.push_back(order[j]);
      r.weights.push_back(p[sz(order[j])] / top_sum);
    }
  }
  return r;
}

std::vector<double> expert_swiglu(const QuantView& gate, const QuantView& up,
                                  std::span<const double> x, std::span<const int32_t> ids,
                                  int64_t n, int64_t k) {
  const auto I = static_cast<int64_t>(gate.out);
  const size_t in = sz(static_cast<int64_t>(gate.in));
  std::vector<double> h(sz(n * k * I));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids.empty() ? 0 : ids[sz(t * k + j)];
      for (int64_t r = 0; r < I; ++r) {
        const double g = dot(weight_row(gate, e * I + r), x.data() + sz(t) * in);
        const double u = dot(weight_row(up, e * I + r), x.data() + sz(t) * in);
        h[sz((t * k + j) * I + r)] = silu(g) * u;
      }
    }
  }
  return h;
}

std::vector<double> expert_down_combine(const QuantView& down, std::span<const double> h,
                                        std::span<const int32_t> ids,
                                        std::span<const double> weights, int64_t n, int64_t k,
                                        const QuantView& shared_down,
                                        std::span<const double> shared_h,
                                        std::span<const double> shared_logit) {
  const auto H = static_cast<int64_t>(down.out);
  const size_t I = sz(static_cast<int64_t>(down.in));
  const size_t S = sz(static_cast<int64_t>(shared_down.in));
  std::vector<double> out(sz(n * H));
  for (int64_t r = 0; r < H; ++r) {
    const std::vector<double> shared_row = weight_row(shared_down, r);
    for (int64_t t = 0; t < n; ++t) {
      double acc = 0;
      for (int64_t j = 0; j < k; ++j) {
        const size_t slot = sz(t * k + j);
        acc += weights[slot] * dot(weight_row(down, ids[slot] * H + r), h.data() + slot * I);
      }
      acc += sigmoid(shared_logit[sz(t)]) * dot(shared_row, shared_h.data() + sz(t) * S);
      out[sz(t * H + r)] = acc;
    }
  }
  return out;
}

std::vector<int32_t> argmax(std::span<const double> logits, int64_t n, int64_t vocab) {
  std::vector<int32_t> out;
  for (size_t t = 0; t < sz(n); ++t) {
    size_t best = 0;
    for (size_t i = 0; i < sz(vocab); ++i) {
      if (logits[t * sz(vocab) + i] > logits[t * sz(vocab) + best]) best = i;
    }
    out.push_back(static_cast<int32_t>(best));
  }
  return out;
}

}  // namespace lily::ref

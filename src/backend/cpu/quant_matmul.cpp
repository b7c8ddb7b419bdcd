// CPU quantized matmul over MLX affine Q4/Q8 weights, used in place from the mapping.
#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/int8_dot.h"
#include "backend/op_contract.h"

namespace lily::cpu {

LILY_CPU_CLONES float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

namespace {
// dot_heads for H heads at once: one vector of kDotLanes partial sums per head (lane l takes
// the elements i = l mod kDotLanes, in order), so each key chunk is loaded once for all heads
// and the H chains of multiply-adds run side by side; then each head's lanes are summed in a
// fixed tree and its tail (n mod kDotLanes) added in order. A head's result does not depend on H.
constexpr int kDotLanes = 8;
template <int H>
__attribute__((always_inline)) inline void dot_heads_block(const float* q, int64_t q_stride,
                                                           const float* k, int64_t n, float* out) {
  float acc[static_cast<size_t>(H)][kDotLanes] = {};
  int64_t i = 0;
  for (; i + kDotLanes <= n; i += kDotLanes) {
    for (int g = 0; g < H; ++g) {
      const float* qg = q + g * q_stride + i;
#pragma omp simd
      for (int l = 0; l < kDotLanes; ++l) acc[g][l] += qg[l] * k[i + l];
    }
  }
  for (int g = 0; g < H; ++g) {
    const float* a = acc[g];
    float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (int64_t j = i; j < n; ++j) s += q[g * q_stride + j] * k[j];
    out[g] = s;
  }
}
}  // namespace

LILY_CPU_CLONES void dot_heads(const float* q, int64_t q_stride, int64_t heads, const float* k,
                               int64_t n, float* out) {
  for (int64_t g0 = 0; g0 < heads; g0 += 8) {
    const float* qg = q + g0 * q_stride;
    float* o = out + g0;
    switch (std::min<int64_t>(8, heads - g0)) {
      case 1: dot_heads_block<1>(qg, q_stride, k, n, o); break;
      case 2: dot_heads_block<2>(qg, q_stride, k, n, o); break;
      case 3: dot_heads_block<3>(qg, q_stride, k, n, o); break;
      case 4: dot_heads_block<4>(qg, q_stride, k, n, o); break;
      case 5: dot_heads_block<5>(qg, q_stride, k, n, o); break;
      case 6: dot_heads_block<6>(qg, q_stride, k, n, o); break;
      case 7: dot_heads_block<7>(qg, q_stride, k, n, o); break;
      default: dot_heads_block<8>(qg, q_stride, k, n, o); break;
    }
  }
}

namespace {
// dot_heads_block for two keys: each q chunk loaded once for both; per key the same lanes and
// order as dot_heads_block, so the same bits.
template <int H>
__attribute__((always_inline)) inline void dot_heads_pair_block(const float* q, int64_t q_stride,
                                                                const float* k0, const float* k1,
                                                                int64_t n, float* out0,
                                                                float* out1) {
  float acc0[static_cast<size_t>(H)][kDotLanes] = {};
  float acc1[static_cast<size_t>(H)][kDotLanes] = {};
  int64_t i = 0;
  for (; i + kDotLanes <= n; i += kDotLanes) {
    for (int g = 0; g < H; ++g) {
      const float* qg = q + g * q_stride + i;
#pragma omp simd
      for (int l = 0; l < kDotLanes; ++l) {
        acc0[g][l] += qg[l] * k0[i + l];
        acc1[g][l] += qg[l] * k1[i + l];
      }
    }
  }
  for (int g = 0; g < H; ++g) {
    const float* a = acc0[g];
    const float* b = acc1[g];
    float s0 = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    float s1 = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
    for (int64_t j = i; j < n; ++j) s0 += q[g * q_stride + j] * k0[j];
    for (int64_t j = i; j < n; ++j) s1 += q[g * q_stride + j] * k1[j];
    out0[g] = s0;
    out1[g] = s1;
  }
}

// axpy_rows_heads for H heads: per block of 8 values, every head's accumulators, then each x row
// loaded once and added into all of them (per head in the same order whatever H is).
template <int H>
__attribute__((always_inline)) inline void axpy_rows_heads_block(const float* alpha,
                                                                 int64_t alpha_stride, int64_t rows,
                                                                 const float* x, int64_t x_stride,
                                                                 float* y, int64_t y_stride,
                                                                 int64_t n) {
  constexpr int kLanes = 8;
  int64_t i0 = 0;
  for (; i0 + kLanes <= n; i0 += kLanes) {
    float acc[static_cast<size_t>(H)][kLanes];
    for (int g = 0; g < H; ++g) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) acc[g][l] = y[g * y_stride + i0 + l];
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * x_stride + i0;
      for (int g = 0; g < H; ++g) {
        const float a = alpha[g * alpha_stride + r];
#pragma omp simd
        for (int l = 0; l < kLanes; ++l) acc[g][l] += a * xr[l];
      }
    }
    for (int g = 0; g < H; ++g) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) y[g * y_stride + i0 + l] = acc[g][l];
    }
  }
  for (; i0 < n; ++i0) {
    for (int g = 0; g < H; ++g) {
      float acc = y[g * y_stride + i0];
      for (int64_t r = 0; r < rows; ++r) acc += alpha[g * alpha_stride + r] * x[r * x_stride + i0];
      y[g * y_stride + i0] = acc;
    }
  }
}
}  // namespace

LILY_CPU_CLONES void dot_heads_pair(const float* q, int64_t q_stride, int64_t heads,
                                    const float* k0, const float* k1, int64_t n, float* out0,
                                    float* out1) {
  for (int64_t g0 = 0; g0 < heads; g0 += 8) {
    const float* qg = q + g0 * q_stride;
    float* o0 = out0 + g0;
    float* o1 = out1 + g0;
    // clang-format off
    switch (std::min<int64_t>(8, heads - g0)) {
      case 1: dot_heads_pair_block<1>(qg, q_stride, k0, k1, n, o0, o1); break;
      case 2: dot_heads_pair_block<2>(qg, q_stride, k0, k1, n, o0, o1); break;
      case 3: dot_heads_pair_block<3>(qg, q_stride, k0, k1, n, o0, o1); break;
      case 4: dot_heads_pair_block<4>(qg, q_stride, k0, k1, n, o0, o1); break;
      case 5: dot_heads_pair_block<5>(qg, q_stride, k0, k1, n, o0, o1); break;
      case 6: dot_heads_pair_block<6>(qg, q_stride, k0, k1, n, o0, o1); break;
      case 7: dot_heads_pair_block<7>(qg, q_stride, k0, k1, n, o0, o1); break;
      default: dot_heads_pair_block<8>(qg, q_stride, k0, k1, n, o0, o1); break;
    }
    // clang-format on
  }
}

LILY_CPU_CLONES void axpy_rows_heads(const float* alpha, int64_t alpha_stride, int64_t heads,
                                     int64_t rows, const float* x, int64_t x_stride, float* y,
                                     int64_t y_stride, int64_t n) {
  for (int64_t g0 = 0; g0 < heads; g0 += 8) {
    const float* a = alpha + g0 * alpha_stride;
    float* yg = y + g0 * y_stride;
    // clang-format off
    switch (std::min<int64_t>(8, heads - g0)) {
      case 1: axpy_rows_heads_block<1>(a, alpha_stride, rows, x, x_stride, yg, y_stride, n); break;
      case 2: axpy_rows_heads_block<2>(a, alpha_stride, rows, x, x_stride, yg, y_stride, n); break;
      case 3: axpy_rows_heads_block<3>(a, alpha_stride, rows, x, x_stride, yg, y_stride, n); break;
      case 4: axpy_rows_heads_block<4>(a, alpha_stride, rows, x, x_stride, yg, y_stride, n); break;
      case 5: axpy_rows_heads_block<5>(a, alpha_stride, rows, x, x_stride, yg, y_stride, n); break;
      case 6: axpy_rows_heads_block<6>(a, alpha_stride, rows, x, x_stride, yg, y_stride, n); break;
      case 7: axpy_rows_heads_block<7>(a, alpha_stride, rows, x, x_stride, yg, y_stride, n); break;
      default: axpy_rows_heads_block<8>(a, alpha_stride, rows, x, x_stride, yg, y_stride, n); break;
    }
    // clang-format on
  }
}

LILY_CPU_CLONES void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

namespace {

// Unpacks the 64 codes of group g of a row (low bits first) into floats.
template <int Bits>
inline void unpack_group(const std::byte* codes, int64_t g, float* q) {
  constexpr int kPerWord = 32 / Bits;
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  constexpr int kWords = 64 / kPerWord;
  for (int w = 0; w < kWords; ++w) {
    const uint32_t packed = load_u32(codes + (g * kWords + w) * 4);
#pragma omp simd
    for (int j = 0; j < kPerWord; ++j) {
      q[w * kPerWord + j] = static_cast<float>((packed >> (Bits * j)) & kMask);
    }
  }
}

// Q4: byte i of a group holds elements 2i (low nibble) and 2i+1 (high nibble).
LILY_CPU_CLONES float row_dot_q4(const QuantView& w, int64_t row, const float* xp,
                                 const float* sums) {
  const auto in = static_cast<int64_t>(w.in);
  const int64_t groups = in / 64;
  const auto* codes = reinterpret_cast<const uint8_t*>(w.codes + row * in / 2);
  const std::byte* scales = w.scales + row * groups * 2;
  const std::byte* biases = w.biases + row * groups * 2;
  float acc = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* c = codes + g * 32;
    const float* even = xp + g * 64;
    const float* odd = even + 32;
    float d = 0.0f;
#pragma omp simd reduction(+ : d)
    for (int i = 0; i < 32; ++i) {
      d += static_cast<float>(c[i] & 15u) * even[i] + static_cast<float>(c[i] >> 4) * odd[i];
    }
    acc += load_bf16(scales + g * 2) * d + load_bf16(biases + g * 2) * sums[g];
  }
  return acc;
}

// Q8: byte i is element i; element 2b pairs with even[b], 2b+1 with odd[b].
LILY_CPU_CLONES float row_dot_q8(const QuantView& w, int64_t row, const float* xp,
                                 const float* sums) {
  const auto in = static_cast<int64_t>(w.in);
  const int64_t groups = in / 64;
  const auto* codes = reinterpret_cast<const uint8_t*>(w.codes + row * in);
  const std::byte* scales = w.scales + row * groups * 2;
  const std::byte* biases = w.biases + row * groups * 2;
  float acc = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* c = codes + g * 64;
    const float* even = xp + g * 64;
    const float* odd = even + 32;
    float d = 0.0f;
#pragma omp simd reduction(+ : d)
    for (int i = 0; i < 32; ++i) {
      d += static_cast<float>(c[2 * i]) * even[i] + static_cast<float>(c[2 * i + 1]) * odd[i];
    }
    acc += load_bf16(scales + g * 2) * d + load_bf16(biases + g * 2) * sums[g];
  }
  return acc;
}

// Dequantises a whole row: w = scale * q + bias per group of 64 (multiply, then add).
template <int Bits>
inline void dequantize_row_f32(const std::byte* codes, const std::byte* scales,
                               const std::byte* biases, int64_t groups, float* w) {
  alignas(64) float q[64];
  for (int64_t g = 0; g < groups; ++g) {
    unpack_group<Bits>(codes, g, q);
    const float s = load_bf16(scales + g * 2);
    const float b = load_bf16(biases + g * 2);
#pragma omp simd
    for (int i = 0; i < 64; ++i) {
      const float scaled = s * q[i];
      w[g * 64 + i] = scaled + b;
    }
  }
}

LILY_CPU_CLONES void dequantize_row_q4(const std::byte* codes, const std::byte* scales,
                                       const std::byte* biases, int64_t groups, float* w) {
  dequantize_row_f32<4>(codes, scales, biases, groups, w);
}
LILY_CPU_CLONES void dequantize_row_q8(const std::byte* codes, const std::byte* scales,
                                       const std::byte* biases, int64_t groups, float* w) {
  dequantize_row_f32<8>(codes, scales, biases, groups, w);
}

}  // namespace

float quant_row_dot(const QuantView& w, int64_t row, const float* permuted, const float* sums) {
  return w.bits == 4 ? row_dot_q4(w, row, permuted, sums) : row_dot_q8(w, row, permuted, sums);
}

LILY_CPU_CLONES void prepare_input(const float* x, int64_t in, float* permuted, float* sums) {
  for (int64_t g = 0; g < in / 64; ++g) {
    const float* xg = x + g * 64;
    float* pg = permuted + g * 64;
    float s = 0.0f;
    for (int i = 0; i < 32; ++i) {
      pg[i] = xg[2 * i];
      pg[32 + i] = xg[2 * i + 1];
      s += xg[2 * i] + xg[2 * i + 1];
    }
    sums[g] = s;
  }
}

void DecodedRow::load(const QuantView& weight, int64_t row) {
  const auto in = static_cast<int64_t>(weight.in);
  const int64_t groups = in / 64;
  w.resize(static_cast<size_t>(in));
  const std::byte* codes = weight.codes + row * in * weight.bits / 8;
  const std::byte* scales = weight.scales + row * groups * 2;
  const std::byte* biases = weight.biases + row * groups * 2;
  if (weight.bits == 4) {
    dequantize_row_q4(codes, scales, biases, groups, w.data());
  } else {
    dequantize_row_q8(codes, scales, biases, groups, w.data());
  }
}

}  // namespace lily::cpu

namespace lily {

// Here, beside prepare_input's definition: a target_clones function called from another file
// gets a resolver there that may not find the clones at link time.
void CpuBackend::DecodeInput::prepare(const float* x, int64_t in, int planes) {
  fast = planes > 0;
  if (fast) {
    cpu::quantize_activations(x, in, q8, planes);
    return;
  }
  if (permuted.size() < static_cast<size_t>(in)) permuted.resize(static_cast<size_t>(in));
  if (sums.size() < static_cast<size_t>(in / 64)) sums.resize(static_cast<size_t>(in / 64));
  cpu::prepare_input(x, in, permuted.data(), sums.data());
}

float CpuBackend::DecodeInput::dot(const QuantView& w, int64_t row) const {
  return fast ? cpu::int8_row_dot(w, row, q8) : cpu::quant_row_dot(w, row, permuted.data(), sums.data());
}

void CpuBackend::DecodeInput::dots(const QuantView& w, int64_t row_begin, int64_t rows, float* y) const {
  if (fast) return cpu::int8_rows_dot(w, row_begin, rows, q8, y);
  for (int64_t r = 0; r < rows; ++r) y[r] = cpu::quant_row_dot(w, row_begin + r, permuted.data(), sums.data());
}

const cpu::Q8Activations* const* CpuBackend::quantize_tokens(const float* x, int64_t count,
                                                             int64_t in, size_t first, int planes,
                                                             const char* op) {
  const size_t end = first + static_cast<size_t>(count);
  if (prefill_q8_.size() < end) prefill_q8_.resize(end);
  if (prefill_ptrs_.size() < end) prefill_ptrs_.resize(end);
  // A worker must not throw (the pool does not carry exceptions): the first bad row is noted
  // and quantised again here, where its error can be raised.
  std::atomic<int64_t> bad{count};
  pool_.parallel_for(count, [&](int64_t begin, int64_t stop) {
    for (int64_t t = begin; t < stop; ++t) {
      cpu::Q8Activations& q = prefill_q8_[first + static_cast<size_t>(t)];
      try {
        cpu::quantize_activations(x + t * in, in, q, planes);
      } catch (const std::invalid_argument&) {
        int64_t seen = bad.load();
        while (t < seen && !bad.compare_exchange_weak(seen, t)) {
        }
      }
      prefill_ptrs_[first + static_cast<size_t>(t)] = &q;
    }
  });
  if (const int64_t t = bad.load(); t < count) {
    try {
      cpu::quantize_activations(x + t * in, in, prefill_q8_[first + static_cast<size_t>(t)],
                                planes);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(op) + ": input row " + std::to_string(t) + ": " + e.what());
    }
  }
  return prefill_ptrs_.data() + first;
}

void CpuBackend::matmul(const QuantView& w, int64_t row_begin, int64_t rows, const float* x,
                        int64_t n, float* y) {
  contract::check_matmul(w, row_begin, rows, x, n, y);
  const auto in = static_cast<int64_t>(w.in);
  if (n > 1 && precision_ != CpuPrecision::exact) {
    // Prefill on integer dots: the n tokens quantised once, each row tile's codes unpacked
    // once for many tokens; y[t, r] is bit for bit what n == 1 gives for token t.
    const cpu::Q8Activations* const* xs = quantize_tokens(x, n, in, 0, planes_for(w), "matmul");
    pool_.parallel_for(rows, [&](int64_t begin, int64_t end) {
      cpu::int8_rows_dot_tokens(w, row_begin + begin, end - begin, xs, n, y + begin, rows);
    });
    return;
  }
  // Decode (n == 1) reads the packed rows with the input prepared once for the precision
  // (exact f32 or int8); the exact prefill dequantises rows.
  DecodeInput* input = nullptr;
  if (n == 1) {
    input = &decode_input(0);
    input->prepare(x, in, planes_for(w));
  }
  pool_.parallel_for(rows, [&](int64_t begin, int64_t end) {
    if (n == 1) {  // decode: one pass over the packed rows
      input->dots(w, row_begin + begin, end - begin, y + begin);
      return;
    }
    thread_local cpu::DecodedRow decoded;  // prefill: unpack each row once, reuse it for every token
    for (int64_t r = begin; r < end; ++r) {
      decoded.load(w, row_begin + r);
      for (int64_t t = 0; t < n; ++t) {
        y[t * rows + r] = decoded.dot(x + t * in);
      }
    }
  });
}

void CpuBackend::matmul_group(std::span<const MatmulTarget> targets, const float* x, int64_t n) {
  bool same_input = true;  // the same width and the same activation planes
  int64_t total = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const MatmulTarget& t = targets[i];
    contract::check_matmul_target(t, i, x, n, "matmul_group", "matmul");
    same_input =
        same_input && t.w->in == targets[0].w->in && planes_for(*t.w) == planes_for(*targets[0].w);
    total += t.rows;
  }
  // Prefill, or targets that take different inputs (which no model group has): one matmul each.
  if (n != 1 || !same_input || targets.empty()) return Backend::matmul_group(targets, x, n);
  DecodeInput& input = decode_input(0);
  input.prepare(x, static_cast<int64_t>(targets[0].w->in), planes_for(*targets[0].w));
  // Item i is row i of the targets' rows laid end to end; a thread's range may span targets.
  pool_.parallel_for(total, [&](int64_t begin, int64_t end) {
    int64_t first = 0;  // the targets' first item
    for (const MatmulTarget& t : targets) {
      const int64_t lo = std::max(begin, first);
      const int64_t hi = std::min(end, first + t.rows);
      if (lo < hi) input.dots(*t.w, t.row_begin + (lo - first), hi - lo, t.y + (lo - first));
      first += t.rows;
    }
  });
}

void CpuBackend::embed(const QuantView& table, const int32_t* ids, int64_t n, float* out) {
  contract::check_embed(table, ids, n, out);
  const auto in = static_cast<int64_t>(table.in);
  // The ids are in host memory here: checked too (a device backend cannot read them).
  for (int64_t t = 0; t < n; ++t) {
    cpu::require(ids[t] >= 0 && static_cast<uint64_t>(ids[t]) < table.rows(), "embed",
                 "token id " + std::to_string(ids[t]) + " outside the vocabulary of " +
                     std::to_string(table.rows()));
  }
  pool_.parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const auto row = static_cast<int64_t>(ids[t]);
      const int64_t groups = in / 64;
      const int per_word = 32 / table.bits;
      const uint32_t mask = (1u << table.bits) - 1u;
      for (int64_t c = 0; c < in; ++c) {
        const int64_t word = row * in / per_word + c / per_word;
        const uint32_t packed = cpu::load_u32(table.codes + word * 4);
        const auto q = static_cast<float>(
            (packed >> (static_cast<uint32_t>(table.bits) * static_cast<uint32_t>(c % per_word))) & mask);
        const float s = cpu::load_bf16(table.scales + (row * groups + c / 64) * 2);
        const float b = cpu::load_bf16(table.biases + (row * groups + c / 64) * 2);
        const float scaled = s * q;
        out[t * in + c] = scaled + b;
      }
    }
  });
}

}  // namespace lily

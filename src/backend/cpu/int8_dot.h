// CPU int8 GEMV kernel: activations quantised to int8 per group of 64, integer dots against Q4/Q8 codes.
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/weights.h"

namespace lily::cpu {

// Issue 19's fast path (--cpu-precision fast): the one-token products (int8_rows_dot) and the
// prefill's many-token products (int8_rows_dot_tokens) of CpuBackend. Precision and measured
// error: docs/precision.md, "The int8 fast path".

// The instruction set a dot runs on. `automatic` is the best one the CPU has
// (__builtin_cpu_supports at the first call); the others force a path, for the tests and
// the benchmark, and are an error (std::invalid_argument) where the CPU lacks it.
enum class Int8Isa {
  automatic,
  avx512_vnni,  // 512-bit vpdpbusd (AVX-512 F, BW, VL and VNNI)
  avx_vnni,     // 256-bit vpdpbusd, VEX encoded (AVX-VNNI, with AVX2)
  avx2,         // vpmaddubsw + vpmaddwd (Q4), widening vpmaddwd (Q8); AVX2 and FMA
  scalar,       // portable C++
};

// The name of the path `automatic` chooses on this CPU: "avx512_vnni", "avx_vnni", "avx2" or
// "scalar".
const char* int8_dot_isa();
// The name of any path ("automatic" resolves to the chosen one).
const char* int8_isa_name(Int8Isa isa);
// Whether this CPU can run the path (`automatic` and `scalar`: always).
bool int8_isa_supported(Int8Isa isa);

// An f32 input vector x [in] quantised for the integer dots, in one or two int8 planes.
// in % 64 == 0. Per group g of 64 elements, with s = max|x| / 127 (f32): the hi code is the
// nearest integer of x / s (ties to even), in [-127, 127] (-128 is never produced: the range is
// symmetric). An all-zero group has scale 0 and codes 0.
//
// Two planes (--cpu-precision fast): the lo code is the nearest integer of (x / s - hi) * 128,
// in [-64, 64]. x is approximated by the combined code 128 * hi + lo times scale[g] = s / 128,
// within s / 256. sums[g] is the sum of the group's unquantised x, added in float64 and rounded
// once to f32, for the bias term: only the scale term is quantised, w_bias * sum(x) stays as
// exact as in the f32 path.
//
// One plane (--cpu-precision q8, llama.cpp's Q8 activations): x is approximated by hi times
// scale[g] = s, within s / 2, and sums[g] is the sum of that approximation, s * sum(hi) (the
// integer sum exact, one f32 rounding). Summing the quantised x in the bias term too makes the
// row dot's error sum_i w_i e_i, weighted by the centred weights, where the exact sum would
// leave s * sum_i q_i e_i, weighted by the raw codes (about twice as large for Q4: the codes
// average 7.5). Half the integer dots of two planes, and about 128 times the error:
// docs/precision.md.
struct Q8Activations {
  int64_t in = 0;
  int planes = 2;  // 1 or 2
  // int8 [in]: element i at index i (the order of Q8 codes: byte i is element i). hi, lo (lo
  // empty with one plane).
  std::vector<int8_t> natural;
  std::vector<int8_t> natural_lo;
  // int8 [pairs * 128], pairs = ceil(groups / 2): Q4 order. Byte i of a Q4 group holds
  // elements 2i (low nibble) and 2i+1 (high nibble), so the kernel multiplies the 32 low
  // nibbles with the group's even elements and the 32 high nibbles with its odd ones. Groups
  // come in pairs (2p, 2p+1) laid out as [even of 2p | even of 2p+1 | odd of 2p | odd of
  // 2p+1], 32 bytes each: a 512-bit load of a pair's 64 code bytes, split into nibbles, meets
  // its activations in two plain 512-bit loads, and a 256-bit path reads one group's evens at
  // p * 128 + (g % 2) * 32 and its odds 64 bytes further. A missing last group of an odd
  // count is zeros.
  std::vector<int8_t> q4_order;
  std::vector<int8_t> q4_order_lo;  // the lo plane in the same order (empty with one plane)
  std::vector<float> scales;        // f32 [groups]: the unit of the (combined) code, s / 128 or s
  std::vector<float> sums;    // f32 [groups]

  int64_t groups() const { return in / 64; }
};

// Quantises x [in] (f32) into `out` in `planes` (1 or 2) int8 planes (resized; reusable
// across calls). Errors (std::invalid_argument): in <= 0 or in % 64 != 0, planes not 1 or 2, or
// a non-finite element (a NaN or infinity has no int8 code; the f32 path would carry it on, this
// one must refuse).
void quantize_activations(const float* x, int64_t in, Q8Activations& out, int planes = 2);

// sum_c W[row, c] x[c] for one row of a Q4 or Q8 MLX affine weight, with x quantised:
// per group g, t[g] = (w_scale[g] * x_scale[g]) * float(sum_i q_i * (128 hi_i + lo_i)) +
// w_bias[g] * sums[g] (one plane: sum_i q_i * hi_i), the integer sum exact in int32 (two integer
// dots, combined, or one), the rest in
// f32 (multiply, multiply, multiply, add; never
// fused). The t[g] are added into 8 f32 accumulators (group g into g % 8, in order of g),
// then reduced as ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). Every path evaluates
// exactly this, so all paths give bit-identical results.
// Errors (std::invalid_argument): bits not 4 or 8, w.in != x.in, row outside [0, rows), an
// unsupported forced path.
float int8_row_dot(const QuantView& w, int64_t row, const Q8Activations& x,
                   Int8Isa isa = Int8Isa::automatic);

// y[r] = int8_row_dot(w, row_begin + r, x) for r in [0, rows): y f32 [rows]. Same errors, and
// row_begin + rows must not pass the weight's last row.
void int8_rows_dot(const QuantView& w, int64_t row_begin, int64_t rows, const Q8Activations& x,
                   float* y, Int8Isa isa = Int8Isa::automatic);

// The many-token product of prefill: y[t * y_stride + r] = int8_row_dot(w, row_begin + r,
// *xs[t]) for r in [0, rows) and t in [0, n), bit for bit (the same integer sums, the same f32
// epilogue in the same order), so a prompt prefilled in one call gives what n one-token calls
// give. xs: n pointers to quantised tokens (a gathered list: the MoE passes the tokens routed to
// one expert); y f32, rows <= y_stride. Blocked rows x tokens: each tile's codes are loaded and
// split into nibbles once and reused for a panel of tokens (AVX-512 VNNI, Q4: 16 rows in the
// int32 lanes, no horizontal reduction; docs/perf/cpu.md).
// Errors (std::invalid_argument): those of int8_rows_dot, n < 0, a null token or y, a token of
// another width or plane count than the first, y_stride < rows.
void int8_rows_dot_tokens(const QuantView& w, int64_t row_begin, int64_t rows,
                          const Q8Activations* const* xs, int64_t n, float* y, int64_t y_stride,
                          Int8Isa isa = Int8Isa::automatic);

}  // namespace lily::cpu

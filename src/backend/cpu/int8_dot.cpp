// CPU int8 GEMV kernel: int8 activations per group of 64 times Q4/Q8 codes, one path per ISA.
#include "backend/cpu/int8_dot.h"

#include <cpuid.h>
// GCC 12's AVX-512 casts and extracts pass an "undefined" vector (`__m256d __Y = __Y;`) as a
// merge source, which -Wmaybe-uninitialized flags where they are inlined (a false positive). The
// diagnostic is located in the header, so it is silenced for the header's lines only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_kernels.h"

namespace lily::cpu {

// Each vector path carries its instruction set as a per-function target, so the file builds
// with the project's flags (no -march) and the dispatcher below picks a path at run time. A
// helper is inlined only into callers whose target includes its own: the shared 256-bit helpers
// carry the smallest target (AVX2 + FMA) and every vector path's target contains it.
// FMA is in the targets only because every AVX2 CPU has it. The arithmetic below is separate
// multiplies and adds, and this file is compiled with -ffp-contract=off (CMakeLists.txt): GCC
// 12 would otherwise fuse a multiply and an add into an FMA where the target has one, which
// rounds differently from the scalar path and breaks bit-identity.
#define LILY_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define LILY_TARGET_AVX_VNNI __attribute__((target("avx2,fma,avxvnni")))
#define LILY_TARGET_AVX512_VNNI \
  __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))

namespace {

constexpr int64_t kGroup = 64;
constexpr int kBlock = 8;  // groups per f32 epilogue block: one 256-bit vector of group terms

// One quantised row, located once per row.
struct Row {
  const uint8_t* codes;    // Q4: u8 [groups * 32] (two codes per byte); Q8: u8 [groups * 64]
  const std::byte* scales; // BF16 [groups]
  const std::byte* biases; // BF16 [groups]
  int64_t groups;
};

Row locate(const QuantView& w, int64_t row) {
  const auto in = static_cast<int64_t>(w.in);
  const int64_t groups = in / kGroup;
  return Row{reinterpret_cast<const uint8_t*>(w.codes + row * in * w.bits / 8),
             w.scales + row * groups * 2, w.biases + row * groups * 2, groups};
}

// One of the two int8 planes of Q8Activations (hi or lo), in both orders.
struct Plane {
  const int8_t* natural;   // int8 [in]
  const int8_t* q4_order;  // int8 [pairs * 128]
};
inline Plane hi_plane(const Q8Activations& x) { return {x.natural.data(), x.q4_order.data()}; }
inline Plane lo_plane(const Q8Activations& x) { return {x.natural_lo.data(), x.q4_order_lo.data()}; }

// Start of group g's even elements in a plane's Q4 order; its odd ones are 64 bytes on.
inline const int8_t* q4_even(const Plane& x, int64_t g) {
  return x.q4_order + (g / 2) * 128 + (g % 2) * 32;
}

// The integer dot of a group with the combined code 128 * hi + lo: exact in int32 (at most
// 128 * 255 * 127 * 64 + 255 * 64 * 64 < 2^31).
inline int32_t combine(int32_t hi, int32_t lo) { return hi * 128 + lo; }

// The f32 term of one group: (w_scale * x_scale) * isum + w_bias * sum(x), one rounding per
// operation, in this order. Every path computes exactly this (the vector epilogue lane by lane).
inline float group_term(const Row& r, const Q8Activations& x, int64_t g, int32_t isum) {
  const float ws = load_bf16(r.scales + g * 2);
  const float wb = load_bf16(r.biases + g * 2);
  const float a = ws * x.scales[static_cast<size_t>(g)];
  // One rounding where |isum| > 2^24 (the Q8 codes' largest sums); the vector paths convert
  // the same int32 the same way.
  const float d = a * static_cast<float>(isum);
  const float b = wb * x.sums[static_cast<size_t>(g)];
  return d + b;
}

// The documented reduction of the 8 accumulators.
inline float reduce_accumulators(const float* a) {
  const float s04 = a[0] + a[4];
  const float s15 = a[1] + a[5];
  const float s26 = a[2] + a[6];
  const float s37 = a[3] + a[7];
  const float even = s04 + s26;
  const float odd = s15 + s37;
  return even + odd;
}

// ---------------------------------------------------------------------------------------------
// Portable path: plain integer loops (exact in any order) and the scalar epilogue.

int32_t q4_group_scalar(const uint8_t* c, const int8_t* xe, const int8_t* xo) {
  int32_t s = 0;
  for (int i = 0; i < 32; ++i) {
    s += static_cast<int32_t>(c[i] & 15u) * xe[i] + static_cast<int32_t>(c[i] >> 4) * xo[i];
  }
  return s;
}

int32_t q8_group_scalar(const uint8_t* c, const int8_t* xq) {
  int32_t s = 0;
  for (int i = 0; i < 64; ++i) s += static_cast<int32_t>(c[i]) * xq[i];
  return s;
}

template <int Bits>
float row_dot_scalar(const Row& r, const Q8Activations& x) {
  float acc[kBlock] = {};
  for (int64_t g = 0; g < r.groups; ++g) {
    const auto plane_sum = [&](const Plane& p) {
      return Bits == 4 ? q4_group_scalar(r.codes + g * 32, q4_even(p, g), q4_even(p, g) + 64)
                       : q8_group_scalar(r.codes + g * 64, p.natural + g * kGroup);
    };
    const int32_t hi_sum = plane_sum(hi_plane(x));
    const int32_t isum = x.planes == 1 ? hi_sum : combine(hi_sum, plane_sum(lo_plane(x)));
    float& lane = acc[g % kBlock];
    lane = lane + group_term(r, x, g, isum);
  }
  return reduce_accumulators(acc);
}

// ---------------------------------------------------------------------------------------------
// Shared 256-bit helpers.

LILY_TARGET_AVX2 inline __m256i loadu256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// The 8 BF16 values at p as f32 (exact: bf16 is the top half of an f32).
LILY_TARGET_AVX2 inline __m256 load_bf16x8(const std::byte* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// v[k] holds 8 int32 partial sums of group k; returns the 8 group totals [sum v0, ..., sum v7].
LILY_TARGET_AVX2 inline __m256i reduce8(const __m256i* v) {
  const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]);
  const __m256i h23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]);
  const __m256i h67 = _mm256_hadd_epi32(v[6], v[7]);
  // Per 128-bit lane: [v0, v1, v2, v3] partial totals (low lane: elements 0-3 of each v, high
  // lane: 4-7), the same for v4..v7.
  const __m256i h0123 = _mm256_hadd_epi32(h01, h23);
  const __m256i h4567 = _mm256_hadd_epi32(h45, h67);
  const __m256i lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
  const __m256i hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
  return _mm256_add_epi32(lo, hi);
}

// acc[k] += term of group g + k for k < 8, all 8 groups present: group_term lane by lane.
LILY_TARGET_AVX2 inline __m256 epilogue8(__m256 acc, __m256i isum, const Row& r,
                                         const Q8Activations& x, int64_t g) {
  const __m256 ws = load_bf16x8(r.scales + g * 2);
  const __m256 wb = load_bf16x8(r.biases + g * 2);
  const __m256 a = _mm256_mul_ps(ws, _mm256_loadu_ps(x.scales.data() + g));
  const __m256 d = _mm256_mul_ps(a, _mm256_cvtepi32_ps(isum));
  const __m256 b = _mm256_mul_ps(wb, _mm256_loadu_ps(x.sums.data() + g));
  return _mm256_add_ps(acc, _mm256_add_ps(d, b));
}

// The last, partial block (count < 8 groups from g): scalar terms, absent lanes add +0, which
// leaves an accumulator unchanged (an accumulator that starts at +0 never becomes -0).
LILY_TARGET_AVX2 inline __m256 epilogue_tail(__m256 acc, __m256i isum, int64_t count,
                                             const Row& r, const Q8Activations& x, int64_t g) {
  alignas(32) int32_t sums[kBlock];
  alignas(32) float terms[kBlock] = {};
  _mm256_store_si256(reinterpret_cast<__m256i*>(sums), isum);
  for (int64_t k = 0; k < count; ++k) terms[k] = group_term(r, x, g + k, sums[k]);
  return _mm256_add_ps(acc, _mm256_load_ps(terms));
}

// combine() lane by lane.
LILY_TARGET_AVX2 inline __m256i combine8(__m256i hi, __m256i lo) {
  return _mm256_add_epi32(_mm256_slli_epi32(hi, 7), lo);
}

// reduce_accumulators on a vector: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
LILY_TARGET_AVX2 inline float reduce_accumulators(__m256 acc) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// The body of every vector path's row dot: `sums(r, x, g, count, v)` fills v[k] (8 int32
// partials of the combined code 128 * hi + lo, lane by lane) for groups g..g+count-1 (count <=
// 8; v stays zero beyond), then one reduction and the shared epilogue. The lane sums of the
// combined partials are combine(hi total, lo total) exactly (integer adds, every partial within
// the total's bound, < 2^31), so every path gives group_term's isum. A macro, not a template
// taking a lambda: each path's function must carry its own target, and GCC inlines a callee
// only into callers whose target contains the callee's, so a shared AVX2 driver could not
// inline the AVX-512 group sums.
#define LILY_INT8_ROW_DOT(NAME, TARGET, SUMS)                                 \
  TARGET float NAME(const Row& r, const Q8Activations& x) {                   \
    __m256 acc = _mm256_setzero_ps();                                         \
    __m256i v[kBlock];                                                        \
    int64_t g = 0;                                                            \
    for (; g + kBlock <= r.groups; g += kBlock) {                             \
      SUMS(r, x, g, kBlock, v);                                               \
      acc = epilogue8(acc, reduce8(v), r, x, g);                              \
    }                                                                         \
    if (g < r.groups) {                                                       \
      const int64_t count = r.groups - g;                                     \
      for (int k = 0; k < kBlock; ++k) v[k] = _mm256_setzero_si256();         \
      SUMS(r, x, g, count, v);                                                \
      acc = epilogue_tail(acc, reduce8(v), count, r, x, g);                   \
    }                                                                         \
    return reduce_accumulators(acc);                                          \
  }

// The input's planes' partials (both combined lane by lane, or the hi plane's alone) of a path
// whose group sums take one plane (`PLANE_SUMS(r, plane, g, count, v)`).
#define LILY_INPUT_PLANES(NAME, TARGET, PLANE_SUMS)                                       \
  TARGET inline void NAME(const Row& r, const Q8Activations& x, int64_t g, int64_t count, \
                          __m256i* v) {                                                   \
    PLANE_SUMS(r, hi_plane(x), g, count, v);                                              \
    if (x.planes == 1) return;                                                            \
    __m256i lo[kBlock];                                                                   \
    PLANE_SUMS(r, lo_plane(x), g, count, lo);                                             \
    for (int64_t k = 0; k < count; ++k) v[k] = combine8(v[k], lo[k]);                     \
  }

// ---------------------------------------------------------------------------------------------
// AVX2: vpmaddubsw (u8 x s8 pairs to saturating i16) then vpmaddwd by 1 (i16 pairs to i32).

// Q8: a vpmaddubsw pair could reach 2 * 255 * 127 = 64770 and saturate i16, so both operands
// are widened to i16 and multiplied by vpmaddwd (products <= 32385, pair sums exact in i32).
LILY_TARGET_AVX2 inline __m256i q8_group_avx2(const uint8_t* c, const int8_t* xq) {
  __m256i s = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    const __m256i c16 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16 * k)));
    const __m256i x16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16 * k)));
    s = _mm256_add_epi32(s, _mm256_madd_epi16(c16, x16));
  }
  return s;
}

// Q4 with both planes at once (or the hi plane alone): the group's codes loaded and split into
// nibbles once for the two planes. The pair sums are at most 2 * 15 * 127 = 3810 and two of
// them 7620, far below the i16 saturation of vpmaddubsw.
LILY_TARGET_AVX2 inline void q4_sums_avx2(const Row& r, const Q8Activations& x, int64_t g,
                                          int64_t count, __m256i* v) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const Plane hi_x = hi_plane(x);
  const Plane lo_x = lo_plane(x);
  for (int64_t k = 0; k < count; ++k) {
    const __m256i codes = loadu256(r.codes + (g + k) * 32);
    const __m256i lo = _mm256_and_si256(codes, mask);                         // elements 2i
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), mask);  // elements 2i+1
    const int8_t* xh = q4_even(hi_x, g + k);
    const __m256i ph = _mm256_add_epi16(_mm256_maddubs_epi16(lo, loadu256(xh)),
                                        _mm256_maddubs_epi16(hi, loadu256(xh + 64)));
    if (x.planes == 1) {
      v[k] = _mm256_madd_epi16(ph, ones);
      continue;
    }
    const int8_t* xl = q4_even(lo_x, g + k);
    const __m256i pl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, loadu256(xl)),
                                        _mm256_maddubs_epi16(hi, loadu256(xl + 64)));
    v[k] = combine8(_mm256_madd_epi16(ph, ones), _mm256_madd_epi16(pl, ones));
  }
}

LILY_TARGET_AVX2 inline void q8_plane_sums_avx2(const Row& r, const Plane& x, int64_t g,
                                                int64_t count, __m256i* v) {
  for (int64_t k = 0; k < count; ++k) {
    v[k] = q8_group_avx2(r.codes + (g + k) * 64, x.natural + (g + k) * kGroup);
  }
}

LILY_INPUT_PLANES(q8_sums_avx2, LILY_TARGET_AVX2, q8_plane_sums_avx2)

LILY_INT8_ROW_DOT(row_dot_q4_avx2, LILY_TARGET_AVX2, q4_sums_avx2)

LILY_INT8_ROW_DOT(row_dot_q8_avx2, LILY_TARGET_AVX2, q8_sums_avx2)

// ---------------------------------------------------------------------------------------------
// AVX-VNNI: 256-bit vpdpbusd (u8 x s8, four products into each i32 lane, no saturation).

LILY_TARGET_AVX_VNNI inline __m256i q4_group_avx_vnni(const uint8_t* c, const int8_t* xe) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i codes = loadu256(c);
  const __m256i lo = _mm256_and_si256(codes, mask);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), mask);
  const __m256i s = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, loadu256(xe));
  return _mm256_dpbusd_avx_epi32(s, hi, loadu256(xe + 64));
}

LILY_TARGET_AVX_VNNI inline __m256i q8_group_avx_vnni(const uint8_t* c, const int8_t* xq) {
  const __m256i s = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), loadu256(c), loadu256(xq));
  return _mm256_dpbusd_avx_epi32(s, loadu256(c + 32), loadu256(xq + 32));
}

LILY_TARGET_AVX_VNNI inline void q4_plane_sums_avx_vnni(const Row& r, const Plane& x, int64_t g,
                                                        int64_t count, __m256i* v) {
  for (int64_t k = 0; k < count; ++k) {
    v[k] = q4_group_avx_vnni(r.codes + (g + k) * 32, q4_even(x, g + k));
  }
}

LILY_TARGET_AVX_VNNI inline void q8_plane_sums_avx_vnni(const Row& r, const Plane& x, int64_t g,
                                                        int64_t count, __m256i* v) {
  for (int64_t k = 0; k < count; ++k) {
    v[k] = q8_group_avx_vnni(r.codes + (g + k) * 64, x.natural + (g + k) * kGroup);
  }
}

LILY_INPUT_PLANES(q4_sums_avx_vnni, LILY_TARGET_AVX_VNNI, q4_plane_sums_avx_vnni)
LILY_INPUT_PLANES(q8_sums_avx_vnni, LILY_TARGET_AVX_VNNI, q8_plane_sums_avx_vnni)

LILY_INT8_ROW_DOT(row_dot_q4_avx_vnni, LILY_TARGET_AVX_VNNI, q4_sums_avx_vnni)

LILY_INT8_ROW_DOT(row_dot_q8_avx_vnni, LILY_TARGET_AVX_VNNI, q8_sums_avx_vnni)

// ---------------------------------------------------------------------------------------------
// AVX-512 VNNI: 512-bit vpdpbusd. Q4 takes a pair of groups per instruction: the pair's 64 code
// bytes split into low and high nibbles meet q4_order's [even 2p | even 2p+1] and
// [odd 2p | odd 2p+1], so i32 lanes 0-7 sum group 2p and lanes 8-15 group 2p+1.

// The upper 256 bits.
LILY_TARGET_AVX512_VNNI inline __m256i upper256(__m512i v) { return _mm512_extracti64x4_epi64(v, 1); }

LILY_TARGET_AVX512_VNNI inline __m512i q4_pair_avx512(__m512i codes, const int8_t* pair_act) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const __m512i lo = _mm512_and_si512(codes, mask);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), mask);
  const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(pair_act));
  return _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(pair_act + 64));
}

// How far ahead of the Q4 codes it reads the one-token AVX-512 kernel asks for the next ones.
constexpr int64_t kDecodePrefetchBytes = 4096;

// g is a multiple of 8, so this block's pairs start at group g.
LILY_TARGET_AVX512_VNNI inline void q4_plane_sums_avx512(const Row& r, const Plane& x, int64_t g,
                                                         int64_t count, __m256i* v) {
  for (int64_t k = 0; k < count; k += 2) {
    const uint8_t* c = r.codes + (g + k) * 32;
    // The decode streams each row once from DRAM and waits on it (about 5 GB/s a thread against
    // 25 from cache): asking for the codes 4 KB (two to four rows) ahead keeps more misses in
    // flight. A prefetch never faults, past the buffer's end included. docs/perf/cpu.md.
    _mm_prefetch(reinterpret_cast<const char*>(c) + kDecodePrefetchBytes, _MM_HINT_T0);
    // A lone last group: load only its 32 code bytes, 4 of the 8 qwords (the row, and maybe
    // the buffer, ends there; a masked-off lane never faults); its partner in q4_order is zeros.
    const __m512i codes = k + 1 < count ? _mm512_loadu_si512(c) : _mm512_maskz_loadu_epi64(0x0F, c);
    const __m512i s = q4_pair_avx512(codes, x.q4_order + (g + k) * 64);
    v[k] = _mm512_castsi512_si256(s);
    if (k + 1 < count) v[k + 1] = upper256(s);
  }
}

LILY_TARGET_AVX512_VNNI inline void q8_plane_sums_avx512(const Row& r, const Plane& x, int64_t g,
                                                         int64_t count, __m256i* v) {
  for (int64_t k = 0; k < count; ++k) {
    const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                          _mm512_loadu_si512(r.codes + (g + k) * 64),
                                          _mm512_loadu_si512(x.natural + (g + k) * kGroup));
    v[k] = _mm256_add_epi32(_mm512_castsi512_si256(s), upper256(s));
  }
}

LILY_INPUT_PLANES(q4_sums_avx512, LILY_TARGET_AVX512_VNNI, q4_plane_sums_avx512)
LILY_INPUT_PLANES(q8_sums_avx512, LILY_TARGET_AVX512_VNNI, q8_plane_sums_avx512)

LILY_INT8_ROW_DOT(row_dot_q4_avx512, LILY_TARGET_AVX512_VNNI, q4_sums_avx512)

LILY_INT8_ROW_DOT(row_dot_q8_avx512, LILY_TARGET_AVX512_VNNI, q8_sums_avx512)

// ---------------------------------------------------------------------------------------------
// Many tokens (prefill, int8_rows_dot_tokens): tiles of kRowTile rows x kTokenTile tokens. Per
// block of 8 groups, the tile's codes are loaded (and for Q4 split into nibbles) once into
// registers and meet every token of the tile; each (row, token) then gets exactly the integer
// group totals of the one-token path and the same epilogue8 / epilogue_tail, in the same order
// of blocks, so its f32 result is bit for bit int8_row_dot's. The tile's f32 accumulators live in
// a small stack array (kRowTile x kTokenTile x 8 floats, L1).
//
// The hi and lo planes are summed into one int32 lane before the reduction to group totals:
// dpbusd(hi), shift left by 7, dpbusd(lo) gives 128 * hi_partial + lo_partial per lane, whose
// lane sum is combine(hi_total, lo_total) exactly (integer adds; every partial is bounded by the
// total's bound, < 2^31). One reduction instead of the one-token path's two.

constexpr int kRowTile = 2;  // rows per tile: 2 x 8 zmm of codes for Q4 and Q8 (of 32 registers)
// Tokens per tile: their 8 groups of activations (1 KB each for Q4: hi and lo) stay in L1 while
// the tile's rows meet them; measured against 4, 8 and 32 (docs/perf/cpu.md).
constexpr int64_t kTokenTile = 16;

// Tokens per panel (int8_rows_dot_tokens's outer loop): 64 x 8 KB of Q4 activations for
// in = 4096, within L2.
constexpr int64_t kTokenPanel = 64;

using Acc = float[kTokenTile][kBlock];  // f32 accumulators of one row: [token][g % 8]

// The 8 group totals from the four pair sums of the AVX-512 Q4 path: s[p] holds 8 int32
// partials of group 2p in lanes 0-7 and of group 2p+1 in lanes 8-15.
LILY_TARGET_AVX512_VNNI inline __m256i reduce_pairs_avx512(const __m512i* s) {
  // Per 128-bit chunk: [s0, s1, s0, s1] (u0) and [s2, s3, s2, s3] (u1) partials.
  const __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
  const __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2], s[3]), _mm512_unpackhi_epi32(s[2], s[3]));
  // Per chunk c: [s0, s1, s2, s3] summed over the lanes 4c..4c+3. Chunks 0 and 1 are lanes 0-7
  // (groups 0, 2, 4, 6), chunks 2 and 3 lanes 8-15 (groups 1, 3, 5, 7).
  const __m512i w = _mm512_add_epi32(_mm512_unpacklo_epi64(u0, u1), _mm512_unpackhi_epi64(u0, u1));
  const __m512i t = _mm512_add_epi32(w, _mm512_shuffle_i32x4(w, w, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m128i even = _mm512_castsi512_si128(t);         // [g0 g2 g4 g6]
  const __m128i odd = _mm512_extracti32x4_epi32(t, 2);    // [g1 g3 g5 g7]
  return _mm256_set_m128i(_mm_unpackhi_epi32(even, odd), _mm_unpacklo_epi32(even, odd));
}

// The 8 group totals from 8 vectors of 16 int32 partials, one group each (the Q8 path).
LILY_TARGET_AVX512_VNNI inline __m256i reduce_groups_avx512(const __m512i* s) {
  // Per 128-bit chunk: [g2j, g2j+1, g2j, g2j+1] partials.
  __m512i u[4];
  for (int j = 0; j < 4; ++j) {
    u[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2 * j], s[2 * j + 1]),
                            _mm512_unpackhi_epi32(s[2 * j], s[2 * j + 1]));
  }
  // Per chunk: [g0 g1 g2 g3] (w0) and [g4 g5 g6 g7] (w1) partials.
  const __m512i w0 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[0], u[1]), _mm512_unpackhi_epi64(u[0], u[1]));
  const __m512i w1 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2], u[3]), _mm512_unpackhi_epi64(u[2], u[3]));
  // [w0 c0+c2, w0 c1+c3, w1 c0+c2, w1 c1+c3], then chunk 0: groups 0-3, chunk 2: groups 4-7.
  const __m512i r = _mm512_add_epi32(_mm512_shuffle_i32x4(w0, w1, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_i32x4(w0, w1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512i r2 = _mm512_add_epi32(r, _mm512_shuffle_i32x4(r, r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castsi512_si256(_mm512_shuffle_i32x4(r2, r2, _MM_SHUFFLE(0, 0, 2, 0)));
}

// epilogue8 with the row's scales and biases already widened (ws, wb: once per block, not per
// token): the same operations in the same order.
LILY_TARGET_AVX2 inline __m256 epilogue8_loaded(__m256 acc, __m256i isum, __m256 ws, __m256 wb,
                                                const Q8Activations& x, int64_t g) {
  const __m256 a = _mm256_mul_ps(ws, _mm256_loadu_ps(x.scales.data() + g));
  const __m256 d = _mm256_mul_ps(a, _mm256_cvtepi32_ps(isum));
  const __m256 b = _mm256_mul_ps(wb, _mm256_loadu_ps(x.sums.data() + g));
  return _mm256_add_ps(acc, _mm256_add_ps(d, b));
}

// One block of 8 groups (count of them present, all 8 when Full) of R rows against tn tokens
// quantised in Planes planes.
template <int R, bool Full, int Planes>
LILY_TARGET_AVX512_VNNI inline void q4_block_avx512(const Row* rows, const Q8Activations* const* xs,
                                                    int64_t tn, int64_t g, int64_t count,
                                                    Acc* acc) {
  const int pairs = Full ? 4 : static_cast<int>((count + 1) / 2);
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const __m512i zero = _mm512_setzero_si512();
  constexpr auto kR = static_cast<size_t>(R);
  __m512i lo[kR][4], hi[kR][4];  // u8 nibbles: elements 2i (lo) and 2i+1 (hi) of pair p's bytes
  __m256 ws[kR], wb[kR];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < 4; ++p) {
      lo[r][p] = hi[r][p] = zero;
      if (p >= pairs) continue;
      const uint8_t* c = rows[r].codes + (g + 2 * p) * 32;
      // A lone last group: its 32 bytes only (see q4_sums_avx512).
      const __m512i codes = Full || 2 * p + 1 < count ? _mm512_loadu_si512(c) : _mm512_maskz_loadu_epi64(0x0F, c);
      lo[r][p] = _mm512_and_si512(codes, mask);
      hi[r][p] = _mm512_and_si512(_mm512_srli_epi16(codes, 4), mask);
    }
    if (Full) {
      ws[r] = load_bf16x8(rows[r].scales + g * 2);
      wb[r] = load_bf16x8(rows[r].biases + g * 2);
    }
  }
  for (int64_t t = 0; t < tn; ++t) {
    const Q8Activations& x = *xs[t];
    const int8_t* xh = x.q4_order.data() + g * 64;     // pair p: evens at p * 128, odds 64 on
    const int8_t* xl = Planes == 2 ? x.q4_order_lo.data() + g * 64 : nullptr;
    for (int r = 0; r < R; ++r) {
      __m512i s[4];
      for (int p = 0; p < 4; ++p) {
        s[p] = zero;
        if (p >= pairs) continue;
        __m512i v = _mm512_dpbusd_epi32(zero, lo[r][p], _mm512_loadu_si512(xh + p * 128));
        v = _mm512_dpbusd_epi32(v, hi[r][p], _mm512_loadu_si512(xh + p * 128 + 64));
        if (Planes == 1) {
          s[p] = v;
          continue;
        }
        v = _mm512_slli_epi32(v, 7);
        v = _mm512_dpbusd_epi32(v, lo[r][p], _mm512_loadu_si512(xl + p * 128));
        s[p] = _mm512_dpbusd_epi32(v, hi[r][p], _mm512_loadu_si512(xl + p * 128 + 64));
      }
      const __m256i isum = reduce_pairs_avx512(s);
      float* a = acc[r][t];
      const __m256 sum = Full ? epilogue8_loaded(_mm256_load_ps(a), isum, ws[r], wb[r], x, g)
                              : epilogue_tail(_mm256_load_ps(a), isum, count, rows[r], x, g);
      _mm256_store_ps(a, sum);
    }
  }
}

template <int R, bool Full, int Planes>
LILY_TARGET_AVX512_VNNI inline void q8_block_avx512(const Row* rows, const Q8Activations* const* xs,
                                                    int64_t tn, int64_t g, int64_t count,
                                                    Acc* acc) {
  const int present = Full ? kBlock : static_cast<int>(count);
  const __m512i zero = _mm512_setzero_si512();
  constexpr auto kR = static_cast<size_t>(R);
  __m512i c[kR][kBlock];  // u8 codes of group g + k
  __m256 ws[kR], wb[kR];
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < kBlock; ++k) {
      c[r][k] = k < present ? _mm512_loadu_si512(rows[r].codes + (g + k) * 64) : zero;
    }
    if (Full) {
      ws[r] = load_bf16x8(rows[r].scales + g * 2);
      wb[r] = load_bf16x8(rows[r].biases + g * 2);
    }
  }
  for (int64_t t = 0; t < tn; ++t) {
    const Q8Activations& x = *xs[t];
    const int8_t* xh = x.natural.data() + g * kGroup;
    const int8_t* xl = Planes == 2 ? x.natural_lo.data() + g * kGroup : nullptr;
    for (int r = 0; r < R; ++r) {
      __m512i s[kBlock];
      for (int k = 0; k < kBlock; ++k) {
        s[k] = zero;
        if (k >= present) continue;
        const __m512i v = _mm512_dpbusd_epi32(zero, c[r][k], _mm512_loadu_si512(xh + k * kGroup));
        if (Planes == 1) {
          s[k] = v;
          continue;
        }
        s[k] = _mm512_dpbusd_epi32(_mm512_slli_epi32(v, 7), c[r][k],
                                   _mm512_loadu_si512(xl + k * kGroup));
      }
      const __m256i isum = reduce_groups_avx512(s);
      float* a = acc[r][t];
      const __m256 sum = Full ? epilogue8_loaded(_mm256_load_ps(a), isum, ws[r], wb[r], x, g)
                              : epilogue_tail(_mm256_load_ps(a), isum, count, rows[r], x, g);
      _mm256_store_ps(a, sum);
    }
  }
}

// R rows (located) against n tokens: y[t * y_stride + r].
template <int R, int Bits, int Planes>
LILY_TARGET_AVX512_VNNI void tile_avx512(const Row* rows, const Q8Activations* const* xs, int64_t n,
                                         float* y, int64_t y_stride) {
  alignas(32) Acc acc[static_cast<size_t>(R)];
  const int64_t groups = rows[0].groups;
  for (int64_t t0 = 0; t0 < n; t0 += kTokenTile) {
    const int64_t tn = std::min(kTokenTile, n - t0);
    for (int r = 0; r < R; ++r) {
      for (int64_t t = 0; t < tn; ++t) _mm256_store_ps(acc[r][t], _mm256_setzero_ps());
    }
    int64_t g = 0;
    for (; g + kBlock <= groups; g += kBlock) {
      if (Bits == 4) {
        q4_block_avx512<R, true, Planes>(rows, xs + t0, tn, g, kBlock, acc);
      } else {
        q8_block_avx512<R, true, Planes>(rows, xs + t0, tn, g, kBlock, acc);
      }
    }
    if (g < groups) {
      if (Bits == 4) {
        q4_block_avx512<R, false, Planes>(rows, xs + t0, tn, g, groups - g, acc);
      } else {
        q8_block_avx512<R, false, Planes>(rows, xs + t0, tn, g, groups - g, acc);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int64_t t = 0; t < tn; ++t) {
        y[(t0 + t) * y_stride + r] = reduce_accumulators(_mm256_load_ps(acc[r][t]));
      }
    }
  }
}

template <int Bits, int Planes>
LILY_TARGET_AVX512_VNNI void tokens_avx512(const QuantView& w, int64_t row_begin, int64_t rows,
                                           const Q8Activations* const* xs, int64_t n, float* y,
                                           int64_t y_stride) {
  // Panels of kTokenPanel tokens, every row tile inside one: the panel's activations stay in
  // L2 while all the rows meet them (row tiles outside would stream every token's activations
  // from memory once per tile of rows).
  for (int64_t t0 = 0; t0 < n; t0 += kTokenPanel) {
    const int64_t tn = std::min(kTokenPanel, n - t0);
    float* yp = y + t0 * y_stride;
    int64_t r = 0;
    for (; r + kRowTile <= rows; r += kRowTile) {
      Row tile[kRowTile];
      for (int i = 0; i < kRowTile; ++i) tile[i] = locate(w, row_begin + r + i);
      tile_avx512<kRowTile, Bits, Planes>(tile, xs + t0, tn, yp + r, y_stride);
    }
    for (; r < rows; ++r) {
      const Row one = locate(w, row_begin + r);
      tile_avx512<1, Bits, Planes>(&one, xs + t0, tn, yp + r, y_stride);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Many tokens, Q4: rows in lanes. The tiles above put a group's 64 codes across the
// lanes of one row, so every (row, token) needs a horizontal reduction of its lanes and an
// epilogue of its own: about two thirds of that kernel's instructions where vpdpbusd is a
// third. Here 16 rows sit in the 16 int32 lanes: each vpdpbusd adds 4 codes of each of the 16
// rows times the same 4 activations of one token (a broadcast), 16 of them make the group's
// exact integer totals for 16 rows at once, and the f32 epilogue runs lane-wise, in
// group_term's order into accumulators by g % 8, reduced as reduce_accumulators: the same bits
// as int8_row_dot. The codes must be transposed for that (16 rows' dword j side by side), once
// per tile of 16 rows and panel of tokens, into a buffer that stays in L1/L2 while the panel's
// tokens meet it.
//
// A row's group is 32 code bytes = 8 dwords; dword j holds elements 8j..8j+7, its low nibbles
// the evens 8j, 8j+2, 8j+4, 8j+6 (even index 4j..4j+3: 4 contiguous bytes of q4_order's evens)
// and its high nibbles the odds (4 contiguous bytes of the odds, 64 bytes on). With two planes,
// the hi plane's 16 products, a shift left by 7, then the lo plane's: 128 * hi + lo lane by
// lane, as the tiles above combine them.

constexpr int kLaneRows = 16;   // rows per lane tile: one per int32 lane
constexpr int kLaneTokens = 8;  // tokens per pass over a tile: 8 accumulators + 16 code vectors

// One lane tile: codes u32 [groups][8][16] (dword j of the group for lane l = tile row l, packed
// nibbles), widened scales and biases f32 [groups][16].
struct LaneTile {
  std::vector<uint32_t> codes;
  std::vector<float> scales, biases;
};

// Transposes rows [row0, row0 + 16) of w (Q4) into `tile`.
LILY_TARGET_AVX512_VNNI void build_lane_tile(const QuantView& w, int64_t row0, LaneTile& tile) {
  const Row first = locate(w, row0);
  const int64_t groups = first.groups;
  const int64_t row_bytes = groups * 32;
  tile.codes.resize(static_cast<size_t>(groups * 8 * kLaneRows));
  tile.scales.resize(static_cast<size_t>(groups * kLaneRows));
  tile.biases.resize(static_cast<size_t>(groups * kLaneRows));
  // The last step of an 8 x 8 dword transpose in each 256-bit half: column a of all 16 rows is
  // [u_a chunk 0, u_a+4 chunk 0, u_a chunk 2, u_a+4 chunk 2] (qword indices into (u_a, u_a+4)),
  // column a + 4 the same with chunks 1 and 3.
  const __m512i col_lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
  const __m512i col_hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i z[8];  // [row i's 8 dwords | row i + 8's]
    for (int i = 0; i < 8; ++i) {
      const uint8_t* a = first.codes + i * row_bytes + g * 32;
      const uint8_t* b = first.codes + (i + 8) * row_bytes + g * 32;
      z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(loadu256(a)), loadu256(b), 1);
    }
    __m512i p[8], u[8];
    for (int h = 0; h < 2; ++h) {  // rows 0-3 (and 8-11), then 4-7 (and 12-15)
      const __m512i* zh = z + 4 * h;
      __m512i* ph = p + 4 * h;
      ph[0] = _mm512_unpacklo_epi32(zh[0], zh[1]);
      ph[1] = _mm512_unpackhi_epi32(zh[0], zh[1]);
      ph[2] = _mm512_unpacklo_epi32(zh[2], zh[3]);
      ph[3] = _mm512_unpackhi_epi32(zh[2], zh[3]);
      // u[4h + a]: per 128-bit chunk, column a (chunks 0, 2) or a + 4 (chunks 1, 3) of 4 rows.
      u[4 * h + 0] = _mm512_unpacklo_epi64(ph[0], ph[2]);
      u[4 * h + 1] = _mm512_unpackhi_epi64(ph[0], ph[2]);
      u[4 * h + 2] = _mm512_unpacklo_epi64(ph[1], ph[3]);
      u[4 * h + 3] = _mm512_unpackhi_epi64(ph[1], ph[3]);
    }
    uint32_t* out = tile.codes.data() + g * 8 * kLaneRows;
    for (int a = 0; a < 4; ++a) {
      _mm512_storeu_si512(out + a * kLaneRows, _mm512_permutex2var_epi64(u[a], col_lo, u[a + 4]));
      _mm512_storeu_si512(out + (a + 4) * kLaneRows,
                          _mm512_permutex2var_epi64(u[a], col_hi, u[a + 4]));
    }
  }
  for (int l = 0; l < kLaneRows; ++l) {
    const Row r = locate(w, row0 + l);
    for (int64_t g = 0; g < groups; ++g) {
      tile.scales[static_cast<size_t>(g * kLaneRows + l)] = load_bf16(r.scales + g * 2);
      tile.biases[static_cast<size_t>(g * kLaneRows + l)] = load_bf16(r.biases + g * 2);
    }
  }
}

// The tile against tn <= kLaneTokens tokens quantised in Planes planes: y[t * y_stride + l] for
// the tile's 16 rows. `next` (or null): the first of the next tile's 16 rows of codes, row_bytes
// apart, asked into L2 a cache line of each row every other group, so that the next tile's
// build finds them there. A tile's build otherwise waits on DRAM: a prefill of a few hundred
// tokens meets most experts with a handful of tokens, and reading their weights took a fifth
// of the time (perf, 2026-12-07).
template <int Planes>
LILY_TARGET_AVX512_VNNI void lane_tile_tokens(const LaneTile& tile, int64_t groups,
                                              const Q8Activations* const* xs, int64_t tn, float* y,
                                              int64_t y_stride, const uint8_t* next,
                                              int64_t row_bytes) {
  alignas(64) float acc[kBlock][kLaneTokens][kLaneRows] = {};  // f32, by g % 8, token, lane
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; ++g) {
    if (next != nullptr && g % 2 == 0) {
      for (int i = 0; i < kLaneRows; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(next + i * row_bytes + g * 32), _MM_HINT_T1);
      }
    }
    const uint32_t* packed = tile.codes.data() + g * 8 * kLaneRows;
    __m512i lo[8], hi[8];  // u8 codes: lane l's evens (lo) and odds (hi) of dword j
    for (int j = 0; j < 8; ++j) {
      const __m512i c = _mm512_loadu_si512(packed + j * kLaneRows);
      lo[j] = _mm512_and_si512(c, mask);
      hi[j] = _mm512_and_si512(_mm512_srli_epi16(c, 4), mask);
    }
    const int64_t evens = (g / 2) * 128 + (g % 2) * 32;  // q4_order offset; odds 64 bytes on
    __m512i s[kLaneTokens];
    for (int t = 0; t < kLaneTokens; ++t) s[t] = zero;
    for (int plane = 0; plane < Planes; ++plane) {
      if (plane == 1) {
        for (int t = 0; t < kLaneTokens; ++t) s[t] = _mm512_slli_epi32(s[t], 7);
      }
      for (int j = 0; j < 8; ++j) {
        for (int t = 0; t < kLaneTokens; ++t) {
          if (t >= tn) break;
          const Q8Activations& x = *xs[t];
          const int8_t* a = (plane == 0 ? x.q4_order.data() : x.q4_order_lo.data()) + evens + 4 * j;
          int32_t e, o;  // the 4 activations of dword j's evens, then odds
          std::memcpy(&e, a, 4);
          std::memcpy(&o, a + 64, 4);
          s[t] = _mm512_dpbusd_epi32(s[t], lo[j], _mm512_set1_epi32(e));
          s[t] = _mm512_dpbusd_epi32(s[t], hi[j], _mm512_set1_epi32(o));
        }
      }
    }
    const __m512 ws = _mm512_loadu_ps(tile.scales.data() + g * kLaneRows);
    const __m512 wb = _mm512_loadu_ps(tile.biases.data() + g * kLaneRows);
    for (int t = 0; t < kLaneTokens; ++t) {
      if (t >= tn) break;
      const Q8Activations& x = *xs[t];
      // group_term lane by lane: (ws * xs) * isum + wb * sum, then into accumulator g % 8.
      const __m512 a = _mm512_mul_ps(ws, _mm512_set1_ps(x.scales[static_cast<size_t>(g)]));
      const __m512 d = _mm512_mul_ps(a, _mm512_cvtepi32_ps(s[t]));
      const __m512 b = _mm512_mul_ps(wb, _mm512_set1_ps(x.sums[static_cast<size_t>(g)]));
      float* lane_acc = acc[g % kBlock][t];
      _mm512_store_ps(lane_acc, _mm512_add_ps(_mm512_load_ps(lane_acc), _mm512_add_ps(d, b)));
    }
  }
  for (int64_t t = 0; t < tn; ++t) {  // reduce_accumulators, lane-wise
    __m512 a[kBlock];                 // (a lambda would not carry the target)
    for (int k = 0; k < kBlock; ++k) a[k] = _mm512_load_ps(acc[k][t]);
    const __m512 even = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
    const __m512 odd = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
    _mm512_storeu_ps(y + t * y_stride, _mm512_add_ps(even, odd));
  }
}

// int8_rows_dot_tokens for Q4: 16-row lane tiles, the rows left over (fewer than 16) by the
// 2-row tiles.
template <int Planes>
LILY_TARGET_AVX512_VNNI void tokens_lanes_q4(const QuantView& w, int64_t row_begin, int64_t rows,
                                             const Q8Activations* const* xs, int64_t n, float* y,
                                             int64_t y_stride) {
  thread_local LaneTile tile;
  const int64_t groups = static_cast<int64_t>(w.in) / kGroup;
  const int64_t lane_rows = rows / kLaneRows * kLaneRows;
  for (int64_t t0 = 0; t0 < n; t0 += kTokenPanel) {
    const int64_t tn = std::min(kTokenPanel, n - t0);
    float* yp = y + t0 * y_stride;
    for (int64_t r = 0; r < lane_rows; r += kLaneRows) {
      build_lane_tile(w, row_begin + r, tile);
      const uint8_t* next =
          r + kLaneRows < lane_rows ? locate(w, row_begin + r + kLaneRows).codes : nullptr;
      for (int64_t t = 0; t < tn; t += kLaneTokens) {
        lane_tile_tokens<Planes>(tile, groups, xs + t0 + t, std::min<int64_t>(kLaneTokens, tn - t),
                                 yp + t * y_stride + r, y_stride, t == 0 ? next : nullptr,
                                 groups * 32);
      }
    }
  }
  if (lane_rows < rows) {
    tokens_avx512<4, Planes>(w, row_begin + lane_rows, rows - lane_rows, xs, n, y + lane_rows,
                             y_stride);
  }
}

// ---------------------------------------------------------------------------------------------
// Dispatch.

bool cpu_has_avx_vnni() {
  // CPUID leaf 7, subleaf 1, EAX bit 4. Read directly: GCC 12 knows "avxvnni" for
  // __builtin_cpu_supports, clang 14 does not. The OS's YMM state is covered by the avx2 test.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
  return (a >> 4) & 1u;
}

Int8Isa detect() {
  __builtin_cpu_init();
  // __builtin_cpu_supports returns a non-zero mask, not 1: compare with 0.
  const bool avx2 = __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  const bool avx512 = __builtin_cpu_supports("avx512f") != 0 &&
                      __builtin_cpu_supports("avx512bw") != 0 &&
                      __builtin_cpu_supports("avx512vl") != 0 &&
                      __builtin_cpu_supports("avx512vnni") != 0;
  if (avx2 && avx512) return Int8Isa::avx512_vnni;
  if (avx2 && cpu_has_avx_vnni()) return Int8Isa::avx_vnni;
  if (avx2) return Int8Isa::avx2;
  return Int8Isa::scalar;
}

Int8Isa best() {
  static const Int8Isa isa = detect();
  return isa;
}

using RowDot = float (*)(const Row&, const Q8Activations&);

RowDot select(Int8Isa isa, int bits) {
  if (isa == Int8Isa::automatic) isa = best();
  if (!int8_isa_supported(isa)) {  // the message only on failure: select runs for every row
    require(false, "int8_dot",
            std::string("the ") + int8_isa_name(isa) + " path was forced but this CPU lacks it (best: " +
                int8_isa_name(best()) + ")");
  }
  switch (isa) {
    case Int8Isa::avx512_vnni: return bits == 4 ? row_dot_q4_avx512 : row_dot_q8_avx512;
    case Int8Isa::avx_vnni: return bits == 4 ? row_dot_q4_avx_vnni : row_dot_q8_avx_vnni;
    case Int8Isa::avx2: return bits == 4 ? row_dot_q4_avx2 : row_dot_q8_avx2;
    case Int8Isa::scalar:
    case Int8Isa::automatic: break;
  }
  return bits == 4 ? row_dot_scalar<4> : row_dot_scalar<8>;
}

// Called for every row a decode op reads: the messages are built only on failure (building
// them eagerly cost more than the row's dot).
void check(const char* op, const QuantView& w, int64_t row_begin, int64_t rows,
           const Q8Activations& x) {
  const auto total = static_cast<int64_t>(w.rows());
  const bool ok = (w.bits == 4 || w.bits == 8) && w.codes != nullptr && w.scales != nullptr &&
                  w.biases != nullptr && static_cast<int64_t>(w.in) == x.in && x.in > 0 &&
                  (x.planes == 1 || x.planes == 2) && x.in % kGroup == 0 && row_begin >= 0 &&
                  rows >= 0 && row_begin <= total && rows <= total - row_begin;
  if (ok) return;
  require(w.bits == 4 || w.bits == 8, op,
          "weight " + w.name + " has " + std::to_string(w.bits) + " bits per code, expected 4 or 8");
  require(w.codes != nullptr && w.scales != nullptr && w.biases != nullptr, op,
          "weight " + w.name + " has no codes, scales or biases");
  require(static_cast<int64_t>(w.in) == x.in, op,
          "weight " + w.name + " takes " + std::to_string(w.in) + " inputs, the activations hold " +
              std::to_string(x.in));
  require(x.in > 0 && x.in % kGroup == 0, op,
          "activations of " + std::to_string(x.in) + " elements, expected a positive multiple of 64 "
          "(quantize_activations fills them)");
  require(x.planes == 1 || x.planes == 2, op,
          "activations in " + std::to_string(x.planes) + " planes, expected 1 or 2");
  require(false, op,
          "rows [" + std::to_string(row_begin) + ", " + std::to_string(row_begin + rows) +
              ") outside weight " + w.name + "'s " + std::to_string(total) + " rows");
}

// One group of quantize_activations: xg f32 [64] to the hi and lo planes' nat int8 [64]
// (element order) and even int8 [32] / even + 64 int8 [32] (Q4 order), the combined code's
// unit scale and the sum; with nat_lo null, the hi plane alone, its unit scale and the sum of
// what it approximates. False (outputs unspecified) when an
// element is not finite. Cloned per target like the f32 kernels (quantisation runs once per input
// vector, not per row, but is a tenth of a 2048-row product when not vectorised); every clone
// computes the same bits: max, division and rounding are exact IEEE operations, and the sum's
// order is fixed (8 interleaved partial sums, then combined in a fixed order).
LILY_CPU_CLONES bool quantize_group(const float* xg, int8_t* nat, int8_t* even, int8_t* nat_lo,
                                    int8_t* even_lo, float& scale, float& sum) {
  constexpr float kMax = 3.40282347e38f;  // FLT_MAX: |x| <= kMax fails for NaN and infinity
  float amax = 0.0f;
  int bad = 0;
  // A plain loop (max and | do not depend on the order): clang refuses, as an error under
  // -Werror, to honour `omp simd` reductions over std::max here.
  for (int i = 0; i < kGroup; ++i) {
    const float a = std::fabs(xg[i]);
    bad |= a <= kMax ? 0 : 1;
    amax = std::max(amax, a);
  }
  if (bad != 0) return false;
  const float s = amax / 127.0f;
  if (nat_lo == nullptr) {  // one plane: hi = nearest(x / s), x ~ s * hi, sum = s * sum(hi)
    int32_t hi_sum = 0;
    if (s > 0.0f) {
      for (int i = 0; i < kGroup; ++i) {
        nat[i] = static_cast<int8_t>(std::nearbyint(xg[i] / s));
        hi_sum += nat[i];
      }
    } else {
      for (int i = 0; i < kGroup; ++i) nat[i] = 0;
    }
    scale = s;
    sum = s * static_cast<float>(hi_sum);  // |hi_sum| <= 8128: exact in f32, one rounding
    for (int j = 0; j < 32; ++j) {
      even[j] = nat[2 * j];
      even[64 + j] = nat[2 * j + 1];
    }
    return true;
  }
  // Added in float64, rounded once to f32: as close to the exact sum as f32 can be but for a
  // double rounding in rare cases.
  double part[8] = {};
  for (int i = 0; i < kGroup; i += 8) {
    for (int k = 0; k < 8; ++k) part[k] += static_cast<double>(xg[i + k]);
  }
  sum = static_cast<float>(((part[0] + part[4]) + (part[2] + part[6])) +
                           ((part[1] + part[5]) + (part[3] + part[7])));
  // |x| / s <= 127 up to one f32 rounding (amax / s = 127 * (1 +- 2^-23)), so the nearest
  // integer (ties to even) is within [-127, 127]: the hi code. What it leaves, x / s - hi, is
  // in [-1/2, 1/2] and exact in f32 (hi is the nearest integer to x / s); times 128 (exact) and
  // rounded it is the lo code, in [-64, 64]. x is then 128 * hi + lo units of s / 128, off by at
  // most s / 256: 128 times closer than hi alone. A zero group (s = 0) gets codes 0, not 0 / 0.
  scale = s / 128.0f;  // exact (a power of two) unless s is subnormal
  if (s > 0.0f) {
    for (int i = 0; i < kGroup; ++i) {
      const float v = xg[i] / s;
      const float hi = std::nearbyint(v);
      nat[i] = static_cast<int8_t>(hi);
      nat_lo[i] = static_cast<int8_t>(std::nearbyint((v - hi) * 128.0f));
    }
  } else {
    for (int i = 0; i < kGroup; ++i) nat[i] = nat_lo[i] = 0;
  }
  for (int j = 0; j < 32; ++j) {  // element 2j to even[j], 2j+1 to the odd half at even[64 + j]
    even[j] = nat[2 * j];
    even[64 + j] = nat[2 * j + 1];
    even_lo[j] = nat_lo[2 * j];
    even_lo[64 + j] = nat_lo[2 * j + 1];
  }
  return true;
}

}  // namespace

const char* int8_isa_name(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::automatic: return int8_isa_name(best());
    case Int8Isa::avx512_vnni: return "avx512_vnni";
    case Int8Isa::avx_vnni: return "avx_vnni";
    case Int8Isa::avx2: return "avx2";
    case Int8Isa::scalar: return "scalar";
  }
  return "unknown";
}

const char* int8_dot_isa() { return int8_isa_name(best()); }

bool int8_isa_supported(Int8Isa isa) {
  const Int8Isa have = best();
  switch (isa) {
    case Int8Isa::automatic:
    case Int8Isa::scalar: return true;
    // Each vector path's target contains the next one's (detect tests them in this order), except
    // that AVX-VNNI is its own CPUID bit: an AVX-512 VNNI CPU may lack it.
    case Int8Isa::avx512_vnni: return have == Int8Isa::avx512_vnni;
    case Int8Isa::avx_vnni: return have != Int8Isa::scalar && have != Int8Isa::avx2 && cpu_has_avx_vnni();
    case Int8Isa::avx2: return have != Int8Isa::scalar;
  }
  return false;
}

void quantize_activations(const float* x, int64_t in, Q8Activations& out, int planes) {
  require(in > 0 && in % kGroup == 0, "quantize_activations",
          "input of " + std::to_string(in) + " elements, expected a positive multiple of 64");
  require(planes == 1 || planes == 2, "quantize_activations",
          std::to_string(planes) + " planes, expected 1 or 2");
  const int64_t groups = in / kGroup;
  const int64_t pairs = (groups + 1) / 2;
  const bool two = planes == 2;
  out.in = in;
  out.planes = planes;
  out.natural.resize(static_cast<size_t>(in));
  out.natural_lo.resize(two ? static_cast<size_t>(in) : 0);
  out.q4_order.assign(static_cast<size_t>(pairs * 128), 0);  // zeros: a lone last group's partner
  out.q4_order_lo.assign(two ? static_cast<size_t>(pairs * 128) : 0, 0);
  out.scales.resize(static_cast<size_t>(groups));
  out.sums.resize(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * kGroup;
    const int64_t q4_at = (g / 2) * 128 + (g % 2) * 32;
    if (!quantize_group(xg, out.natural.data() + g * kGroup, out.q4_order.data() + q4_at,
                        two ? out.natural_lo.data() + g * kGroup : nullptr,
                        two ? out.q4_order_lo.data() + q4_at : nullptr,
                        out.scales[static_cast<size_t>(g)], out.sums[static_cast<size_t>(g)])) {
      int64_t bad = 0;
      while (std::isfinite(xg[bad])) ++bad;
      require(false, "quantize_activations",
              "element " + std::to_string(g * kGroup + bad) + " is " + std::to_string(xg[bad]) +
                  ", expected a finite value (NaN and infinity have no int8 code)");
    }
  }
}

float int8_row_dot(const QuantView& w, int64_t row, const Q8Activations& x, Int8Isa isa) {
  check("int8_row_dot", w, row, 1, x);
  return select(isa, w.bits)(locate(w, row), x);
}

void int8_rows_dot(const QuantView& w, int64_t row_begin, int64_t rows, const Q8Activations& x,
                   float* y, Int8Isa isa) {
  check("int8_rows_dot", w, row_begin, rows, x);
  require(rows == 0 || y != nullptr, "int8_rows_dot", "no output buffer for " + std::to_string(rows) + " rows");
  const RowDot dot = select(isa, w.bits);
  for (int64_t r = 0; r < rows; ++r) y[r] = dot(locate(w, row_begin + r), x);
}

void int8_rows_dot_tokens(const QuantView& w, int64_t row_begin, int64_t rows,
                          const Q8Activations* const* xs, int64_t n, float* y, int64_t y_stride,
                          Int8Isa isa) {
  constexpr const char* kOp = "int8_rows_dot_tokens";
  require(n >= 0, kOp, "token count " + std::to_string(n) + ", expected >= 0");
  if (n == 0 || rows == 0) return;
  require(xs != nullptr && y != nullptr, kOp, "no token list or no output buffer");
  require(y_stride >= rows, kOp,
          "output stride " + std::to_string(y_stride) + " below the " + std::to_string(rows) + " rows");
  for (int64_t t = 0; t < n; ++t) {
    if (xs[t] == nullptr) require(false, kOp, "token " + std::to_string(t) + " is null");
    // The full check once (the weight, the rows), then only the widths: one call per op chunk.
    if (t == 0 || xs[t]->in != xs[0]->in) check(kOp, w, row_begin, rows, *xs[t]);
    if (xs[t]->planes != xs[0]->planes) {
      require(false, kOp,
              "token " + std::to_string(t) + " is quantised in " + std::to_string(xs[t]->planes) +
                  " planes, token 0 in " + std::to_string(xs[0]->planes) +
                  ": expected one count for the call");
    }
  }
  if (isa == Int8Isa::automatic) isa = best();
  if (isa == Int8Isa::avx512_vnni && int8_isa_supported(isa)) {
    const bool one = xs[0]->planes == 1;
    if (w.bits == 4) {
      one ? tokens_lanes_q4<1>(w, row_begin, rows, xs, n, y, y_stride)
          : tokens_lanes_q4<2>(w, row_begin, rows, xs, n, y, y_stride);
    } else {
      one ? tokens_avx512<8, 1>(w, row_begin, rows, xs, n, y, y_stride)
          : tokens_avx512<8, 2>(w, row_begin, rows, xs, n, y, y_stride);
    }
    return;
  }
  // The other paths: the one-token dot per (row, token), tokens in tiles so that a row's codes
  // stay in L1 across a tile (bit-identical by construction; this box runs the AVX-512 path).
  const RowDot dot = select(isa, w.bits);
  for (int64_t t0 = 0; t0 < n; t0 += kTokenTile) {
    const int64_t tn = std::min(kTokenTile, n - t0);
    for (int64_t r = 0; r < rows; ++r) {
      const Row row = locate(w, row_begin + r);
      for (int64_t t = t0; t < t0 + tn; ++t) y[t * y_stride + r] = dot(row, *xs[t]);
    }
  }
}

}  // namespace lily::cpu

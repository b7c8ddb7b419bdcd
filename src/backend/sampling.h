// The token-choice contract shared by every backend: sampling parameters, device buffers, records.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace lily {

// At most this many logit_bias entries per request (the request parser enforces it).
inline constexpr int kMaxLogitBias = 1024;
// OpenAI's limit for top_logprobs.
inline constexpr int kMaxTopLogprobs = 20;

// One sequence's sampling parameters, laid out as plain 32-bit words so that they can live in
// backend memory (a replayed CUDA graph reads the current request's values there). The order in
// which they apply is fixed (docs/sampling.md):
//   1. repetition penalty over the ids seen in the prompt or the output: l > 0 ? l / r : l * r
//   2. frequency and presence penalties over the output: l -= f * count + p * (count > 0)
//   3. logit_bias: l[id] += bias
//   4. temperature == 0: the argmax of the processed logits (lowest id on ties); done
//   5. top_k: keep the k largest processed logits (sorted by logit descending, then id
//      ascending; exactly k survive, ties broken by id)
//   6. probabilities p = softmax(l / T) over the survivors
//   7. top_p: keep the shortest prefix of that order whose mass is >= top_p of the survivors'
//   8. min_p: keep p >= min_p * p_max
//   9. u = uniform [0, 1) from Philox4x32-10(key = seed, counter = (step, 0, 0, 0)):
//      (word0 >> 8) * 2^-24; the token is the first survivor in id order whose running mass
//      exceeds u * (the survivors' mass)
// Every stage with its neutral value (r = 1, f = p = 0, no bias, k = 0, top_p = 1,
// min_p = 0) changes nothing.
//
// The arithmetic, exactly (every backend; the helpers below are the shared definitions):
//   * Stages 1-3 are f32 operations, each rounded once, in this order: l / r or l * r (only
//     where r != 1 and the id was seen), then l - (f * float(count) + p) where count > 0, then
//     l + bias. Afterwards NaN counts as -inf and +inf as FLT_MAX ("the processed logits"; a
//     backend computes them bit-identically). M is their maximum. If M == -inf, or T == 0,
//     the token is the argmax (stage 4).
//   * Stage 5's order compares processed logits as floats (-0 == +0), then ids: rank_key.
//   * Stage 6's masses are integers: q = round-half-even(e^d * 2^kMassBits) with
//     d = (l - M) / T in f32 (two roundings) and e^d = sampler_exp(d), so the maximum has
//     q = 2^40 and every logit with d <= kMassCutoff has q = 0 (e^-30 * 2^40 < 0.11): the
//     same bits on every backend (sampler_mass). Everything after it is exact integer
//     arithmetic, so parallel sums in any order give the same result, and every backend draws
//     the same token from the same logits.
//   * Stage 7 keeps the shortest prefix (at least one) with sum(q) >= top_p_threshold(top_p,
//     Z), Z = the mass of stage 5's survivors. Stage 8 keeps q >= min_p_threshold(min_p)
//     (p / p_max = q / 2^40: the maximum always survives stages 5 and 7).
//   * Stage 9: the token is the first survivor in id order whose running sum of q exceeds
//     draw_target(u24, Zs), Zs = the survivors' mass and u24 = sampler_u24(...) = u * 2^24.
// Limits: vocab in [1, kMaxSamplerVocab] (ids fit the 24 bits of rank_key, Z < 2^64).
struct SamplerParams {
  float temperature = 1.0f;         // 0: argmax; otherwise (0, 2]
  float top_p = 1.0f;               // (0, 1]; 1: off
  int32_t top_k = 0;                // >= 0; 0 or >= vocab: off
  float min_p = 0.0f;               // [0, 1]; 0: off
  float presence_penalty = 0.0f;    // [-2, 2]
  float frequency_penalty = 0.0f;   // [-2, 2]
  float repetition_penalty = 1.0f;  // (0, 2]; 1: off
  uint32_t seed_lo = 0;             // Philox key word 0
  uint32_t seed_hi = 0;             // Philox key word 1
  int32_t top_logprobs = -1;        // -1: no logprobs; 0..kMaxTopLogprobs (for token_logprobs)
  int32_t bias_count = 0;           // 0..kMaxLogitBias entries below are used
  int32_t bias_ids[kMaxLogitBias] = {};   // distinct ids < vocab
  float bias_values[kMaxLogitBias] = {};  // [-100, 100]
};
static_assert(std::is_trivially_copyable_v<SamplerParams>);
static_assert(sizeof(SamplerParams) % sizeof(int32_t) == 0);
inline constexpr int64_t kSamplerParamWords = sizeof(SamplerParams) / sizeof(int32_t);

// One sequence's sampler state in backend memory (allocated with Backend::alloc_i32). The
// host writes all four before the sequence's first token (upload_sampler); after that only
// the sample op changes counts and step, so a replayed graph needs nothing from the host.
struct SamplerBuffers {
  int32_t* params = nullptr;       // [kSamplerParamWords] the SamplerParams bytes
  int32_t* counts = nullptr;       // [vocab] i32: how often each id was sampled so far
  int32_t* prompt_seen = nullptr;  // [vocab] i32: 1 where the prompt holds the id, else 0
  int32_t* step = nullptr;         // [1] i32: tokens sampled so far (the Philox counter)
};

// What token_logprobs writes, as i32 words (floats stored by their bits): the chosen token,
// its log-probability under the raw logits (log_softmax, before any sampling stage), and the
// top_logprobs largest raw logits' ids and log-probabilities, descending (ties: lower id).
struct TokenRecordLayout {
  static constexpr int kToken = 0;
  static constexpr int kLogprob = 1;      // f32 bits
  static constexpr int kTopCount = 2;     // n = top_logprobs (0..20)
  static constexpr int kTopIds = 3;       // [20] i32, first n used
  static constexpr int kTopLogprobs = 3 + kMaxTopLogprobs;  // [20] f32 bits, first n used
  static constexpr int kWords = 3 + 2 * kMaxTopLogprobs;    // 43
};

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
// generator of cuRAND and JAX: a pure function of (counter, key), so the host and the device
// give the same numbers without carrying generator state.
struct Philox4x32 {
  uint32_t v[4];
};
#if defined(__CUDACC__)
__host__ __device__
#endif
inline Philox4x32 philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * counter.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * counter.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    counter = Philox4x32{{hi1 ^ counter.v[1] ^ key0, lo1, hi0 ^ counter.v[3] ^ key1, lo0}};
    key0 += kW0;
    key1 += kW1;
  }
  return counter;
}

#if defined(__CUDACC__)
#define LILY_SAMPLER_HD __host__ __device__
#else
#define LILY_SAMPLER_HD
#endif

// Stage 9's uniform as a 24-bit integer (u = u24 * 2^-24) for draw number `step` of a
// sequence seeded with (seed_lo, seed_hi): the top 24 bits of Philox word 0.
LILY_SAMPLER_HD inline uint32_t sampler_u24(uint32_t seed_lo, uint32_t seed_hi, uint32_t step) {
  const Philox4x32 out = philox4x32_10(Philox4x32{{step, 0u, 0u, 0u}}, seed_lo, seed_hi);
  return out.v[0] >> 8;
}

// Stage 9's uniform for draw number `step` of a sequence seeded with (seed_lo, seed_hi).
LILY_SAMPLER_HD inline float sampler_uniform(uint32_t seed_lo, uint32_t seed_hi, uint32_t step) {
  return static_cast<float>(sampler_u24(seed_lo, seed_hi, step)) * (1.0f / 16777216.0f);
}

// ---- The exact arithmetic of stages 5-9 (see SamplerParams) -------------------------------
inline constexpr int kMassBits = 40;
inline constexpr uint64_t kMassOne = uint64_t{1} << kMassBits;  // q of the maximum
inline constexpr float kMassCutoff = -30.0f;                    // d <= this: q = 0
inline constexpr int64_t kMaxSamplerVocab = (int64_t{1} << 24) - 1;

__extension__ typedef unsigned __int128 SamplerU128;  // exact products of masses

// The order-preserving key of a processed logit: a > b (as floats) iff key(a) > key(b), and
// key(-0) == key(+0). NaN never occurs (the processed logits have none).
LILY_SAMPLER_HD inline uint32_t logit_key(float logit) {
  uint32_t bits;
  std::memcpy(&bits, &logit, sizeof bits);
  if (bits == 0x80000000u) bits = 0;  // -0 -> +0
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}
LILY_SAMPLER_HD inline float key_logit(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) != 0 ? key & 0x7FFFFFFFu : ~key;
  float logit;
  std::memcpy(&logit, &bits, sizeof logit);
  return logit;
}

// Stage 5's order as one integer: rank_key(a) > rank_key(b) iff a comes first (larger logit,
// then lower id). 56 bits: the logit key, then 2^24 - 1 - id. 0 ranks after every token.
LILY_SAMPLER_HD inline uint64_t rank_key(uint32_t key, int32_t id) {
  return (static_cast<uint64_t>(key) << 24) | (0xFFFFFFu - (static_cast<uint32_t>(id) & 0xFFFFFFu));
}
LILY_SAMPLER_HD inline int32_t rank_key_id(uint64_t rank) {
  return static_cast<int32_t>(0xFFFFFFu - static_cast<uint32_t>(rank & 0xFFFFFFu));
}
LILY_SAMPLER_HD inline uint32_t rank_key_logit_key(uint64_t rank) {
  return static_cast<uint32_t>(rank >> 24);
}

// f32 operations rounded once each: on the device as intrinsics (nvcc would fuse a multiply and
// an add into an FMA); host code that uses them must not contract either (the CPU sampler is
// compiled with -ffp-contract=off semantics).
LILY_SAMPLER_HD inline float sampler_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LILY_SAMPLER_HD inline float sampler_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LILY_SAMPLER_HD inline float sampler_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LILY_SAMPLER_HD inline float sampler_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Stage 6's exp, the same bits on every backend: e^x for x in [-87, 0] (below: e^-87) within
// 2 ulp; e^0 is exactly 1. x = n ln2 + r with |r| <= ln2/2 (Cody-Waite: ln2 in two parts, so
// that n * 0.693359375 is exact), e^r by Cephes' expf polynomial, 2^n from its exponent bits.
// No branch and no call: the CPU's loops vectorise it.
LILY_SAMPLER_HD inline float sampler_exp(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = sampler_sub(sampler_add(sampler_mul(x, 1.44269504088896341f), 12582912.0f),
                              12582912.0f);  // round(x / ln2), half to even
  const float r = sampler_sub(sampler_sub(x, sampler_mul(n, 0.693359375f)),
                              sampler_mul(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = sampler_add(sampler_mul(p, r), 1.3981999507e-3f);
  p = sampler_add(sampler_mul(p, r), 8.3334519073e-3f);
  p = sampler_add(sampler_mul(p, r), 4.1665795894e-2f);
  p = sampler_add(sampler_mul(p, r), 1.6666665459e-1f);
  p = sampler_add(sampler_mul(p, r), 5.0000001201e-1f);
  const float er = sampler_add(sampler_add(sampler_mul(p, sampler_mul(r, r)), r), 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return sampler_mul(er, scale);
}

// q from e^d (evaluated only for d > kMassCutoff): round half to even of e^d * 2^40, which is
// exact in double (a float times a power of two).
LILY_SAMPLER_HD inline uint64_t mass_from_exp(float e) {
  const double scaled = static_cast<double>(e) * static_cast<double>(kMassOne);
  // 2^52 + scaled rounds to an integer, half to even (0 <= scaled <= 2^40), and the low bits of
  // that double are the integer (its ulp is 1): no float-to-integer conversion, so it vectorises.
  const double shifted = scaled + 4503599627370496.0;
  uint64_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return bits - 0x4330000000000000u;  // the bits of 2^52
}

// Stage 6's mass of a processed logit: d = (l - M) / T in f32, q = 0 at or below the cutoff.
// Every backend computes every mass here, so they agree bit for bit.
LILY_SAMPLER_HD inline uint64_t sampler_mass(float logit, float max, float temperature) {
  const float d = sampler_div(sampler_sub(logit, max), temperature);
  const uint64_t q = mass_from_exp(sampler_exp(d));  // always evaluated: the loops vectorise
  return d > kMassCutoff ? q : 0;
}

// ceil(top_p * z), exactly (top_p in (0, 1]; a non-positive or NaN top_p gives 1, so that
// stage 7 keeps one token, and anything above 1 gives z).
LILY_SAMPLER_HD inline uint64_t top_p_threshold(float top_p, uint64_t z) {
  if (!(top_p > 0.0f)) return 1;
  if (top_p >= 1.0f) return z;
  uint32_t bits;
  std::memcpy(&bits, &top_p, sizeof bits);
  const uint32_t exponent = (bits >> 23) & 0xFFu;
  // top_p = mantissa * 2^-shift with a 24-bit mantissa (a subnormal has no implicit bit).
  const uint64_t mantissa = exponent == 0 ? (bits & 0x7FFFFFu) : ((bits & 0x7FFFFFu) | 0x800000u);
  const int shift = exponent == 0 ? 149 : 150 - static_cast<int>(exponent);  // >= 24 here
  const SamplerU128 product = static_cast<SamplerU128>(mantissa) * z;  // < 2^88
  if (shift >= 96) return product != 0 ? 1 : 0;                       // below 1, above 0
  const SamplerU128 one = static_cast<SamplerU128>(1) << shift;
  return static_cast<uint64_t>((product + one - 1) >> shift);
}

// ceil(min_p * 2^40): stage 8 keeps q >= this (min_p in [0, 1]; NaN or below 0 gives 0, above
// 1 gives 2^40, so that the maximum always survives).
LILY_SAMPLER_HD inline uint64_t min_p_threshold(float min_p) {
  if (!(min_p > 0.0f)) return 0;
  if (min_p >= 1.0f) return kMassOne;
  return static_cast<uint64_t>(std::ceil(static_cast<double>(min_p) * static_cast<double>(kMassOne)));
}

// floor(u24 * zs / 2^24): the token is the first survivor (id order) whose running mass
// exceeds this. Below zs, so the last survivor with a mass is always reached.
LILY_SAMPLER_HD inline uint64_t draw_target(uint32_t u24, uint64_t zs) {
  return static_cast<uint64_t>((static_cast<SamplerU128>(u24) * zs) >> 24);
}

#undef LILY_SAMPLER_HD

// Empty when `p` is within the contract for a vocabulary of `vocab` ids, else what is wrong
// (the CPU backend rejects such parameters; a device backend reads them where the host cannot
// check, so the host checks them before it uploads them: Engine::upload_sampler).
inline std::string sampler_params_error(const SamplerParams& p, int64_t vocab) {
  const auto within = [](float v, float lo, float hi) { return v >= lo && v <= hi; };
  if (vocab < 1 || vocab > kMaxSamplerVocab) {
    return "vocab " + std::to_string(vocab) + " is outside [1, " +
           std::to_string(kMaxSamplerVocab) + "]";
  }
  if (!(p.temperature == 0.0f || (p.temperature > 0.0f && p.temperature <= 2.0f))) {
    return "temperature must be 0 or in (0, 2]";
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return "top_p must be in (0, 1]";
  if (p.top_k < 0) return "top_k must be >= 0";
  if (!within(p.min_p, 0.0f, 1.0f)) return "min_p must be in [0, 1]";
  if (!within(p.presence_penalty, -2.0f, 2.0f)) return "presence_penalty must be in [-2, 2]";
  if (!within(p.frequency_penalty, -2.0f, 2.0f)) return "frequency_penalty must be in [-2, 2]";
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= 2.0f)) {
    return "repetition_penalty must be in (0, 2]";
  }
  if (p.top_logprobs < -1 || p.top_logprobs > kMaxTopLogprobs) {
    return "top_logprobs must be in [-1, " + std::to_string(kMaxTopLogprobs) + "]";
  }
  if (p.bias_count < 0 || p.bias_count > kMaxLogitBias) {
    return "bias_count must be in [0, " + std::to_string(kMaxLogitBias) + "]";
  }
  std::array<int32_t, kMaxLogitBias> ids{};
  for (int32_t j = 0; j < p.bias_count; ++j) {
    const auto at = static_cast<size_t>(j);
    if (p.bias_ids[at] < 0 || p.bias_ids[at] >= vocab) {
      return "bias_ids[" + std::to_string(j) + "] = " + std::to_string(p.bias_ids[at]) +
             " is outside [0, " + std::to_string(vocab) + ")";
    }
    if (!within(p.bias_values[at], -100.0f, 100.0f)) {
      return "bias_values[" + std::to_string(j) + "] must be in [-100, 100]";
    }
    ids[at] = p.bias_ids[at];
  }
  std::sort(ids.begin(), ids.begin() + p.bias_count);
  const auto dup = std::adjacent_find(ids.begin(), ids.begin() + p.bias_count);
  if (dup != ids.begin() + p.bias_count) {
    return "bias_ids holds " + std::to_string(*dup) + " twice";
  }
  return {};
}

}  // namespace lily

// The token-choice contract shared by every backend: sampling parameters, device buffers, records.
#pragma once

#include <cstdint>
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

// Stage 9's uniform for draw number `step` of a sequence seeded with (seed_lo, seed_hi).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline float sampler_uniform(uint32_t seed_lo, uint32_t seed_hi, uint32_t step) {
  const Philox4x32 out = philox4x32_10(Philox4x32{{step, 0u, 0u, 0u}}, seed_lo, seed_hi);
  return static_cast<float>(out.v[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace lily

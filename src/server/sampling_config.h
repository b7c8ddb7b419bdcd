// How a request's sampling fields and the server's defaults become one token choice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/sampling.h"

namespace lily {

struct SamplingFields;  // chat_request.h / openai_types.h

// Server-wide defaults for the fields a request leaves out (`lily serve --temperature …`, or
// `--sampling-defaults checkpoint`: the checkpoint's generation_config.json). Absent: neutral.
struct SamplingDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> presence_penalty;
  std::optional<double> frequency_penalty;
  std::optional<double> repetition_penalty;
  bool any() const;
  std::string describe() const;  // "temperature=0.7 top_p=0.8" or "greedy"
};

// Whether a request chose anything of the token distribution: a sampling field or a
// logit_bias (a seed alone does not).
bool request_sets_sampling(const SamplingFields& request);

// Reads generation_config.json as transformers writes it: with "do_sample": false (or absent
// with no sampling key) the defaults stay greedy; otherwise the keys present among
// temperature, top_p, top_k, min_p and repetition_penalty become defaults (absent keys stay
// neutral, not transformers' own defaults such as top_k 50). Values are range-checked like
// request fields. Throws InputError naming the file and the field.
SamplingDefaults read_generation_config(const std::string& path);

// Parses a sampling flag's value: a decimal number in [min, max]. Throws InputError naming
// `flag`, the value's source as the user wrote it ("--temperature", "LILY_TEMPERATURE").
double parse_sampling_flag(const std::string& flag, const std::string& text, double min,
                           double max);

// The token choice for a request (docs/sampling.md): nullopt means the greedy argmax of the
// raw logits (Lily's decoding), which is what a request that sets none of temperature, top_p,
// top_k, min_p, the three penalties and logit_bias gets when the server has no defaults (a
// `seed` alone changes nothing), and also what temperature 0 without penalties or bias is.
// Otherwise the fields the request leaves out come from `defaults`, then neutral values
// (temperature 1, as OpenAI); the seed is the request's, else `fallback_seed`.
std::optional<SamplerParams> resolve_sampling(const SamplingFields& request,
                                              const SamplingDefaults& defaults,
                                              uint64_t fallback_seed);

}  // namespace lily

// How a request's sampling fields and the server's defaults become one token choice.
#include "server/sampling_config.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/strict_json.h"
#include "server/openai_types.h"

namespace lily {

namespace {

template <typename T>
T pick(const std::optional<T>& request, const std::optional<T>& fallback, T neutral) {
  if (request) return *request;
  if (fallback) return *fallback;
  return neutral;
}

// "[0, 2]" rather than std::to_string's "[0.000000, 2.000000]".
std::string range_text(double min, double max) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[%g, %g]", min, max);
  return buf;
}

double config_number(const Json& root, const char* key, const std::string& path, double min,
                     double max) {
  const Json& v = root.at(key);
  if (!v.is_number()) {
    throw InputError(path + ": " + key + " must be a number, found " + describe_json(v));
  }
  const double x = v.get<double>();
  if (!(x >= min && x <= max)) {
    throw InputError(path + ": " + key + " must be in " + range_text(min, max) + ", found " +
                     describe_json(v));
  }
  return x;
}

}  // namespace

bool request_sets_sampling(const SamplingFields& f) {
  return f.temperature || f.top_p || f.top_k || f.min_p || f.presence_penalty ||
         f.frequency_penalty || f.repetition_penalty || !f.logit_bias.empty();
}

bool SamplingDefaults::any() const {
  return temperature || top_p || top_k || min_p || presence_penalty || frequency_penalty ||
         repetition_penalty;
}

std::string SamplingDefaults::describe() const {
  if (!any()) return "greedy";
  std::string out;
  auto add = [&out](const char* name, const std::optional<double>& v) {
    if (!v) return;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s=%g", out.empty() ? "" : " ", name, *v);
    out += buf;
  };
  add("temperature", temperature);
  add("top_p", top_p);
  if (top_k) {
    if (!out.empty()) out += ' ';
    out += "top_k=";
    out += std::to_string(*top_k);
  }
  add("min_p", min_p);
  add("presence_penalty", presence_penalty);
  add("frequency_penalty", frequency_penalty);
  add("repetition_penalty", repetition_penalty);
  return out;
}

SamplingDefaults read_generation_config(const std::string& path) {
  const Json root = read_strict_json_file(path, 1u << 20, 16);
  if (!root.is_object()) {
    throw InputError(path + ": expected a JSON object, found " + describe_json(root));
  }
  SamplingDefaults out;
  if (auto it = root.find("do_sample"); it != root.end()) {
    if (!it->is_boolean()) {
      throw InputError(path + ": do_sample must be true or false, found " + describe_json(*it));
    }
    if (!it->get<bool>()) return out;  // greedy
  }
  if (root.contains("temperature")) out.temperature = config_number(root, "temperature", path, 0, 2);
  if (root.contains("top_p")) out.top_p = config_number(root, "top_p", path, 1e-9, 1);
  if (root.contains("min_p")) out.min_p = config_number(root, "min_p", path, 0, 1);
  if (root.contains("repetition_penalty")) {
    out.repetition_penalty = config_number(root, "repetition_penalty", path, 1e-9, 2);
  }
  if (auto it = root.find("top_k"); it != root.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      throw InputError(path + ": top_k must be a non-negative integer, found " +
                       describe_json(*it));
    }
    out.top_k = it->get<int64_t>();
  }
  return out;
}

double parse_sampling_flag(const std::string& flag, const std::string& text, double min,
                           double max) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value)) {
    throw InputError(flag + " expects a number, found \"" + text + "\"");
  }
  if (!(value >= min && value <= max)) {
    throw InputError(flag + " must be in " + range_text(min, max) + ", found " + text);
  }
  return value;
}

std::optional<SamplerParams> resolve_sampling(const SamplingFields& request,
                                              const SamplingDefaults& defaults,
                                              uint64_t fallback_seed) {
  if (!request_sets_sampling(request) && !defaults.any()) return std::nullopt;
  SamplerParams p;
  p.temperature = static_cast<float>(pick(request.temperature, defaults.temperature, 1.0));
  p.top_p = static_cast<float>(pick(request.top_p, defaults.top_p, 1.0));
  const int64_t top_k = pick(request.top_k, defaults.top_k, int64_t{0});
  p.top_k = top_k < 0 ? 0 : static_cast<int32_t>(std::min<int64_t>(top_k, INT32_MAX));
  p.min_p = static_cast<float>(pick(request.min_p, defaults.min_p, 0.0));
  p.presence_penalty =
      static_cast<float>(pick(request.presence_penalty, defaults.presence_penalty, 0.0));
  p.frequency_penalty =
      static_cast<float>(pick(request.frequency_penalty, defaults.frequency_penalty, 0.0));
  p.repetition_penalty =
      static_cast<float>(pick(request.repetition_penalty, defaults.repetition_penalty, 1.0));
  const uint64_t seed = request.seed ? *request.seed : fallback_seed;
  p.seed_lo = static_cast<uint32_t>(seed);
  p.seed_hi = static_cast<uint32_t>(seed >> 32);
  const size_t bias = std::min<size_t>(request.logit_bias.size(), kMaxLogitBias);
  p.bias_count = static_cast<int32_t>(bias);
  for (size_t i = 0; i < bias; ++i) {
    p.bias_ids[i] = static_cast<int32_t>(request.logit_bias[i].first);
    p.bias_values[i] = request.logit_bias[i].second;
  }
  const bool processes = p.presence_penalty != 0 || p.frequency_penalty != 0 ||
                         p.repetition_penalty != 1 || p.bias_count > 0;
  if (p.temperature == 0 && !processes) return std::nullopt;  // exactly the argmax
  return p;
}

}  // namespace lily

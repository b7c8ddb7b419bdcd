// The server's operational metrics and their Prometheus text exposition (GET /metrics).
#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace lily {

namespace {

constexpr std::array<std::string_view, 4> kEndpoints = {"/health", "/v1/models",
                                                        "/v1/chat/completions", "/metrics"};

// Seconds: from a fraction of a decode step to a long request.
std::vector<double> duration_buckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
}

std::vector<double> inter_token_buckets() {
  return {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5};
}

// A sample value as Prometheus reads it: shortest round-trip decimal, +Inf/NaN spelled out.
std::string number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  const auto written = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, written.ptr);
}

void header(std::string& out, std::string_view name, std::string_view type,
            std::string_view help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, std::string_view name, std::string_view labels, double value) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  out += number(value);
  out += '\n';
}

void single(std::string& out, std::string_view name, std::string_view type,
            std::string_view help, double value) {
  header(out, name, type, help);
  sample(out, name, "", value);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), value);  // le: value <= bound
  std::lock_guard lock(mutex_);
  ++counts_[static_cast<size_t>(at - bounds_.begin())];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, std::string_view name, std::string_view labels) const {
  std::lock_guard lock(mutex_);
  const std::string prefix = labels.empty() ? std::string() : std::string(labels) + ",";
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    sample(out, bucket, prefix + "le=\"" + le + "\"", static_cast<double>(cumulative));
  }
  sample(out, std::string(name) + "_sum", labels, sum_);
  sample(out, std::string(name) + "_count", labels, static_cast<double>(count_));
}

ServerMetrics::ServerMetrics()
    : time_to_first_token_(duration_buckets()), inter_token_(inter_token_buckets()) {}

std::string_view ServerMetrics::endpoint_label(std::string_view path) {
  for (std::string_view endpoint : kEndpoints) {
    if (path == endpoint) return endpoint;
  }
  return "other";
}

void ServerMetrics::observe_request(std::string_view path, int status, double seconds) {
  const std::string endpoint(endpoint_label(path));
  Histogram* duration = nullptr;
  {
    std::lock_guard lock(mutex_);
    ++requests_[{endpoint, status}];
    duration = &durations_.try_emplace(endpoint, duration_buckets()).first->second;
  }
  duration->observe(seconds);  // map nodes are stable; the histogram locks itself
}

void ServerMetrics::observe_completion(uint64_t prompt_tokens, uint64_t cached_tokens,
                                       uint64_t completion_tokens,
                                       double time_to_first_token_seconds,
                                       double decode_seconds) {
  {
    std::lock_guard lock(mutex_);
    ++completions_;
    prompt_tokens_ += prompt_tokens;
    generated_tokens_ += completion_tokens;
    if (cached_tokens > 0) ++cache_hits_;
    cached_tokens_ += cached_tokens;
    // The decode rate of the last answer with at least two tokens (the first comes from the
    // prefill).
    if (completion_tokens >= 2 && decode_seconds > 0) {
      last_decode_tokens_per_second_ = static_cast<double>(completion_tokens - 1) / decode_seconds;
    }
  }
  time_to_first_token_.observe(time_to_first_token_seconds);
}

void ServerMetrics::observe_inter_token(double seconds) { inter_token_.observe(seconds); }

void ServerMetrics::set_model_load_seconds(double seconds) {
  std::lock_guard lock(mutex_);
  model_load_seconds_ = seconds;
}

std::string ServerMetrics::render(const MetricsGauges& gauges) const {
  std::string out;
  std::lock_guard lock(mutex_);
  header(out, "lily_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, count] : requests_) {
    sample(out, "lily_requests_total",
           "endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"",
           static_cast<double>(count));
  }
  header(out, "lily_request_duration_seconds", "histogram",
         "From a request's first byte to its last response byte, by endpoint.");
  for (const auto& [endpoint, histogram] : durations_) {
    histogram.render(out, "lily_request_duration_seconds", "endpoint=\"" + endpoint + "\"");
  }
  single(out, "lily_queue_depth", "gauge", "Chat requests waiting behind the one running.",
         static_cast<double>(gauges.queue_depth));
  single(out, "lily_requests_in_flight", "gauge",
         "Requests handed to the API whose response is not completely written.",
         static_cast<double>(gauges.in_flight));
  single(out, "lily_completions_total", "counter", "Chat completions that finished generating.",
         static_cast<double>(completions_));
  single(out, "lily_prompt_tokens_total", "counter", "Prompt tokens of finished completions.",
         static_cast<double>(prompt_tokens_));
  single(out, "lily_generation_tokens_total", "counter",
         "Generated tokens of finished completions (stop tokens included).",
         static_cast<double>(generated_tokens_));
  single(out, "lily_cache_hits_total", "counter",
         "Finished completions that reused a cached prefix (strict prefix or snapshot).",
         static_cast<double>(cache_hits_));
  single(out, "lily_cached_tokens_total", "counter",
         "Prompt tokens reused from the session cache.", static_cast<double>(cached_tokens_));
  header(out, "lily_time_to_first_token_seconds", "histogram",
         "From a completion's arrival to its first generated token (queueing and prefill).");
  time_to_first_token_.render(out, "lily_time_to_first_token_seconds", "");
  header(out, "lily_inter_token_latency_seconds", "histogram",
         "Between two consecutive generated tokens of one completion.");
  inter_token_.render(out, "lily_inter_token_latency_seconds", "");
  single(out, "lily_decode_tokens_per_second", "gauge",
         "Decode rate of the last completion with two tokens or more.",
         last_decode_tokens_per_second_);
  single(out, "lily_device_memory_bytes", "gauge",
         "Memory the inference backend has allocated (weights, states, scratch).",
         static_cast<double>(gauges.device_memory_bytes));
  single(out, "lily_model_load_seconds", "gauge", "Seconds from start to ready.",
         model_load_seconds_);
  return out;
}

}  // namespace lily

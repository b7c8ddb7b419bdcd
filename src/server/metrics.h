// The server's operational metrics and their Prometheus text exposition (GET /metrics).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lily {

// A Prometheus histogram: cumulative bucket counts by upper bound, sum and count. Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
  void observe(double value);
  // Appends `name_bucket{le="..."}`, `name_sum` and `name_count` samples (with `labels`, e.g.
  // `endpoint="/v1/chat/completions"`, or empty).
  void render(std::string& out, std::string_view name, std::string_view labels) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last: above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Values read when /metrics is served (they live elsewhere: the engine, the transport).
struct MetricsGauges {
  uint64_t queue_depth = 0;          // requests waiting behind the one running
  uint64_t in_flight = 0;            // requests handed to the API, response not yet written
  uint64_t device_memory_bytes = 0;  // the backend's allocations (weights, states, scratch)
};

// Counters and histograms of the whole process. Thread-safe: observed from the transport's
// threads and the inference thread.
class ServerMetrics {
 public:
  ServerMetrics();

  // Every answered request (the transport's log line): requests by endpoint and status, and
  // the request duration. `path` is bucketed to the known endpoints ("other" for the rest),
  // so that a client cannot grow the label set.
  void observe_request(std::string_view path, int status, double seconds);
  // A finished chat completion (not cancelled, no error).
  void observe_completion(uint64_t prompt_tokens, uint64_t cached_tokens,
                          uint64_t completion_tokens, double time_to_first_token_seconds,
                          double decode_seconds);
  // The time between two consecutive generated tokens of one request.
  void observe_inter_token(double seconds);
  void set_model_load_seconds(double seconds);

  // The Prometheus text format (version 0.0.4): HELP and TYPE lines, then the samples.
  std::string render(const MetricsGauges& gauges) const;

  // The endpoint label of a path: one of the served routes, or "other".
  static std::string_view endpoint_label(std::string_view path);

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) -> count
  std::map<std::string, Histogram> durations_;                 // endpoint -> seconds
  uint64_t completions_ = 0;
  uint64_t prompt_tokens_ = 0;
  uint64_t generated_tokens_ = 0;
  uint64_t cache_hits_ = 0;
  uint64_t cached_tokens_ = 0;
  double last_decode_tokens_per_second_ = 0;
  double model_load_seconds_ = 0;
  Histogram time_to_first_token_;
  Histogram inter_token_;
};

}  // namespace lily

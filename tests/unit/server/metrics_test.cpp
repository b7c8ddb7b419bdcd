// ServerMetrics and Histogram: the Prometheus text exposition, bucket rules and label bounds.
#include <gtest/gtest.h>

#include <string>

#include "server/metrics.h"

namespace lily {
namespace {

// Buckets are "less than or equal" (Prometheus' le) and cumulative; +Inf holds every value.
TEST(Histogram, CumulativeLessOrEqualBuckets) {
  Histogram h({0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 1.0, 7.0}) h.observe(v);
  std::string out;
  h.render(out, "x_seconds", "a=\"b\"");
  EXPECT_EQ(out,
            "x_seconds_bucket{a=\"b\",le=\"0.1\"} 2\n"
            "x_seconds_bucket{a=\"b\",le=\"1\"} 4\n"
            "x_seconds_bucket{a=\"b\",le=\"+Inf\"} 5\n"
            "x_seconds_sum{a=\"b\"} 8.65\n"
            "x_seconds_count{a=\"b\"} 5\n");
  std::string bare;
  Histogram({1}).render(bare, "y", "");
  EXPECT_EQ(bare, "y_bucket{le=\"1\"} 0\ny_bucket{le=\"+Inf\"} 0\ny_sum 0\ny_count 0\n");
}

TEST(ServerMetrics, UnknownPathsShareOneLabel) {
  EXPECT_EQ(ServerMetrics::endpoint_label("/v1/chat/completions"), "/v1/chat/completions");
  EXPECT_EQ(ServerMetrics::endpoint_label("/metrics"), "/metrics");
  EXPECT_EQ(ServerMetrics::endpoint_label("/v1/chat/completions/x"), "other");
  EXPECT_EQ(ServerMetrics::endpoint_label("/a\"b"), "other") << "no client text in a label";
}

TEST(ServerMetrics, CountersAndGauges) {
  ServerMetrics m;
  m.observe_request("/v1/chat/completions", 200, 0.2);
  m.observe_request("/v1/chat/completions", 200, 0.3);
  m.observe_request("/x", 404, 0.001);
  m.observe_completion(10, 0, 5, 0.05, 0.4);  // 4 decode steps in 0.4 s: 10 tok/s
  m.observe_completion(12, 9, 1, 0.02, 0);    // one token: the rate keeps the last one
  m.observe_inter_token(0.1);
  m.set_model_load_seconds(1.5);
  const std::string text = m.render({.queue_depth = 2, .in_flight = 3, .device_memory_bytes = 7});
  for (const char* line : {
           "lily_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n",
           "lily_requests_total{endpoint=\"other\",status=\"404\"} 1\n",
           "lily_request_duration_seconds_count{endpoint=\"/v1/chat/completions\"} 2\n",
           "lily_request_duration_seconds_sum{endpoint=\"/v1/chat/completions\"} 0.5\n",
           "lily_queue_depth 2\n", "lily_requests_in_flight 3\n", "lily_completions_total 2\n",
           "lily_prompt_tokens_total 22\n", "lily_generation_tokens_total 6\n",
           "lily_cache_hits_total 1\n", "lily_cached_tokens_total 9\n",
           "lily_time_to_first_token_seconds_count 2\n",
           "lily_inter_token_latency_seconds_count 1\n", "lily_decode_tokens_per_second 10\n",
           "lily_device_memory_bytes 7\n", "lily_model_load_seconds 1.5\n",
           "# TYPE lily_requests_total counter\n",
           "# TYPE lily_time_to_first_token_seconds histogram\n",
           "# TYPE lily_queue_depth gauge\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "in\n" << text;
  }
}

}  // namespace
}  // namespace lily

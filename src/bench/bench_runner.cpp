// The benchmark measurement: warm-up, timed prefill and pipelined decode, bandwidth and matmul probes.
#include "bench/bench_runner.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <stdexcept>

#include "bench/workload.h"
#include "engine/sampler_state.h"

namespace lily {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

SamplerParams bench_sampling_params() {
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.top_k = 20;
  return p;
}

BenchMeasurement run_bench(Qwen36Model& model, DecodeState& state, const BenchOptions& options) {
  if (options.prompt_len <= 0 || options.decode_steps <= 0) {
    throw std::invalid_argument("bench: prompt_len and decode_steps must be positive");
  }
  if (options.prompt_len + options.decode_steps + 1 > state.capacity) {
    throw std::invalid_argument("bench: the state holds " + std::to_string(state.capacity) +
                                " tokens, the run needs prompt_len + decode_steps + 1");
  }
  const std::vector<int32_t> prompt = synthetic_prompt(options.prompt_len, model.shape().vocab_size);
  // The sampling arm's buffers are uploaded (zero counts, step 0) before each pass, outside
  // the timers, as the server does at the start of a request.
  std::optional<SamplerState> sampler;
  TokenChoice choice;
  if (options.sampling) {
    sampler.emplace(model.backend(), static_cast<int64_t>(model.shape().vocab_size));
    choice.sampler = &sampler->buffers();
  }
  auto reset = [&] {
    state.reset(model.backend());
    if (sampler) sampler->upload(*options.sampling, true, prompt);
  };

  // Warm-up with the exact shapes: grows scratch, faults pages in, trains branch predictors.
  reset();
  model.submit_prefill(state, prompt, 0, choice);
  model.submit_decode(state, 0, 1, choice);
  model.wait_token(1);
  model.submit_decode(state, 1, 0, choice);
  model.wait_token(0);

  BenchMeasurement m;
  reset();
  const Clock::time_point start = Clock::now();
  model.submit_prefill(state, prompt, 0, choice);
  model.submit_decode(state, 0, 1, choice);
  m.first_token = model.wait_token(0);
  Clock::time_point last = Clock::now();
  m.prefill_seconds = seconds(start, last);

  const int64_t steps = options.decode_steps;
  m.tokens.reserve(static_cast<size_t>(steps));
  m.step_seconds.reserve(static_cast<size_t>(steps));
  const Clock::time_point decode_start = last;
  for (int64_t index = 1; index <= steps; ++index) {
    // index == steps submits the lookahead, drained after the timer.
    const int from = static_cast<int>(index % 2);
    model.submit_decode(state, from, 1 - from, choice);
    m.tokens.push_back(model.wait_token(from));
    const Clock::time_point now = Clock::now();
    m.step_seconds.push_back(seconds(last, now));
    last = now;
  }
  m.decode_seconds = seconds(decode_start, last);
  model.wait_token(static_cast<int>((steps + 1) % 2));  // drain the lookahead
  m.digest = token_digest(m.tokens);
  return m;
}

double measure_copy_bandwidth(Backend& backend, uint64_t bytes, int repeats) {
  const size_t count = static_cast<size_t>(bytes / sizeof(float));
  float* src = backend.alloc(count);
  float* dst = backend.alloc(count);
  backend.copy(src, count, dst);  // fault both buffers in
  backend.synchronize();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point start = Clock::now();
    backend.copy(src, count, dst);
    backend.synchronize();
    best = std::min(best, seconds(start, Clock::now()));
  }
  return 2.0 * static_cast<double>(count * sizeof(float)) / best;
}

double measure_matmul_rate(Backend& backend, const Checkpoint& checkpoint, int64_t tokens,
                           int repeats) {
  const QuantView& w = checkpoint.weights.lm_head;
  const auto rows = std::min<int64_t>(static_cast<int64_t>(w.rows()), 8192);
  const auto in = static_cast<int64_t>(w.in);
  float* x = backend.alloc(static_cast<size_t>(tokens * in));
  float* y = backend.alloc(static_cast<size_t>(tokens * rows));
  backend.matmul(w, 0, rows, x, tokens, y);  // warm-up
  backend.synchronize();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point start = Clock::now();
    backend.matmul(w, 0, rows, x, tokens, y);
    backend.synchronize();
    best = std::min(best, seconds(start, Clock::now()));
  }
  return 2.0 * static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(tokens) /
         best;
}

}  // namespace lily

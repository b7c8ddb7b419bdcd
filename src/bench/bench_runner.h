// `lily bench`'s measurement contract (Lily's; docs/bench.md), over any backend through the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "model/qwen36_model.h"

namespace lily {

struct BenchOptions {
  int64_t prompt_len = 0;     // > 0
  int64_t decode_steps = 64;  // > 0
  // The sampling arm: every token (prefill and decode) drawn by Backend::sample with these
  // parameters instead of the argmax (`lily bench --sampling`: kBenchSampling).
  std::optional<SamplerParams> sampling;
};

// The sampling arm's parameters: temperature 1, top_p 0.95, top_k 20, seed 0.
SamplerParams bench_sampling_params();

struct BenchMeasurement {
  double prefill_seconds = 0;  // prompt in .. first token delivered, next step submitted
  int32_t first_token = 0;     // the prefill's token (not in the digest)
  double decode_seconds = 0;   // decode_steps deliveries after the prefill timer stopped
  std::vector<double> step_seconds;  // interval before each delivered decode token
  std::vector<int32_t> tokens;       // the decode tokens d_1 .. d_steps
  uint64_t digest = 0;               // token_digest(tokens)
};

// Runs the contract on `model`:
//   warm-up: the exact shapes (prefill of the same prompt, two decode steps) on the state;
//   measured: the state reset to empty (position 0, recurrent state and conv windows zeroed),
//     prefill timer: submit prefill -> slot 0, submit step 1 (0 -> 1), wait token 0;
//     decode timer: for index 1 .. steps-1: submit (index%2 -> (index+1)%2), wait and read
//     slot index%2; then submit the lookahead, read the last token; the lookahead is drained
//     outside the timer.
// On a synchronous backend a submit runs the step, so each timer covers exactly its own
// steps: the prefill timer the prompt plus decode step 1, the decode timer steps 2 .. steps+1.
// The state must hold prompt_len + decode_steps + 1 tokens.
BenchMeasurement run_bench(Qwen36Model& model, DecodeState& state, const BenchOptions& options);

// Device-memory copy bandwidth through Backend::copy: bytes read + bytes written per second,
// best of `repeats` copies of `bytes`.
double measure_copy_bandwidth(Backend& backend, uint64_t bytes, int repeats);

// Quantized matrix-multiply rate in FLOP/s through Backend::matmul on the checkpoint's lm_head
// (the largest dense Q4 matrix), for `tokens` activation rows: best of `repeats`.
double measure_matmul_rate(Backend& backend, const Checkpoint& checkpoint, int64_t tokens,
                           int repeats);

}  // namespace lily

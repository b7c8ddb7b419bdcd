// The JSON report of one `lily bench` run (schema lily-bench/1) and its one-line summary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/cuda/cuda_options.h"

#include "bench/bench_runner.h"
#include "bench/decode_traffic.h"
#include "core/strict_json.h"

namespace lily {

struct BenchContext {
  std::string model_dir;
  std::string profile;  // "tiny" or "production"
  uint64_t checkpoint_bytes = 0;
  std::string backend;  // "cpu"
  std::string device;   // Backend::device_name()
  std::string decode_path;  // Qwen36Model::decode_path(): the backend's decode plan, or the ops
  int threads = 0;
  std::string code_path;  // Backend::code_path() ("" for the CPU)
  std::optional<CudaOptions> cuda_options;  // the CUDA backend's (--cuda-disable); none for the CPU
  BenchOptions options;
  double copy_bytes_per_second = 0;    // measured in the same run
  double matmul_flops_per_second = 0;  // measured in the same run (0: not measured)
  uint64_t backend_bytes = 0;  // Backend::allocated_bytes() after the measured pass (its peak)
  KvDtype kv_cache = KvDtype::f32;  // the state's KV cache dtype (--kv-cache)
};

// Every field of docs/bench.md: meta (engine, commit, dirty, build), device, workload,
// results.prefill / results.decode (as Lily's) and bandwidth (bytes per step by component,
// achieved GB/s, measured copy GB/s, ratio, floor tok/s) and prefill compute.
Json bench_report(const BenchContext& context, const BenchMeasurement& m,
                  const Checkpoint& checkpoint);

// "prefill: N tok in Xs (R tok/s) | decode: N steps in Ys (R tok/s) | digest=… | …".
std::string bench_summary_line(const Json& report);

}  // namespace lily

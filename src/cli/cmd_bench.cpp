// `lily bench`: one measured run of the benchmark contract; JSON report to --json-out, summary on stderr.
#include <cstdio>
#include <fstream>

#include "backend/backend.h"
#include "bench/bench_report.h"
#include "bench/bench_runner.h"
#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "cli/backend_choice.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/decode_state.h"
#include "model/qwen36_model.h"

namespace lily {

int cmd_bench(const std::vector<std::string>& argv) {
  const std::vector<OptionSpec> spec = {
      {"model", true, "checkpoint directory (required)"},
      {"prompt-len", true, "synthetic prompt length in tokens (required, > 0)"},
      {"decode-steps", true, "measured decode steps (default 64)"},
      {"sampling", false,
       "the sampling arm: every token sampled (temperature 1, top_p 0.95, top_k 20, seed 0) "
       "instead of the argmax"},
      {"json-out", true, "report file (required)"},
      {"device", true, "auto, cpu or cuda (default auto: CUDA when usable, else the CPU)"},
      {"threads", true, "CPU threads (default: all cores; CPU backend only)"},
      {"kv-cache", true, "KV cache element type, f32, bf16 or int8 (default f32; bf16 halves the KV bytes, int8 a quarter plus a scale per row)"},
      cuda_disable_option(),
      cpu_precision_option(),
      {"copy-probe-mib", true,
       "copy-bandwidth probe buffer in MiB, at least 256 so it exceeds the caches (default 512)"},
  };
  const Args args(argv, spec);
  check_device_option(args);
  check_kv_cache_option(args);
  BenchOptions options;
  options.prompt_len = static_cast<int64_t>(args.uint_or("prompt-len", 0, 1, 262144));
  if (!args.has("prompt-len")) throw InputError("--prompt-len is required");
  options.decode_steps = static_cast<int64_t>(args.uint_or("decode-steps", 64, 1, 262144));
  const uint64_t capacity = static_cast<uint64_t>(options.prompt_len + options.decode_steps + 1);
  if (capacity > 262144) {
    throw InputError("--prompt-len + --decode-steps + 1 = " + std::to_string(capacity) +
                     " exceeds the state limit 262144");
  }
  if (args.has("sampling")) options.sampling = bench_sampling_params();
  const std::string json_out = args.required("json-out");
  const uint64_t probe_mib = args.uint_or("copy-probe-mib", 512, 256, 65536);

  const std::string dir = args.required("model");
  const std::unique_ptr<Checkpoint> checkpoint = open_checkpoint(dir);
  if (capacity > checkpoint->config.shape.max_position_embeddings) {
    throw InputError("--prompt-len + --decode-steps + 1 = " + std::to_string(capacity) +
                     " exceeds the checkpoint's max_position_embeddings");
  }
  // Written to a side file and renamed at the end: a failed run never leaves a report behind.
  const std::string partial = json_out + ".partial";
  std::ofstream out(partial);
  if (!out) throw InputError("--json-out " + json_out + ": cannot create " + partial);
  struct RemoveOnFailure {
    const std::string& path;
    bool keep = false;
    ~RemoveOnFailure() {
      if (!keep) std::remove(path.c_str());
    }
  } cleanup{partial};

  load_weights(*checkpoint);  // outside the measurement, as llama-bench's mmap populate
  BackendChoice choice = choose_backend(args, *checkpoint, capacity, 1);
  const std::unique_ptr<Backend> backend = std::move(choice.backend);
  Qwen36Model model(*checkpoint, *backend, choice.chunk, upload_progress());
  announce_decode_path(model);
  announce_memory(*backend, checkpoint->store.file_bytes());
  DecodeState state(*backend, checkpoint->config.shape, static_cast<int64_t>(capacity),
                    choice.kv_cache);

  BenchContext context;
  context.model_dir = dir;
  context.profile = profile_name(checkpoint->config.profile);
  context.checkpoint_bytes = checkpoint->store.file_bytes();
  context.backend = backend->name();
  context.device = backend->device_name();
  context.decode_path = model.decode_path();
  context.threads = backend->threads();
  context.kv_cache = choice.kv_cache;
  context.code_path = backend->code_path();
  context.cuda_options = choice.cuda_options;
  context.options = options;

  const BenchMeasurement measurement = run_bench(model, state, options);
  context.backend_bytes = backend->allocated_bytes();
  // Probes after the measured pass, so that they cannot disturb it; same process, same device.
  context.copy_bytes_per_second = measure_copy_bandwidth(*backend, probe_mib << 20, 5);
  context.matmul_flops_per_second =
      measure_matmul_rate(*backend, *checkpoint, std::min<int64_t>(options.prompt_len, model.chunk()), 3);

  const Json report = bench_report(context, measurement, *checkpoint);
  out << report.dump(2) << "\n";
  out.close();
  if (!out) throw std::runtime_error("writing " + partial + " failed");
  if (std::rename(partial.c_str(), json_out.c_str()) != 0) {
    throw std::runtime_error("renaming " + partial + " to " + json_out + " failed");
  }
  cleanup.keep = true;
  std::fprintf(stderr, "%s\n", bench_summary_line(report).c_str());
  return 0;
}

}  // namespace lily

// --device and --kv-cache for run, serve and bench: picks the CPU or CUDA backend, the prefill chunk and the KV cache dtype; the start-up lines about the loaded model.
#include "cli/backend_choice.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/load_progress.h"
#include "core/process_memory.h"
#include "model/decode_state.h"

namespace lily {

namespace {
constexpr int64_t kCpuChunk = 256;
constexpr int64_t kCudaChunk = 4096;  // Lily's PREFILL_CHUNK
constexpr uint64_t kCudaHeadroom = 2ull << 30;  // prefill scratch at 4096 tokens + driver slack
// f32 by default: the exact reference path the goldens check. bf16 (half the KV bytes) moves
// the synthetic full checkpoint's logits by 0.15 normalised and measured no faster up to
// 4,096 tokens on the H200 (docs/precision.md, docs/cuda.md), so it is asked for.
constexpr KvDtype kCudaDefaultKv = KvDtype::f32;
// f32 on the CPU too: the exact path the goldens check. bf16 halves the bytes decode reads
// from the cache; its logits move as on CUDA (docs/precision.md, *The bf16 KV cache*).
constexpr KvDtype kCpuDefaultKv = KvDtype::f32;

// --kv-cache as given (validated), or nullopt when absent.
std::optional<KvDtype> kv_cache_option(const Args& args) {
  const std::optional<std::string> text = args.get("kv-cache");
  if (!text) return std::nullopt;
  const std::optional<KvDtype> dtype = parse_kv_dtype(*text);
  if (!dtype) throw InputError(args.source("kv-cache") + " is \"" + *text + "\", expected f32, bf16 or int8");
  return dtype;
}

}  // namespace

void check_kv_cache_option(const Args& args) { (void)kv_cache_option(args); }

LoadProgressFn upload_progress() {
  auto bar = std::make_shared<LoadProgress>(stderr, ::isatty(STDERR_FILENO) != 0, "uploading weights");
  return [bar](uint64_t done, uint64_t total) {
    bar->update(done, total);
    if (done == total) bar->finish();
  };
}

void load_weights(const Checkpoint& checkpoint) {
  LoadProgress progress(stderr, ::isatty(STDERR_FILENO) != 0, "loading weights");
  checkpoint.store.prefetch([&](uint64_t done, uint64_t total) {
    progress.update(done, total);
    return true;
  });
  progress.finish();
}

BackendChoice choose_backend(const Args& args, const Checkpoint& checkpoint, uint64_t max_seq,
                             int states, uint64_t extra_bytes) {
  const std::string device = args.get("device").value_or("auto");
  if (device != "auto" && device != "cpu" && device != "cuda") {
    throw InputError(args.source("device") + " is \"" + device + "\", expected auto, cpu or cuda");
  }
  const uint64_t threads = args.uint_or("threads", 0, 0, 1024);
  const std::optional<KvDtype> kv_asked = kv_cache_option(args);
  const CudaOptions cuda_options = cuda_options_from(args);
  const CpuPrecision cpu_precision = cpu_precision_from(args);
  BackendChoice choice;
  if (device == "cpu") {
    choice.backend = make_cpu_backend(static_cast<int>(threads), cpu_precision);
    choice.chunk = kCpuChunk;
    choice.kv_cache = kv_asked.value_or(kCpuDefaultKv);
    std::fprintf(stderr, "lily: using the CPU (%d threads; %s); KV cache %s\n",
                 choice.backend->threads(), choice.backend->code_path().c_str(),
                 kv_dtype_name(choice.kv_cache));
    return choice;
  }
  const KvDtype cuda_kv = kv_asked.value_or(kCudaDefaultKv);
  const uint64_t required =
      checkpoint.stats.weight_bytes +
      static_cast<uint64_t>(states) *
          DecodeState::bytes(checkpoint.config.shape, static_cast<int64_t>(max_seq), cuda_kv) +
      extra_bytes + kCudaHeadroom;
  if (device == "cuda") {
    if (args.has("threads")) {
      throw InputError(args.source("threads") + " applies to the CPU backend, not --device cuda");
    }
    try {
      choice.backend = make_cuda_backend(required, cuda_options);
      choice.cuda_options = cuda_options;
    } catch (const std::runtime_error& e) {
      // No device, an old GPU or too little memory: the user's choice cannot be served here.
      throw InputError(std::string("--device cuda: ") + e.what());
    }
    choice.chunk = kCudaChunk;
    choice.kv_cache = cuda_kv;
    std::fprintf(stderr, "lily: using CUDA on %s (%s); KV cache %s\n",
                 choice.backend->device_name().c_str(), choice.backend->code_path().c_str(),
                 kv_dtype_name(cuda_kv));
    return choice;
  }
  std::string why;
  if (cuda_available(&why)) {
    try {
      choice.backend = make_cuda_backend(required, cuda_options);
      choice.cuda_options = cuda_options;
      choice.chunk = kCudaChunk;
      choice.kv_cache = cuda_kv;
      // A --cpu-precision has nothing to change on CUDA: said, not silently dropped.
      const std::string unused = args.has("cpu-precision")
                                     ? "; " + args.source("cpu-precision") + " does not apply"
                                     : "";
      std::fprintf(stderr, "lily: --device auto: using CUDA on %s (%s); KV cache %s%s\n",
                   choice.backend->device_name().c_str(), choice.backend->code_path().c_str(),
                   kv_dtype_name(cuda_kv), unused.c_str());
      return choice;
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  choice.backend = make_cpu_backend(static_cast<int>(threads), cpu_precision);
  choice.chunk = kCpuChunk;
  choice.kv_cache = kv_asked.value_or(kCpuDefaultKv);
  // A --cuda-disable list has nothing to switch off on the CPU: said, not silently dropped.
  const std::string unused_options =
      cuda_options.all_on() ? "" : "; " + args.source("cuda-disable") + " does not apply";
  std::fprintf(stderr, "lily: --device auto: using the CPU (%s); KV cache %s%s; %d threads, %s\n",
               why.c_str(), kv_dtype_name(choice.kv_cache), unused_options.c_str(), choice.backend->threads(),
               choice.backend->code_path().c_str());
  return choice;
}

void announce_memory(const Backend& backend, uint64_t checkpoint_bytes) {
  const std::optional<ResidentMemory> rss = resident_memory();
  const std::string held = backend.name() == "cuda" ? "device memory" : "buffers";
  if (!rss) {
    std::fprintf(stderr, "lily: memory: resident size unknown (no /proc/self/statm); %s backend %s %s\n",
                 backend.name().c_str(), held.c_str(), format_gib(backend.allocated_bytes()).c_str());
    return;
  }
  std::fprintf(stderr,
               "lily: memory: %s resident, %s of it file pages (the checkpoint's %.2f GB is used "
               "in place from the page cache); %s backend %s %s\n",
               format_gib(rss->resident_bytes).c_str(), format_gib(rss->file_bytes).c_str(),
               static_cast<double>(checkpoint_bytes) / 1e9, backend.name().c_str(), held.c_str(),
               format_gib(backend.allocated_bytes()).c_str());
}

void announce_decode_path(const Qwen36Model& model) {
  if (model.decode_plan() == nullptr) return;
  std::fprintf(stderr, "lily: decode plan: %s\n", model.decode_path().c_str());
}

}  // namespace lily

// --device for run, serve and bench: picks the CPU or CUDA backend and the prefill chunk.
#include "cli/backend_choice.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/load_progress.h"
#include "model/decode_state.h"

namespace lily {

namespace {
constexpr int64_t kCpuChunk = 256;
constexpr int64_t kCudaChunk = 4096;  // Lily's PREFILL_CHUNK
constexpr uint64_t kCudaHeadroom = 2ull << 30;  // prefill scratch at 4096 tokens + driver slack
}  // namespace

LoadProgressFn upload_progress() {
  auto bar = std::make_shared<LoadProgress>(stderr, ::isatty(STDERR_FILENO) != 0, "uploading weights");
  return [bar](uint64_t done, uint64_t total) {
    bar->update(done, total);
    if (done == total) bar->finish();
  };
}

BackendChoice choose_backend(const Args& args, const Checkpoint& checkpoint, uint64_t max_seq,
                             int states, uint64_t extra_bytes) {
  const std::string device = args.get("device").value_or("auto");
  if (device != "auto" && device != "cpu" && device != "cuda") {
    throw InputError(args.source("device") + " is \"" + device + "\", expected auto, cpu or cuda");
  }
  const uint64_t threads = args.uint_or("threads", 0, 0, 1024);
  BackendChoice choice;
  if (device == "cpu") {
    choice.backend = make_cpu_backend(static_cast<int>(threads));
    choice.chunk = kCpuChunk;
    return choice;
  }
  const uint64_t required = checkpoint.stats.weight_bytes +
                            static_cast<uint64_t>(states) * DecodeState::bytes(checkpoint.config.shape, static_cast<int64_t>(max_seq)) +
                            extra_bytes + kCudaHeadroom;
  if (device == "cuda") {
    if (args.has("threads")) {
      throw InputError(args.source("threads") + " applies to the CPU backend, not --device cuda");
    }
    try {
      choice.backend = make_cuda_backend(required);
    } catch (const std::runtime_error& e) {
      // No device, an old GPU or too little memory: the user's choice cannot be served here.
      throw InputError(std::string("--device cuda: ") + e.what());
    }
    choice.chunk = kCudaChunk;
    std::fprintf(stderr, "lily: using CUDA on %s (%s)\n", choice.backend->device_name().c_str(),
                 choice.backend->code_path().c_str());
    return choice;
  }
  std::string why;
  if (cuda_available(&why)) {
    try {
      choice.backend = make_cuda_backend(required);
      choice.chunk = kCudaChunk;
      std::fprintf(stderr, "lily: --device auto: using CUDA on %s (%s)\n",
                   choice.backend->device_name().c_str(), choice.backend->code_path().c_str());
      return choice;
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  choice.backend = make_cpu_backend(static_cast<int>(threads));
  choice.chunk = kCpuChunk;
  std::fprintf(stderr, "lily: --device auto: using the CPU (%s)\n", why.c_str());
  return choice;
}

void announce_decode_path(const Qwen36Model& model) {
  if (model.decode_plan() == nullptr) return;
  std::fprintf(stderr, "lily: decode plan: %s\n", model.decode_path().c_str());
}

}  // namespace lily

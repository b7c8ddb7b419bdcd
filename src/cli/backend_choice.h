// --device and --kv-cache for run, serve and bench: picks the CPU or CUDA backend, the prefill chunk and the KV cache dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "model/qwen36_model.h"

namespace lily {

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  int64_t chunk = 256;  // prefill tokens per model pass: larger on a GPU (fewer, fuller launches)
  KvDtype kv_cache = KvDtype::f32;  // the element type of every DecodeState's KV caches
  // The CUDA backend's options (--cuda-disable) when CUDA was chosen; empty for the CPU.
  std::optional<CudaOptions> cuda_options;
};

// --kv-cache f32|bf16|int8: the KV cache's element type (docs/precision.md), served by both
// backends. Absent: f32 on every backend. Any other value is refused before anything is
// loaded (InputError). Call it next to check_device_option.
void check_kv_cache_option(const Args& args);

// --device auto (default): CUDA when a usable device (compute capability >= 8.0, enough
// free memory) is present, else the CPU, and says which on stderr. --device cuda: CUDA or a
// clear error. --device cpu: the CPU with --threads. The CUDA backend gets the paths
// --cuda-disable leaves on (cuda_options_from). `states` is how many DecodeStates of
// `max_seq` tokens the command will allocate, `extra_bytes` what else it allocates in backend
// memory (the session cache's snapshots), for the memory check, which sizes the states with
// the KV cache dtype CUDA would use. The KV cache dtype follows --kv-cache or the backend's
// default (f32 on both), on whichever backend is chosen.
BackendChoice choose_backend(const Args& args, const Checkpoint& checkpoint, uint64_t max_seq,
                             int states, uint64_t extra_bytes = 0);

// Prepare-time progress for a device upload: a bar on a terminal, plain lines otherwise.
LoadProgressFn upload_progress();

// Reads every shard once with a "loading weights" progress line (TensorStore::prefetch), as
// serve does at start-up: the page cache holds the checkpoint and this process's page tables
// map all of it, so no measured step pays a first-touch fault (llama.cpp's MAP_POPULATE).
void load_weights(const Checkpoint& checkpoint);

// Prints the decode plan the model runs (CUDA: which fused kernels, or why a part runs the ops)
// to stderr; nothing when the backend has no plan (the CPU).
void announce_decode_path(const Qwen36Model& model);

// Prints to stderr what the loaded model holds: the process's resident host memory, how much
// of it is file pages (the checkpoint used in place from the page cache), and what the backend
// allocated (host buffers on the CPU, device memory on CUDA). Call it once the model is built.
void announce_memory(const Backend& backend, uint64_t checkpoint_bytes);

}  // namespace lily

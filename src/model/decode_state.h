// Per-session model state: KV caches (attention layers), conv windows and recurrent states (GDN).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/model_config.h"

namespace lily {

// Allocated once per session at `capacity` tokens; nothing is allocated while decoding.
// All buffers live in the backend's memory (f32).
struct DecodeState {
  struct AttentionCache {
    float* keys = nullptr;    // [capacity, kv_heads, head_dim]
    float* values = nullptr;  // [capacity, kv_heads, head_dim]
  };
  struct DeltaNetState {
    float* conv_window = nullptr;  // [conv_kernel - 1, channels], oldest input first
    float* recurrent = nullptr;    // [value_heads, key_dim, value_dim]
  };

  int64_t capacity = 0;  // max tokens (prompt + generated) the state can hold
  int64_t position = 0;  // tokens fed so far
  std::vector<LayerKind> kinds;
  std::vector<AttentionCache> attention;  // indexed by layer; empty for GDN layers
  std::vector<DeltaNetState> delta_net;   // indexed by layer; empty for attention layers
  std::vector<size_t> sizes;              // floats per buffer, for reset (same order as below)
  std::vector<float*> buffers;            // every buffer above
  // The position as an i32 in backend memory [1], which graph-captured decode steps read and
  // advance on the device. It is valid only while device_position_value == position: the
  // model re-uploads it whenever the host-side position moved without it (prefill, reset,
  // a session restored from the cache).
  int32_t* device_position = nullptr;
  int64_t device_position_value = -1;

  DecodeState(Backend& backend, const ModelShape& shape, int64_t capacity);
  // Bytes of backend memory a state of `capacity` tokens takes (for memory checks).
  static uint64_t bytes(const ModelShape& shape, int64_t capacity);
  // Back to an empty sequence (zeroes the recurrent parts; KV rows are overwritten anyway).
  void reset(Backend& backend);
};

}  // namespace lily

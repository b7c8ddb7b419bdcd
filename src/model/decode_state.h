// Per-session model state: KV caches (attention layers), conv windows and recurrent states (GDN).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/model_config.h"

namespace lily {

// Allocated once per session at `capacity` tokens; nothing is allocated while decoding.
// All buffers live in the backend's memory. The KV caches' element type is chosen when the
// state is made (--kv-cache: f32, or bf16 on either backend); everything else is f32.
struct DecodeState {
  struct AttentionCache {
    KvCacheView keys;    // [capacity, kv_heads, head_dim] of kv_dtype
    KvCacheView values;  // [capacity, kv_heads, head_dim] of kv_dtype
  };
  struct DeltaNetState {
    float* conv_window = nullptr;  // [conv_kernel - 1, channels] f32, oldest input first
    float* recurrent = nullptr;    // [value_heads, key_dim, value_dim] f32
  };

  int64_t capacity = 0;  // max tokens (prompt + generated) the state can hold
  int64_t position = 0;  // tokens fed so far
  KvDtype kv_dtype = KvDtype::f32;
  size_t kv_elements = 0;  // per K or V cache: capacity * kv_heads * head_dim
  std::vector<LayerKind> kinds;
  std::vector<AttentionCache> attention;  // indexed by layer; empty for GDN layers
  std::vector<DeltaNetState> delta_net;   // indexed by layer; empty for attention layers
  // The f32 buffers (every GDN conv window and recurrent state, layer order) and their float
  // counts, for reset and snapshots; the KV caches are in `attention` (kv_elements each).
  std::vector<size_t> sizes;
  std::vector<float*> buffers;
  // The position as an i32 in backend memory [1], which graph-captured decode steps read and
  // advance on the device. It is valid only while device_position_value == position: the
  // model re-uploads it whenever the host-side position moved without it (prefill, reset,
  // a session restored from the cache).
  int32_t* device_position = nullptr;
  int64_t device_position_value = -1;

  // kv_dtype must be one the backend serves (Backend::serves_kv_cache; std::invalid_argument
  // otherwise). f32, the default, is the exact reference path every backend serves.
  DecodeState(Backend& backend, const ModelShape& shape, int64_t capacity,
              KvDtype kv_dtype = KvDtype::f32);
  // Bytes of backend memory a state of `capacity` tokens takes (for memory checks).
  static uint64_t bytes(const ModelShape& shape, int64_t capacity, KvDtype kv_dtype);
  // Bytes of one token's K and V over every attention layer, in kv_dtype (production shape:
  // 10 layers x 2 x 2 heads x 256 dims = 10,240 values: 40 KiB f32, 20 KiB bf16).
  static uint64_t kv_bytes_per_token(const ModelShape& shape, KvDtype kv_dtype);
  // Back to an empty sequence (zeroes every buffer; KV rows would be overwritten anyway).
  void reset(Backend& backend);
};

}  // namespace lily

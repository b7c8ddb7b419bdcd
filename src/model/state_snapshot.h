// StateSnapshot: a DecodeState's GDN conv windows and recurrent states at one position.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/model_config.h"
#include "model/decode_state.h"

namespace lily {

// What a DecodeState cannot recompute from its KV caches: every Gated DeltaNet layer's conv
// window and recurrent state, which hold only the latest position. The attention KV caches
// are append-only per position (rows < p are never rewritten by tokens fed at >= p), so a
// state whose token history up to p is unchanged still holds valid KV rows < p; restoring
// the snapshot into that same state gives exactly the state at p, even after it moved on.
// This holds for either KV cache dtype (--kv-cache): rows are rounded once, when written, and
// never touched again, so a snapshot never copies KV rows and its size does not depend on it.
//
// Buffers, allocated once at construction in backend memory (f32), per GDN layer in layer
// order (30 of the 40 layers for the full model, i % 4 != 3):
//   conv window [conv_kernel - 1, conv_channels]           (oldest input first, as in the state)
//   recurrent   [value_heads, key_dim, value_dim]
// bytes() = 4 x GDN layers x ((K-1) C + Hv Dk Dv): 30 x (3 x 8192 + 32 x 128 x 128) floats =
// 65,863,680 bytes (62.8 MiB) for the full model.
class StateSnapshot {
 public:
  StateSnapshot(Backend& backend, const ModelShape& shape);
  StateSnapshot(const StateSnapshot&) = delete;
  StateSnapshot& operator=(const StateSnapshot&) = delete;

  // Backend bytes one snapshot of `shape` takes (for memory checks and the start-up line).
  static uint64_t bytes(const ModelShape& shape);

  // Copies the state's recurrent part (device-to-device, an op in stream order: later ops
  // on the state cannot overtake it) and records state.position and which state it was.
  // Throws std::invalid_argument if the state's layout differs from the snapshot's shape.
  void capture(Backend& backend, const DecodeState& state);
  // Copies the recurrent part back into `state` and sets state.position = position(); the
  // device position is marked stale so the next decode step re-uploads it. Only the state the
  // snapshot was captured from is accepted (std::logic_error otherwise, and when nothing was
  // captured): another state's KV rows are not this history's. The caller guarantees that
  // the state's token history up to position() is unchanged since capture.
  void restore(Backend& backend, DecodeState& state) const;

  bool captured() const { return source_ != nullptr; }
  int64_t position() const { return position_; }  // -1 before the first capture

 private:
  struct Layer {
    size_t layer = 0;  // index into DecodeState::delta_net
    float* conv_window = nullptr;
    float* recurrent = nullptr;
  };
  void check_layout(const DecodeState& state, const char* what) const;

  size_t window_floats_ = 0;
  size_t recurrent_floats_ = 0;
  std::vector<Layer> layers_;
  const DecodeState* source_ = nullptr;
  int64_t position_ = -1;
};

}  // namespace lily

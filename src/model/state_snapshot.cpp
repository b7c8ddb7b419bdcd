// StateSnapshot: a DecodeState's GDN conv windows and recurrent states at one position.
#include "model/state_snapshot.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace lily {

namespace {

size_t window_floats(const ModelShape& shape) {
  return static_cast<size_t>((shape.linear_conv_kernel_dim - 1) * shape.gdn_conv_channels());
}
size_t recurrent_floats(const ModelShape& shape) {
  return static_cast<size_t>(shape.linear_num_value_heads * shape.linear_key_head_dim *
                             shape.linear_value_head_dim);
}
size_t delta_net_layers(const ModelShape& shape) {
  size_t count = 0;
  for (uint64_t i = 0; i < shape.num_layers; ++i) {
    if (ModelShape::layer_kind(i) == LayerKind::linear_attention) ++count;
  }
  return count;
}

// Floats of the state buffer `buffer` (DecodeState::sizes), or 0 if it is not one of them.
size_t buffer_floats(const DecodeState& state, const float* buffer) {
  const auto it = std::find(state.buffers.begin(), state.buffers.end(), buffer);
  if (it == state.buffers.end() || buffer == nullptr) return 0;
  return state.sizes[static_cast<size_t>(it - state.buffers.begin())];
}

}  // namespace

uint64_t StateSnapshot::bytes(const ModelShape& shape) {
  return static_cast<uint64_t>(delta_net_layers(shape)) *
         (window_floats(shape) + recurrent_floats(shape)) * sizeof(float);
}

StateSnapshot::StateSnapshot(Backend& backend, const ModelShape& shape)
    : window_floats_(window_floats(shape)), recurrent_floats_(recurrent_floats(shape)) {
  for (uint64_t i = 0; i < shape.num_layers; ++i) {
    if (ModelShape::layer_kind(i) != LayerKind::linear_attention) continue;
    Layer layer;
    layer.layer = static_cast<size_t>(i);
    layer.conv_window = backend.alloc(window_floats_);
    layer.recurrent = backend.alloc(recurrent_floats_);
    layers_.push_back(layer);
  }
}

void StateSnapshot::check_layout(const DecodeState& state, const char* what) const {
  for (const Layer& layer : layers_) {
    const bool fits =
        layer.layer < state.delta_net.size() && layer.layer < state.kinds.size() &&
        state.kinds[layer.layer] == LayerKind::linear_attention &&
        buffer_floats(state, state.delta_net[layer.layer].conv_window) == window_floats_ &&
        buffer_floats(state, state.delta_net[layer.layer].recurrent) == recurrent_floats_;
    if (!fits) {
      throw std::invalid_argument(
          std::string(what) + ": the state's Gated DeltaNet layer " + std::to_string(layer.layer) +
          " does not match the snapshot's shape (expected a conv window of " +
          std::to_string(window_floats_) + " and a recurrent state of " +
          std::to_string(recurrent_floats_) + " floats)");
    }
  }
}

void StateSnapshot::capture(Backend& backend, const DecodeState& state) {
  check_layout(state, "StateSnapshot::capture");
  for (const Layer& layer : layers_) {
    const DecodeState::DeltaNetState& s = state.delta_net[layer.layer];
    backend.copy(s.conv_window, window_floats_, layer.conv_window);
    backend.copy(s.recurrent, recurrent_floats_, layer.recurrent);
  }
  source_ = &state;
  position_ = state.position;
}

void StateSnapshot::restore(Backend& backend, DecodeState& state) const {
  if (source_ == nullptr) throw std::logic_error("StateSnapshot::restore: nothing was captured");
  if (source_ != &state) {
    throw std::logic_error(
        "StateSnapshot::restore: the snapshot was captured from another state (its KV rows "
        "would not match)");
  }
  check_layout(state, "StateSnapshot::restore");
  for (const Layer& layer : layers_) {
    const DecodeState::DeltaNetState& s = state.delta_net[layer.layer];
    backend.copy(layer.conv_window, window_floats_, s.conv_window);
    backend.copy(layer.recurrent, recurrent_floats_, s.recurrent);
  }
  state.position = position_;
  state.device_position_value = -1;  // the device copy still holds the old position
}

}  // namespace lily

// Per-session model state: KV caches (attention layers), conv windows and recurrent states (GDN).
#include "model/decode_state.h"

#include <stdexcept>

namespace lily {

namespace {
// Floats per buffer: one KV cache (keys or values), the conv window, the recurrent state.
struct BufferSizes {
  size_t kv;
  size_t window;
  size_t recurrent;
};
BufferSizes buffer_sizes(const ModelShape& shape, int64_t capacity) {
  return {static_cast<size_t>(capacity) * shape.num_key_value_heads * shape.head_dim,
          (shape.linear_conv_kernel_dim - 1) * shape.gdn_conv_channels(),
          shape.linear_num_value_heads * shape.linear_key_head_dim * shape.linear_value_head_dim};
}
}  // namespace

uint64_t DecodeState::bytes(const ModelShape& shape, int64_t capacity) {
  const BufferSizes sizes = buffer_sizes(shape, capacity);
  uint64_t floats = 0;
  for (size_t i = 0; i < static_cast<size_t>(shape.num_layers); ++i) {
    floats += ModelShape::layer_kind(i) == LayerKind::full_attention ? 2 * sizes.kv
                                                                     : sizes.window + sizes.recurrent;
  }
  return floats * sizeof(float) + sizeof(int32_t);  // + the device position
}

DecodeState::DecodeState(Backend& backend, const ModelShape& shape, int64_t cap) : capacity(cap) {
  if (cap <= 0) throw std::invalid_argument("DecodeState: capacity must be positive");
  const auto layers = static_cast<size_t>(shape.num_layers);
  attention.resize(layers);
  delta_net.resize(layers);
  auto take = [&](size_t count) {
    float* buffer = backend.alloc(count);
    buffers.push_back(buffer);
    sizes.push_back(count);
    return buffer;
  };
  const BufferSizes size = buffer_sizes(shape, cap);
  device_position = backend.alloc_i32(1);
  for (size_t i = 0; i < layers; ++i) {
    kinds.push_back(ModelShape::layer_kind(i));
    if (kinds.back() == LayerKind::full_attention) {
      attention[i] = {take(size.kv), take(size.kv)};
    } else {
      delta_net[i] = {take(size.window), take(size.recurrent)};
    }
  }
}

void DecodeState::reset(Backend& backend) {
  for (size_t i = 0; i < buffers.size(); ++i) backend.zero(buffers[i], sizes[i]);
  position = 0;
  device_position_value = -1;
}

}  // namespace lily

// Per-session model state: KV caches (attention layers), conv windows and recurrent states (GDN).
#include "model/decode_state.h"

#include <stdexcept>

namespace lily {

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
  const size_t kv = static_cast<size_t>(cap) * shape.num_key_value_heads * shape.head_dim;
  const size_t channels = shape.gdn_conv_channels();
  const size_t window = (shape.linear_conv_kernel_dim - 1) * channels;
  const size_t recurrent =
      shape.linear_num_value_heads * shape.linear_key_head_dim * shape.linear_value_head_dim;
  device_position = backend.alloc_i32(1);
  for (size_t i = 0; i < layers; ++i) {
    kinds.push_back(ModelShape::layer_kind(i));
    if (kinds.back() == LayerKind::full_attention) {
      attention[i] = {take(kv), take(kv)};
    } else {
      delta_net[i] = {take(window), take(recurrent)};
    }
  }
}

void DecodeState::reset(Backend& backend) {
  for (size_t i = 0; i < buffers.size(); ++i) backend.zero(buffers[i], sizes[i]);
  position = 0;
  device_position_value = -1;
}

}  // namespace lily

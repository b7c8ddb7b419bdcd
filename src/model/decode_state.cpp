// Per-session model state: KV caches (attention layers), conv windows and recurrent states (GDN).
#include "model/decode_state.h"

#include <stdexcept>
#include <string>

namespace lily {

namespace {
// Elements per buffer: one KV cache (keys or values), the conv window, the recurrent state.
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
uint64_t attention_layers(const ModelShape& shape) {
  uint64_t count = 0;
  for (uint64_t i = 0; i < shape.num_layers; ++i) {
    if (ModelShape::layer_kind(i) == LayerKind::full_attention) ++count;
  }
  return count;
}
}  // namespace

uint64_t DecodeState::kv_bytes_per_token(const ModelShape& shape, KvDtype kv_dtype) {
  return attention_layers(shape) * 2 *
         kv_cache_bytes(kv_dtype, shape.num_key_value_heads * shape.head_dim, static_cast<int64_t>(shape.head_dim));
}

uint64_t DecodeState::bytes(const ModelShape& shape, int64_t capacity, KvDtype kv_dtype) {
  const BufferSizes sizes = buffer_sizes(shape, capacity);
  const uint64_t attention = attention_layers(shape);
  const uint64_t kv = attention * 2 * kv_cache_bytes(kv_dtype, sizes.kv, static_cast<int64_t>(shape.head_dim));
  const uint64_t gdn = (shape.num_layers - attention) * (sizes.window + sizes.recurrent) * sizeof(float);
  return kv + gdn + sizeof(int32_t);  // + the device position
}

DecodeState::DecodeState(Backend& backend, const ModelShape& shape, int64_t cap, KvDtype kv)
    : capacity(cap), kv_dtype(kv) {
  if (cap <= 0) throw std::invalid_argument("DecodeState: capacity must be positive");
  if (!backend.serves_kv_cache(kv)) {
    throw std::invalid_argument(std::string("DecodeState: the ") + backend.name() +
                                " backend does not serve a " + kv_dtype_name(kv) +
                                " KV cache (f32 is served by every backend)");
  }
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
  kv_elements = size.kv;
  device_position = backend.alloc_i32(1);
  for (size_t i = 0; i < layers; ++i) {
    kinds.push_back(ModelShape::layer_kind(i));
    if (kinds.back() == LayerKind::full_attention) {
      const auto head_dim = static_cast<int64_t>(shape.head_dim);
      attention[i] = {backend.alloc_kv_cache(size.kv, kv, head_dim), backend.alloc_kv_cache(size.kv, kv, head_dim)};
    } else {
      delta_net[i] = {take(size.window), take(size.recurrent)};
    }
  }
}

void DecodeState::reset(Backend& backend) {
  for (size_t i = 0; i < buffers.size(); ++i) backend.zero(buffers[i], sizes[i]);
  for (size_t i = 0; i < attention.size(); ++i) {
    if (kinds[i] != LayerKind::full_attention) continue;
    backend.zero_kv_cache(attention[i].keys, kv_elements);
    backend.zero_kv_cache(attention[i].values, kv_elements);
  }
  position = 0;
  device_position_value = -1;
}

}  // namespace lily

// Decode-step byte accounting and per-token FLOPs, from the checkpoint's own tensor inventory.
#include "bench/decode_traffic.h"

#include <string_view>

#include "model/decode_state.h"

namespace lily {

namespace {

constexpr uint64_t kStateBytes = sizeof(float);  // the Gated DeltaNet buffers are f32

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

bool is_language_tensor(std::string_view name) {
  return name.rfind("language_model.", 0) == 0;
}

uint64_t attention_layers(const ModelShape& shape) {
  uint64_t count = 0;
  for (uint64_t l = 0; l < shape.num_layers; ++l) {
    if (ModelShape::layer_kind(l) == LayerKind::full_attention) ++count;
  }
  return count;
}

}  // namespace

DecodeTraffic decode_traffic(const Checkpoint& checkpoint, int64_t position, KvDtype kv_dtype) {
  const ModelShape& shape = checkpoint.config.shape;
  DecodeTraffic traffic;
  for (const TensorEntry& tensor : checkpoint.store.tensors()) {
    const std::string_view name = tensor.name;
    if (!is_language_tensor(name)) continue;
    if (contains(name, "embed_tokens")) {
      traffic.embedding_row_bytes += tensor.nbytes / shape.vocab_size;
    } else if (contains(name, ".switch_mlp.")) {
      traffic.routed_expert_bytes += tensor.nbytes / shape.num_experts * shape.num_experts_per_tok;
    } else if (contains(name, ".shared_expert.")) {
      traffic.shared_expert_bytes += tensor.nbytes;
    } else {
      traffic.dense_weight_bytes += tensor.nbytes;
    }
  }
  const uint64_t per_token_kv = DecodeState::kv_bytes_per_token(shape, kv_dtype);
  traffic.kv_read_bytes = per_token_kv * static_cast<uint64_t>(position);
  traffic.kv_write_bytes = per_token_kv;
  const uint64_t gdn_layers = shape.num_layers - attention_layers(shape);
  const uint64_t recurrent =
      shape.linear_num_value_heads * shape.linear_key_head_dim * shape.linear_value_head_dim;
  const uint64_t window = (shape.linear_conv_kernel_dim - 1) * shape.gdn_conv_channels();
  traffic.delta_net_state_bytes = gdn_layers * 2 * (recurrent + window) * kStateBytes;
  return traffic;
}

namespace {

// MACs per token of every quantized projection (routed experts top_k times) and of the
// delta rule; everything that does not depend on the position.
double fixed_macs_per_token(const Checkpoint& checkpoint) {
  const ModelShape& shape = checkpoint.config.shape;
  double macs = 0;
  for (const TensorEntry& tensor : checkpoint.store.tensors()) {
    const std::string_view name = tensor.name;
    // Every quantized matrix has a `.scales` tensor with one value per group of 64 weights.
    if (!is_language_tensor(name) || !name.ends_with(".scales") || contains(name, "embed_tokens")) {
      continue;
    }
    double weights = static_cast<double>(kQuantGroupSize);
    for (uint64_t d : tensor.shape) weights *= static_cast<double>(d);
    if (contains(name, ".switch_mlp.")) {
      weights *= static_cast<double>(shape.num_experts_per_tok) / static_cast<double>(shape.num_experts);
    }
    macs += weights;
  }
  const double gdn_layers = static_cast<double>(shape.num_layers - attention_layers(shape));
  // Per value head: decay, S^T k, the rank-1 update and S^T q: about 4 MACs per state entry.
  macs += gdn_layers * 4.0 * static_cast<double>(shape.linear_num_value_heads) *
          static_cast<double>(shape.linear_key_head_dim * shape.linear_value_head_dim);
  return macs;
}

// MACs per attended key, summed over the attention layers (QK^T and PV).
double macs_per_key(const ModelShape& shape) {
  return 2.0 * static_cast<double>(shape.num_attention_heads) * static_cast<double>(shape.head_dim) *
         static_cast<double>(attention_layers(shape));
}

}  // namespace

double token_flops(const Checkpoint& checkpoint, int64_t position) {
  const double keys = static_cast<double>(position + 1);
  return 2.0 * (fixed_macs_per_token(checkpoint) + macs_per_key(checkpoint.config.shape) * keys);
}

double prefill_flops(const Checkpoint& checkpoint, int64_t length) {
  // Token p attends over p + 1 keys: sum over p < length is length (length + 1) / 2.
  const auto n = static_cast<double>(length);
  return 2.0 * (fixed_macs_per_token(checkpoint) * n +
                macs_per_key(checkpoint.config.shape) * n * (n + 1.0) / 2.0);
}

}  // namespace lily

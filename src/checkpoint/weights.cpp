// Load-time view of every model weight: validated views into the mapped shards.
#include "checkpoint/weights.h"

#include <string_view>
#include <unordered_set>

#include "checkpoint/tensor_plan.h"
#include "core/error.h"

namespace lily {

namespace {


class Binder {
 public:
  Binder(const TensorStore& store, WeightStats* stats) : store_(store), stats_(stats) {}

  const std::string& shard_of(const TensorEntry& entry) const {
    return store_.shard_files().at(entry.shard);
  }

  const TensorEntry& take(const std::string& name) {
    const TensorEntry* entry = store_.find(name);
    if (entry == nullptr) throw InputError("tensor " + name + " is missing from the checkpoint");
    consumed_.insert(name);
    stats_->stored_tensors += 1;
    stats_->weight_bytes += entry->nbytes;
    return *entry;
  }

  QuantView quant(const PlannedTensor& t) {
    const TensorEntry& codes = take(t.base + ".weight");
    const TensorEntry& scales = take(t.base + ".scales");
    const TensorEntry& biases = take(t.base + ".biases");
    if (codes.dtype != DType::U32) {
      throw InputError("tensor " + codes.name + " is " + std::string(dtype_name(codes.dtype)) +
                       ", expected U32 packed codes of an MLX quantized projection");
    }
    // Leading dims must match; the last dim tells the bit width.
    const std::vector<uint64_t> expected = t.codes_shape();
    const bool leading_ok = codes.shape.size() == expected.size() &&
                            std::equal(expected.begin(), expected.end() - 1, codes.shape.begin());
    if (!leading_ok || codes.shape.back() == 0) {
      throw InputError("tensor " + codes.name + " has shape " + shape_string(codes.shape) +
                       ", expected " + shape_string(expected));
    }
    const uint64_t packed = codes.shape.back();
    const uint64_t bit_total = packed * 32;
    if (bit_total % t.in != 0 || (bit_total / t.in != 4 && bit_total / t.in != 8)) {
      throw InputError("tensor " + codes.name + " has shape " + shape_string(codes.shape) +
                       ": cannot infer a 4- or 8-bit width for " + std::to_string(t.in) +
                       " input features (expected " + shape_string(expected) + ")");
    }
    const int bits = static_cast<int>(bit_total / t.in);
    if (bits != t.bits) {
      throw InputError("tensor " + codes.name + " in " + shard_of(codes) + " has shape " +
                       shape_string(codes.shape) + ", i.e. " + std::to_string(bits) +
                       "-bit storage; expected " + std::to_string(t.bits) + "-bit codes of shape " +
                       shape_string(expected) + " for this Qwen3.6-35B-A3B projection");
    }
    for (const TensorEntry* group : {&scales, &biases}) {
      if (group->dtype != DType::BF16) {
        throw InputError("tensor " + group->name + " is " +
                         std::string(dtype_name(group->dtype)) + ", expected BF16");
      }
      if (group->shape != t.groups_shape()) {
        throw InputError("tensor " + group->name + " has shape " + shape_string(group->shape) +
                         ", expected " + shape_string(t.groups_shape()) + " (one per 64 inputs)");
      }
    }
    (bits == 4 ? stats_->q4_projections : stats_->q8_projections) += 1;
    QuantView view;
    view.name = t.base;
    view.bits = bits;
    view.experts = t.experts > 0 ? t.experts : 1;
    view.out = t.out;
    view.in = t.in;
    view.codes = store_.bytes(codes).data();
    view.scales = store_.bytes(scales).data();
    view.biases = store_.bytes(biases).data();
    return view;
  }

  DenseView dense(const PlannedTensor& t) {
    const TensorEntry& entry = take(t.base);
    bool dtype_ok = false;
    std::string dtypes;
    for (DType d : t.dtypes) {
      dtype_ok = dtype_ok || entry.dtype == d;
      dtypes += (dtypes.empty() ? "" : " or ") + std::string(dtype_name(d));
    }
    if (!dtype_ok) {
      throw InputError("tensor " + entry.name + " is " + std::string(dtype_name(entry.dtype)) +
                       ", expected " + dtypes);
    }
    bool shape_ok = false;
    std::string shapes;
    for (const auto& shape : t.shapes) {
      shape_ok = shape_ok || entry.shape == shape;
      shapes += (shapes.empty() ? "" : " or ") + shape_string(shape);
    }
    if (!shape_ok) {
      throw InputError("tensor " + entry.name + " has shape " + shape_string(entry.shape) +
                       ", expected " + shapes);
    }
    stats_->dense_tensors += 1;
    DenseView view;
    view.name = entry.name;
    view.dtype = entry.dtype;
    view.shape = entry.shape;
    view.data = store_.bytes(entry).data();
    view.nbytes = entry.nbytes;
    return view;
  }

  // Everything neither consumed nor skipped is an error: a name-scheme drift must not
  // leave weights silently unused.
  void check_all_consumed() {
    std::vector<std::string> leftover;
    for (const TensorEntry& entry : store_.tensors()) {
      if (consumed_.count(entry.name) != 0) continue;
      if (std::string_view(entry.name).rfind(kSkippedPrefix, 0) == 0) {
        stats_->skipped_tensors += 1;
        continue;
      }
      leftover.push_back(entry.name);
    }
    if (leftover.empty()) return;
    std::string names;
    const size_t shown = std::min<size_t>(leftover.size(), 16);
    for (size_t i = 0; i < shown; ++i) {
      names += (i > 0 ? ", " : "") + leftover[i] + " (in " + shard_of(*store_.find(leftover[i])) + ")";
    }
    if (leftover.size() > shown) {
      names += ", ... and " + std::to_string(leftover.size() - shown) + " more";
    }
    throw InputError(std::to_string(leftover.size()) +
                     " checkpoint tensor(s) are not part of Qwen3.6-35B-A3B's language model " +
                     "(only vision_tower.* may be skipped): " + names);
  }

 private:
  const TensorStore& store_;
  WeightStats* stats_;
  std::unordered_set<std::string> consumed_;
};

}  // namespace

ModelWeights bind_weights(const TensorStore& store, const ModelShape& shape, WeightStats* stats) {
  WeightStats local;
  WeightStats* s = stats != nullptr ? stats : &local;
  *s = WeightStats{};
  Binder binder(store, s);
  ModelWeights weights;
  weights.layers.resize(shape.num_layers);
  for (uint64_t i = 0; i < shape.num_layers; ++i) weights.layers[i].kind = ModelShape::layer_kind(i);

  for (const PlannedTensor& t : plan_tensors(shape)) {
    LayerWeights* layer = t.layer >= 0 ? &weights.layers[static_cast<size_t>(t.layer)] : nullptr;
    switch (t.role) {
      case TensorRole::embed: weights.embed = binder.quant(t); break;
      case TensorRole::lm_head: weights.lm_head = binder.quant(t); break;
      case TensorRole::final_norm: weights.final_norm = binder.dense(t); break;
      case TensorRole::input_norm: layer->input_norm = binder.dense(t); break;
      case TensorRole::post_attention_norm: layer->post_attention_norm = binder.dense(t); break;
      case TensorRole::router: layer->moe.router = binder.quant(t); break;
      case TensorRole::experts_gate: layer->moe.experts_gate = binder.quant(t); break;
      case TensorRole::experts_up: layer->moe.experts_up = binder.quant(t); break;
      case TensorRole::experts_down: layer->moe.experts_down = binder.quant(t); break;
      case TensorRole::shared_gate: layer->moe.shared_gate = binder.quant(t); break;
      case TensorRole::shared_up: layer->moe.shared_up = binder.quant(t); break;
      case TensorRole::shared_down: layer->moe.shared_down = binder.quant(t); break;
      case TensorRole::shared_expert_gate: layer->moe.shared_expert_gate = binder.quant(t); break;
      case TensorRole::gdn_in_qkv: layer->gdn.in_proj_qkv = binder.quant(t); break;
      case TensorRole::gdn_in_z: layer->gdn.in_proj_z = binder.quant(t); break;
      case TensorRole::gdn_in_a: layer->gdn.in_proj_a = binder.quant(t); break;
      case TensorRole::gdn_in_b: layer->gdn.in_proj_b = binder.quant(t); break;
      case TensorRole::gdn_conv1d: layer->gdn.conv1d = binder.dense(t); break;
      case TensorRole::gdn_a_log: layer->gdn.a_log = binder.dense(t); break;
      case TensorRole::gdn_dt_bias: layer->gdn.dt_bias = binder.dense(t); break;
      case TensorRole::gdn_norm: layer->gdn.norm = binder.dense(t); break;
      case TensorRole::gdn_out: layer->gdn.out_proj = binder.quant(t); break;
      case TensorRole::attn_q: layer->attn.q_proj = binder.quant(t); break;
      case TensorRole::attn_k: layer->attn.k_proj = binder.quant(t); break;
      case TensorRole::attn_v: layer->attn.v_proj = binder.quant(t); break;
      case TensorRole::attn_o: layer->attn.o_proj = binder.quant(t); break;
      case TensorRole::attn_q_norm: layer->attn.q_norm = binder.dense(t); break;
      case TensorRole::attn_k_norm: layer->attn.k_norm = binder.dense(t); break;
    }
  }
  binder.check_all_consumed();
  return weights;
}

}  // namespace lily

// The CUDA decode plan: resolves each layer's MoE weights once and launches the fused kernels.
#include "backend/cuda/cuda_decode_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace lily {

namespace {

// The next mixer's input projections, in the order the model passes them (Qwen36Model::
// mixer_projections); empty when the layer has no such weights (a test's MoE-only model).
std::vector<const QuantView*> mixer_inputs(const LayerWeights& layer) {
  std::vector<const QuantView*> views;
  if (layer.kind == LayerKind::linear_attention) {
    views = {&layer.gdn.in_proj_qkv, &layer.gdn.in_proj_z, &layer.gdn.in_proj_a, &layer.gdn.in_proj_b};
  } else {
    views = {&layer.attn.q_proj, &layer.attn.k_proj, &layer.attn.v_proj};
  }
  for (const QuantView* v : views) {
    if (v->codes == nullptr || v->rows() == 0) return {};
  }
  if (layer.input_norm.data == nullptr) return {};
  return views;
}

}  // namespace

CudaDecodePlan::CudaDecodePlan(CudaBackend& backend, const ModelWeights& weights,
                               const DecodePlanShape& shape)
    : backend_(backend), stream_(backend.launch_) {
  const size_t L = weights.layers.size();
  moe_layers_.reserve(L);
  std::string unsupported;
  for (const LayerWeights& layer : weights.layers) {
    const MoeWeights& w = layer.moe;
    cuda::MoeLayerParams p;
    p.hidden = shape.hidden;
    p.experts = shape.experts;
    p.k = shape.experts_per_token;
    p.eps = shape.eps;
    p.norm_gain = backend.dense(layer.post_attention_norm);
    p.router = backend.quant(w.router);
    p.shared_expert_gate = backend.quant(w.shared_expert_gate);
    p.gate = backend.quant(w.experts_gate);
    p.up = backend.quant(w.experts_up);
    p.down = backend.quant(w.experts_down);
    p.shared_gate = backend.quant(w.shared_gate);
    p.shared_up = backend.quant(w.shared_up);
    p.shared_down = backend.quant(w.shared_down);
    if (unsupported.empty()) unsupported = cuda::moe_layer_unsupported(p);
    moe_layers_.push_back(p);
  }
  // On by default (docs/cuda.md, "The decode plan"); --cuda-disable moe-layer runs the op
  // path's four launches instead, for comparison.
  if (!backend.options().moe_layer) unsupported = "turned off (--cuda-disable moe-layer)";

  // The next layer's input projection at the end of each block but the last.
  next_.assign(L, cuda::NextProjectionParams{});
  next_views_.assign(L, {});
  next_norms_.assign(L, nullptr);
  std::string next_unsupported;
  if (!backend.options().next_projection) next_unsupported = "experimental, off (CudaOptions::next_projection)";
  int64_t next_rows = 0;
  for (size_t i = 0; unsupported.empty() && next_unsupported.empty() && i + 1 < L; ++i) {
    const LayerWeights& next_layer = weights.layers[i + 1];
    const std::vector<const QuantView*> views = mixer_inputs(next_layer);
    if (views.empty()) {
      next_unsupported = "layer " + std::to_string(i + 1) + " has no input projection weights";
      break;
    }
    cuda::NextProjectionParams n;
    n.count = static_cast<int>(views.size());
    for (size_t t = 0; t < views.size(); ++t) {
      const cuda::QuantMatrix& m = backend.quant(*views[t]);
      n.target[t] = cuda::GemvTarget{m, 0, m.rows(), nullptr};
      n.rows += m.rows();
      next_views_[i][t] = views[t];
    }
    n.norm_gain = backend.dense(next_layer.input_norm);
    next_unsupported = cuda::moe_layer_next_unsupported(moe_layers_[i], n);
    next_[i] = n;
    next_norms_[i] = &next_layer.input_norm;
    next_rows = std::max(next_rows, n.rows);
  }
  if (unsupported.empty() && !moe_layers_.empty()) {
    if (next_unsupported.empty() && next_rows > 0) {
      launch_ = cuda::moe_layer_launch(moe_layers_.front(), next_rows);
      if (launch_.grid == 0) next_unsupported = "its rows do not fit in shared memory beside the block's";
    } else if (next_unsupported.empty()) {
      next_unsupported = "no layer has a next one";
    }
    if (!next_unsupported.empty()) launch_ = cuda::moe_layer_launch(moe_layers_.front(), 0);
    if (launch_.grid == 0) unsupported = "its blocks do not fit on the GPU at once";
  }
  if (!next_unsupported.empty()) next_.assign(L, cuda::NextProjectionParams{});
  if (unsupported.empty()) {
    moe_barrier_ = static_cast<unsigned long long*>(backend.device_alloc(sizeof(unsigned long long)));
    description_ = "MoE block as one persistent kernel per layer (" + std::to_string(launch_.grid) +
                   " co-resident blocks, " + std::to_string(launch_.shared_bytes / 1024) +
                   " KB of shared memory each); the next layer's norm and input projection " +
                   (next_unsupported.empty()
                        ? "in the same kernel (" + std::to_string(launch_.next_rows_per_block) +
                              " rows a block)"
                        : "on the op path: " + next_unsupported);
  } else {
    launch_ = {};
    description_ = "MoE block on the op path: " + unsupported;
  }
}

bool CudaDecodePlan::fuses_next_projection(size_t layer) const {
  return launch_.grid > 0 && layer < next_.size() && next_[layer].count > 0;
}

void CudaDecodePlan::moe_block(size_t layer, const MoeBlockBuffers& b, const NextProjection* next) {
  if (launch_.grid == 0) throw std::logic_error("CudaDecodePlan::moe_block: " + description_);
  if (layer >= moe_layers_.size()) {
    throw std::invalid_argument("CudaDecodePlan::moe_block: layer " + std::to_string(layer) +
                                " of " + std::to_string(moe_layers_.size()));
  }
  if (b.residual == nullptr || b.delta == nullptr || b.normed == nullptr ||
      b.router_logits == nullptr || b.shared_logit == nullptr || b.expert_ids == nullptr ||
      b.expert_weights == nullptr || b.expert_h == nullptr || b.shared_h == nullptr) {
    throw std::invalid_argument("CudaDecodePlan::moe_block: a buffer is null");
  }
  cuda::MoeLayerParams p = moe_layers_[layer];
  p.residual = b.residual;
  p.delta = b.delta;
  p.normed = b.normed;
  p.router_logits = b.router_logits;
  p.shared_logit = b.shared_logit;
  p.ids = b.expert_ids;
  p.weights = b.expert_weights;
  p.h = b.expert_h;
  p.shared_h = b.shared_h;
  p.out = b.delta;
  p.barrier = moe_barrier_;
  if (next != nullptr) {
    // (The message is built only on failure: this runs at every eager or recorded step.)
    const auto where = [&] {
      return "CudaDecodePlan::moe_block: layer " + std::to_string(layer) + "'s next projection";
    };
    if (!fuses_next_projection(layer)) throw std::logic_error(where() + ": not in this plan (" + description_ + ")");
    const cuda::NextProjectionParams& planned = next_[layer];
    if (next->count != static_cast<size_t>(planned.count) || next->norm != next_norms_[layer]) {
      throw std::invalid_argument(where() + ": expected the " + std::to_string(planned.count) +
                                  " input projections and the input norm of layer " +
                                  std::to_string(layer + 1));
    }
    p.next = planned;
    for (int t = 0; t < planned.count; ++t) {
      const MatmulTarget& target = next->targets[t];
      if (target.w != next_views_[layer][static_cast<size_t>(t)] || target.row_begin != 0 ||
          target.rows != planned.target[t].rows || target.y == nullptr) {
        throw std::invalid_argument(where() + ": target " + std::to_string(t) +
                                    " is not the whole matrix the plan resolved, or has no output");
      }
      p.next.target[t].y = target.y;
    }
    p.next.rows_per_block = launch_.next_rows_per_block;
  }
  cuda::moe_layer(p, launch_, stream_);
  LILY_CUDA_LAUNCH_CHECK();
  ++moe_blocks_run_;
  if (next != nullptr) ++next_projections_run_;
}

std::unique_ptr<DecodePlan> CudaBackend::make_decode_plan(const ModelWeights& weights,
                                                          const DecodePlanShape& shape) {
  return std::make_unique<CudaDecodePlan>(*this, weights, shape);
}

}  // namespace lily

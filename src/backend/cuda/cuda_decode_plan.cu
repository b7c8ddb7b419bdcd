// The CUDA decode plan: resolves each layer's MoE weights once and launches the fused kernels.
#include "backend/cuda/cuda_decode_plan.h"

#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace lily {

CudaDecodePlan::CudaDecodePlan(CudaBackend& backend, const ModelWeights& weights,
                               const DecodePlanShape& shape)
    : backend_(backend), stream_(backend.launch_) {
  moe_layers_.reserve(weights.layers.size());
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
  if (unsupported.empty() && !moe_layers_.empty()) {
    moe_grid_ = cuda::moe_layer_grid(moe_layers_.front());
    if (moe_grid_ == 0) unsupported = "its blocks do not fit on the GPU at once";
  }
  if (unsupported.empty()) {
    moe_barrier_ = static_cast<unsigned long long*>(backend.device_alloc(sizeof(unsigned long long)));
    description_ = "MoE block as one persistent kernel per layer (" + std::to_string(moe_grid_) +
                   " co-resident blocks)";
  } else {
    moe_grid_ = 0;
    description_ = "MoE block on the op path: " + unsupported;
  }
}

void CudaDecodePlan::moe_block(size_t layer, const MoeBlockBuffers& b) {
  if (moe_grid_ == 0) throw std::logic_error("CudaDecodePlan::moe_block: " + description_);
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
  cuda::moe_layer(p, moe_grid_, stream_);
  LILY_CUDA_LAUNCH_CHECK();
  ++moe_blocks_run_;
}

std::unique_ptr<DecodePlan> CudaBackend::make_decode_plan(const ModelWeights& weights,
                                                          const DecodePlanShape& shape) {
  return std::make_unique<CudaDecodePlan>(*this, weights, shape);
}

}  // namespace lily

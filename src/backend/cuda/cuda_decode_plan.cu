// The CUDA decode plan: resolves each layer's MoE and Gated DeltaNet weights once and launches
// the fused kernels.
#include "backend/cuda/cuda_decode_plan.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace lily {

CudaDecodePlan::CudaDecodePlan(CudaBackend& backend, const ModelWeights& weights,
                               const DecodePlanShape& shape)
    : backend_(backend), stream_(backend.launch_) {
  moe_layers_.reserve(weights.layers.size());
  // (A plan for a model part without MoE dims, as the Gated DeltaNet tests build, has no block.)
  std::string unsupported = shape.experts > 0 ? "" : "no MoE dims";
  for (const LayerWeights& layer : weights.layers) {
    if (shape.experts == 0) break;
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
  description_ += "; " + plan_delta_net(weights, shape);
}

std::string CudaDecodePlan::plan_delta_net(const ModelWeights& weights, const DecodePlanShape& shape) {
  const GatedDeltaNetDims& dims = shape.delta_net;
  std::string unsupported = dims.key_heads > 0 ? "" : "no Gated DeltaNet dims";
  delta_net_layers_.resize(weights.layers.size());
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& layer = weights.layers[i];
    if (layer.kind != LayerKind::linear_attention || dims.key_heads == 0) continue;
    const GatedDeltaNetWeights& w = layer.gdn;
    cuda::DeltaNetLayerParams& p = delta_net_layers_[i].params;
    delta_net_layers_[i].has_layer = true;
    p.hidden = shape.hidden;
    p.shape = cuda::DeltaNetShape{static_cast<int>(dims.key_heads), static_cast<int>(dims.value_heads),
                                  static_cast<int>(dims.key_dim), static_cast<int>(dims.value_dim),
                                  static_cast<int>(dims.conv_kernel)};
    p.eps = shape.eps;
    p.q_scale = dims.key_dim > 0 ? 1.0f / std::sqrt(static_cast<float>(dims.key_dim)) : 0.0f;  // as the CPU
    p.norm_gain = backend_.dense(layer.input_norm);
    p.in_qkv = backend_.quant(w.in_proj_qkv);
    p.in_z = backend_.quant(w.in_proj_z);
    p.in_a = backend_.quant(w.in_proj_a);
    p.in_b = backend_.quant(w.in_proj_b);
    p.conv_weight = backend_.dense(w.conv1d);
    p.a_log = backend_.dense(w.a_log);
    p.dt_bias = backend_.dense(w.dt_bias);
    p.gated_norm_gain = backend_.dense(w.norm);
    p.out_proj = backend_.quant(w.out_proj);
    if (unsupported.empty()) unsupported = cuda::delta_net_layer_unsupported(p);
    if (unsupported.empty() && delta_net_grid_ == 0) {
      delta_net_grid_ = cuda::delta_net_layer_grid(p);
      if (delta_net_grid_ == 0) unsupported = "its blocks do not fit on the GPU at once";
    }
  }
  if (delta_net_grid_ == 0 && unsupported.empty()) unsupported = "no Gated DeltaNet layers";
  // On by default (docs/cuda.md, "The decode plan"); --cuda-disable delta-net-layer runs the
  // op path's five launches instead, for comparison.
  if (!backend_.options().delta_net_layer) unsupported = "turned off (--cuda-disable delta-net-layer)";
  if (!unsupported.empty()) {
    delta_net_grid_ = 0;
    return "Gated DeltaNet mixer on the op path: " + unsupported;
  }
  delta_net_barrier_ =
      static_cast<unsigned long long*>(backend_.device_alloc(sizeof(unsigned long long)));
  delta_net_head_counts_ = static_cast<unsigned*>(
      backend_.device_alloc(static_cast<size_t>(dims.value_heads) * sizeof(unsigned)));
  return "Gated DeltaNet mixer as one persistent kernel per layer (" +
         std::to_string(delta_net_grid_) + " co-resident blocks)";
}

void CudaDecodePlan::delta_net_block(size_t layer, bool add_norm, const DeltaNetBlockBuffers& b) {
  if (delta_net_grid_ == 0) throw std::logic_error("CudaDecodePlan::delta_net_block: " + description_);
  if (layer >= delta_net_layers_.size() || !delta_net_layers_[layer].has_layer) {
    throw std::invalid_argument("CudaDecodePlan::delta_net_block: layer " + std::to_string(layer) +
                                " is not a Gated DeltaNet layer of " +
                                std::to_string(delta_net_layers_.size()));
  }
  if (b.residual == nullptr || b.delta == nullptr || b.normed == nullptr || b.mixed == nullptr ||
      b.z == nullptr || b.a == nullptr || b.b == nullptr || b.conv_window == nullptr ||
      b.state == nullptr || b.core_out == nullptr || b.gated == nullptr) {
    throw std::invalid_argument("CudaDecodePlan::delta_net_block: a buffer is null");
  }
  if (!cuda::aligned16(b.residual) || !cuda::aligned16(b.delta) || !cuda::aligned16(b.normed) ||
      !cuda::aligned16(b.state) || !cuda::aligned16(b.gated)) {
    throw std::invalid_argument(
        "CudaDecodePlan::delta_net_block: residual, delta, normed, state and gated must be 16-byte "
        "aligned");
  }
  cuda::DeltaNetLayerParams p = delta_net_layers_[layer].params;
  p.add_norm = add_norm;
  p.residual = b.residual;
  p.delta = b.delta;
  p.normed = b.normed;
  p.mixed = b.mixed;
  p.z = b.z;
  p.a = b.a;
  p.b = b.b;
  p.window = b.conv_window;
  p.state = b.state;
  p.core_out = b.core_out;
  p.gated = b.gated;
  p.out = b.delta;
  p.barrier = delta_net_barrier_;
  p.head_counts = delta_net_head_counts_;
  cuda::delta_net_layer(p, delta_net_grid_, stream_);
  LILY_CUDA_LAUNCH_CHECK();
  ++delta_net_blocks_run_;
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

// The CUDA decode plan: resolves each layer's MoE weights (and the next layer's to prefetch) once and launches the fused kernels.
#include "backend/cuda/cuda_decode_plan.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace lily {
namespace {

// One span of device memory for moe_layer to pull into L2: the 16-byte aligned bytes inside
// [ptr, ptr + bytes) (a prefetch is a hint; the few edge bytes left out are read normally).
void add_prefetch_span(cuda::MoeLayerParams& p, const void* ptr, uint64_t bytes) {
  if (ptr == nullptr || bytes == 0) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(ptr) + 15) & ~uintptr_t{15};
  const uintptr_t end = (reinterpret_cast<uintptr_t>(ptr) + bytes) & ~uintptr_t{15};
  for (uintptr_t at = begin; at < end;) {  // spans of at most 1 GB (the byte count is a u32)
    const uintptr_t size = std::min<uintptr_t>(end - at, uintptr_t{1} << 30);
    if (p.next_weight_spans == cuda::kMoeLayerPrefetchSpans) {
      throw std::logic_error("CudaDecodePlan: more than " + std::to_string(cuda::kMoeLayerPrefetchSpans) +
                             " weight spans to prefetch for one layer");
    }
    p.next_weights[p.next_weight_spans] = reinterpret_cast<const void*>(at);
    p.next_weight_bytes[p.next_weight_spans] = static_cast<uint32_t>(size);
    ++p.next_weight_spans;
    at += size;
  }
}

// The device copy of a prepared weight (CudaBackend::quant, which only the plan may call).
using ResolveQuant = std::function<const cuda::QuantMatrix&(const QuantView&)>;

void add_prefetch_matrix(const ResolveQuant& resolve, cuda::MoeLayerParams& p, const QuantView& view) {
  if (view.codes == nullptr) return;  // a weight this layer kind does not have
  const cuda::QuantMatrix& m = resolve(view);
  const uint64_t rows = static_cast<uint64_t>(m.rows());
  add_prefetch_span(p, m.codes, rows * static_cast<uint64_t>(m.words_per_row()) * 4);
  add_prefetch_span(p, m.scales, rows * static_cast<uint64_t>(m.groups_per_row()) * 2);
  add_prefetch_span(p, m.biases, rows * static_cast<uint64_t>(m.groups_per_row()) * 2);
}

// What layer `next` reads first, in the order it reads it: the mixer's input projections,
// its output projection, then the MoE block's router, shared-expert gate and shared expert
// (the routed experts are known only after its routing).
void add_next_layer_prefetch(const ResolveQuant& resolve, cuda::MoeLayerParams& p, const LayerWeights& next) {
  if (next.kind == LayerKind::linear_attention) {
    for (const QuantView* v : {&next.gdn.in_proj_qkv, &next.gdn.in_proj_z, &next.gdn.in_proj_a,
                               &next.gdn.in_proj_b, &next.gdn.out_proj}) {
      add_prefetch_matrix(resolve, p, *v);
    }
  } else {
    for (const QuantView* v : {&next.attn.q_proj, &next.attn.k_proj, &next.attn.v_proj, &next.attn.o_proj}) {
      add_prefetch_matrix(resolve, p, *v);
    }
  }
  for (const QuantView* v : {&next.moe.router, &next.moe.shared_expert_gate, &next.moe.shared_gate,
                             &next.moe.shared_up, &next.moe.shared_down}) {
    add_prefetch_matrix(resolve, p, *v);
  }
}

}  // namespace

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
  // Each layer's block pulls the next layer's first weights into L2 (MoeLayerParams::
  // next_weights); the last layer's is followed by the lm_head, too big for L2.
  if (unsupported.empty() && backend.options().layer_prefetch) {
    const ResolveQuant resolve = [&backend](const QuantView& v) -> const cuda::QuantMatrix& {
      return backend.quant(v);
    };
    for (size_t l = 0; l + 1 < moe_layers_.size(); ++l) {
      add_next_layer_prefetch(resolve, moe_layers_[l], weights.layers[l + 1]);
    }
  }
  if (unsupported.empty()) {
    moe_barrier_ = static_cast<unsigned long long*>(backend.device_alloc(sizeof(unsigned long long)));
    description_ = "MoE block as one persistent kernel per layer (" + std::to_string(moe_grid_) +
                   " co-resident blocks), " +
                   (backend.options().layer_prefetch ? std::string("pulling the next layer's weights into L2")
                                                     : std::string("no next-layer prefetch (--cuda-disable layer-prefetch)"));
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
  if (p.next_weight_spans > 0) ++backend_.counts_.layer_prefetch;
}

std::unique_ptr<DecodePlan> CudaBackend::make_decode_plan(const ModelWeights& weights,
                                                          const DecodePlanShape& shape) {
  return std::make_unique<CudaDecodePlan>(*this, weights, shape);
}

}  // namespace lily

// The CUDA backend's decode plan: the per-layer weights resolved once to device matrices, and
// the fused one-token kernels that replace groups of ops (today the MoE block with the next
// layer's norm and input projection, moe_layer.cu).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <string>
#include <vector>

#include "backend/decode_plan.h"
#include "backend/cuda/cuda_ops.h"
#include "checkpoint/weights.h"

namespace lily {

class CudaBackend;

class CudaDecodePlan final : public DecodePlan {
 public:
  // `weights` must have been prepared by `backend`. When the MoE kernel cannot take the shapes
  // or its grid cannot be co-resident on this GPU, has_moe_block() is false and describe()
  // says why (the model then runs the op path for it).
  CudaDecodePlan(CudaBackend& backend, const ModelWeights& weights, const DecodePlanShape& shape);

  std::string describe() const override { return description_; }
  bool has_moe_block() const override { return launch_.grid > 0; }
  bool fuses_next_projection(size_t layer) const override;
  void moe_block(size_t layer, const MoeBlockBuffers& buffers, const NextProjection* next) override;
  uint64_t moe_blocks_run() const override { return moe_blocks_run_; }
  uint64_t next_projections_run() const override { return next_projections_run_; }

 private:
  CudaBackend& backend_;
  cuda::Stream stream_;  // the backend's launch stream (its PDL choice, cuda_ops.h)
  // Per layer: the MoE block's matrices and norm gain in device memory (the rest of the
  // parameters are the model's buffers, filled in at each call).
  std::vector<cuda::MoeLayerParams> moe_layers_;
  // Per layer: layer + 1's input projection (count 0: none; the y pointers are filled in at
  // each call) and the weights the model must pass for it (checked at each call).
  std::vector<cuda::NextProjectionParams> next_;
  std::vector<std::array<const QuantView*, cuda::kMaxNextTargets>> next_views_;
  std::vector<const DenseView*> next_norms_;
  // Every moe_layer launch's shape (the barrier counter relies on one grid size); grid 0: the
  // MoE block runs on the op path.
  cuda::MoeLayerLaunch launch_;
  unsigned long long* moe_barrier_ = nullptr;  // [1] u64 device, zeroed, only ever grows
  uint64_t moe_blocks_run_ = 0;
  uint64_t next_projections_run_ = 0;
  std::string description_;
};

}  // namespace lily

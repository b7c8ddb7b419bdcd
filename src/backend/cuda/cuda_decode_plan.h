// The CUDA backend's decode plan: the per-layer weights resolved once to device matrices, and
// the fused one-token kernels that replace groups of ops (today the MoE block, moe_layer.cu).
#pragma once

#include <cuda_runtime.h>

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
  bool has_moe_block() const override { return moe_grid_ > 0; }
  void moe_block(size_t layer, const MoeBlockBuffers& buffers) override;
  uint64_t moe_blocks_run() const override { return moe_blocks_run_; }

 private:
  CudaBackend& backend_;
  cuda::Stream stream_;  // the backend's launch stream (its PDL choice, cuda_ops.h)
  // Per layer: the MoE block's matrices and norm gain in device memory (the rest of the
  // parameters are the model's buffers, filled in at each call).
  std::vector<cuda::MoeLayerParams> moe_layers_;
  int moe_grid_ = 0;  // blocks of every moe_layer launch (the barrier counter relies on one size)
  unsigned long long* moe_barrier_ = nullptr;  // [1] u64 device, zeroed, only ever grows
  uint64_t moe_blocks_run_ = 0;
  std::string description_;
};

}  // namespace lily

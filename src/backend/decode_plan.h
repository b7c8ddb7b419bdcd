// A backend's own kernels for parts of the one-token decode step, built once per model: the
// fast path beside the op path (the CUDA backend has one; the CPU runs the op path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lily {

// The model's buffers that the MoE block of a decode step reads and writes (backend memory,
// f32 unless noted; H = hidden, E = experts, k = experts per token, I = moe_intermediate,
// S = shared_expert_intermediate).
struct MoeBlockBuffers {
  float* residual = nullptr;       // [H] in/out: residual += delta
  float* delta = nullptr;          // [H] in: the mixer's output; out: the MoE block's output
  float* normed = nullptr;         // [H] out: rms_norm(residual) * post_attention_norm
  float* router_logits = nullptr;  // [E] scratch
  float* shared_logit = nullptr;   // [1] scratch
  int32_t* expert_ids = nullptr;   // [k] i32 out
  float* expert_weights = nullptr; // [k] out
  float* expert_h = nullptr;       // [k, I] scratch
  float* shared_h = nullptr;       // [S] scratch
};

// What a plan needs besides the weights (from the model shape).
struct DecodePlanShape {
  int64_t hidden = 0;
  int64_t experts = 0;
  int64_t experts_per_token = 0;
  float eps = 0.0f;  // the RMSNorm epsilon
};

class DecodePlan {
 public:
  virtual ~DecodePlan() = default;
  // What the plan runs, for the start-up line: e.g. "MoE block as one persistent kernel per
  // layer (264 blocks)", or why a part runs the op path.
  virtual std::string describe() const = 0;
  // Whether moe_block may be called (the shapes, code widths and the GPU allow it).
  virtual bool has_moe_block() const = 0;
  // Layer `layer`'s MoE block for one token, with the results of the op path's
  // add_rms_norm + matmul_group(router | shared gate) + route_expert_swiglu +
  // expert_down_combine, bit for bit.
  virtual void moe_block(size_t layer, const MoeBlockBuffers& buffers) = 0;
  // How many MoE blocks went through moe_block: recorded or eager calls (a replayed graph
  // does not pass through the host). Tests of the fast path assert it rose.
  virtual uint64_t moe_blocks_run() const = 0;
};

}  // namespace lily

// The kernel lab's persistent Gated DeltaNet mixer (tools/lab/delta_net_layer.cu): its
// parameters and launchers. Measured slower than the op path and not in the decode plan
// (docs/cuda.md, "Measured and not kept"); kept here, bit-identical to the op path, as a
// building block of a one-kernel decode step.
#pragma once

#include <string>

#include "backend/cuda/cuda_ops.h"

namespace lily::cuda::lab {

// One token, the model's delta_net_mixer: [residual += delta; normed = rms_norm(residual) *
// norm_gain]; mixed | z | a | b = the input projections of normed; core_out = the conv + gated
// delta rule (window and state carried); out = out_proj(gated_rms_norm(core_out, z)); the
// window shifted by this token. Bit-identical to add_rms_norm + gemv_batch +
// gated_delta_step + gated_rms_norm + gemv_batch with its WindowShift. out may be delta (it
// is written only after every block has read delta).
struct DeltaNetLayerParams {
  int64_t hidden = 0;   // H
  DeltaNetShape shape;  // Hk, Hv, Dk, Dv, K (= kFusedConvKernel); C = shape.channels()
  float eps = 0.0f;     // both RMSNorms
  float q_scale = 0.0f; // 1 / sqrt(Dk)
  // The input norm. add_norm: the op path's add_rms_norm; else normed already holds the
  // normalised input (the first layer) and residual, delta, norm_gain are not read.
  bool add_norm = false;
  float* residual = nullptr;         // [H] f32 in/out
  const float* delta = nullptr;      // [H] f32, the previous block's output
  const float* norm_gain = nullptr;  // [H] f32 (input_layernorm)
  float* normed = nullptr;           // [H] f32 out (in when !add_norm)
  QuantMatrix in_qkv, in_z, in_a, in_b;  // [C, H], [Hv Dv, H], [Hv, H], [Hv, H]
  float* mixed = nullptr;                // [C] f32 out
  float* z = nullptr;                    // [Hv Dv] f32 out
  float* a = nullptr;                    // [Hv] f32 out
  float* b = nullptr;                    // [Hv] f32 out
  const float* conv_weight = nullptr;    // [C, K] f32
  const float* a_log = nullptr;          // [Hv] f32
  const float* dt_bias = nullptr;        // [Hv] f32
  float* window = nullptr;               // [K-1, C] f32 in/out
  float* state = nullptr;                // [Hv, Dk, Dv] f32 in/out, 16-byte aligned
  float* core_out = nullptr;             // [Hv, Dv] f32 out
  const float* gated_norm_gain = nullptr;  // [Dv] f32
  float* gated = nullptr;                  // [Hv Dv] f32 scratch: the gated norm's output
  unsigned* head_counts = nullptr;         // [Hv] u32 device, zeroed once: finished tiles per head
  QuantMatrix out_proj;                    // [H, Hv Dv]
  float* out = nullptr;                    // [H] f32 out
  unsigned long long* barrier = nullptr;   // [1] u64 device, zeroed once, owned by one grid size
  // (head_counts and barrier only grow: every launch on them must have the same shapes.)
  // Profiling only (tools/lab/delta_net_layer_lab.cu), nullptr in the server:
  // [grid, kDeltaNetLayerStamps] u64 %globaltimer stamps of each block's phase ends.
  unsigned long long* timeline = nullptr;
};
// The phase ends delta_net_layer stamps: after the dependency wait, the norm, the projections,
// barrier 1, the delta rule, barrier 2, the gated norm, the end.
inline constexpr int kDeltaNetLayerStamps = 8;
// Empty when delta_net_layer takes these shapes and code widths, else why not.
std::string delta_net_layer_unsupported(const DeltaNetLayerParams& p);
// The grid delta_net_layer must be launched with (every block co-resident); 0 when it cannot
// be (no block fits, or fewer blocks than delta-rule tiles).
int delta_net_layer_grid(const DeltaNetLayerParams& p);
void delta_net_layer(const DeltaNetLayerParams& p, int grid, Stream s);

}  // namespace lily::cuda::lab

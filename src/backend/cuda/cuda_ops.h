// The CUDA kernels' launch functions: raw device pointers and one Stream, no validation
// (CudaBackend validates every argument before it calls these). One .cu file per group.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/sampling.h"

namespace lily::cuda {

// Where and how the launch functions launch: the backend's stream, and whether its kernels
// get the programmatic-serialization attribute (cuda_common.cuh, `launch`). The backend
// builds it from its CudaOptions and the device; nothing else decides PDL. `pdl_launches`
// (may be nullptr) counts the kernels launched with the attribute, host side (the backend's
// CudaPathCounts); `issued` (may be nullptr) counts every launch, the stream operations that
// LaunchOrder (launch_order.h) orders. Converts to the cudaStream_t for runtime calls on the
// same stream.
struct Stream {
  cudaStream_t handle = nullptr;
  bool pdl = false;
  uint64_t* pdl_launches = nullptr;
  uint64_t* issued = nullptr;
  operator cudaStream_t() const { return handle; }  // NOLINT: implicit on purpose
};

// An MLX affine Q4/Q8 weight (group 64) in device memory, uploaded from a QuantView.
// Stacked experts are flattened: expert e's row r is row e * out + r.
// All three arrays are 256-byte aligned at row 0; a row's codes start at row * words_per_row.
struct QuantMatrix {
  const uint32_t* codes = nullptr;        // U32  [rows, in * bits / 32]
  const __nv_bfloat16* scales = nullptr;  // BF16 [rows, in / 64]
  const __nv_bfloat16* biases = nullptr;  // BF16 [rows, in / 64]
  int bits = 4;                           // 4 or 8
  int64_t experts = 1;
  int64_t out = 0;  // rows per expert
  int64_t in = 0;   // logical input width, a multiple of 64
  __host__ __device__ int64_t rows() const { return experts * out; }
  __host__ __device__ int64_t words_per_row() const { return in * bits / 32; }
  __host__ __device__ int64_t groups_per_row() const { return in / 64; }
};

// Grow-only device scratch owned by the backend. A buffer handed out is never freed before
// the backend is destroyed (a captured graph may still point at it), so growing a slot
// allocates a new buffer and keeps the old one. Allocation happens outside graph capture:
// the first (eager) run of a shape sizes everything its captured replays need.
class Workspace {
 public:
  virtual ~Workspace() = default;
  // At least `bytes` of device memory, 256-byte aligned, for the caller's private use until
  // its kernels finish (stream order). Slots keep unrelated users apart.
  virtual void* get(int slot, size_t bytes) = 0;
};

// Workspace slots, one per user.
enum WorkspaceSlot : int {
  kWsArgmax = 0,
  kWsAttention = 1,
  kWsGemm = 2,
  kWsMoe = 3,
  kWsMoe2 = 4,
  kWsGdn = 5,
  kWsSampler = 6,
  kWsLogprobs = 7,
  kWsCount = 8,
};

// ---- quant_gemv.cu (decode: few tokens, bandwidth bound) --------------------------------
// Largest n the GEMV kernels take; CudaBackend routes larger n to the GEMM kernels.
inline constexpr int64_t kGemvMaxTokens = 8;
// Activations the decode kernels stage per block in shared memory, at most: 40 KB, so that
// the kernels' static shared memory fits beside it in the default 48 KB. Larger inputs are
// read from global memory.
inline constexpr size_t kMaxStagedBytes = 40 * 1024;
// Routing fused into the SwiGLU launch (route_expert_swiglu_gemv) takes k <= 16 and at most
// 256 experts (8 per lane of the routing warp).
inline constexpr int kFusedRouteLanes = 8;
inline constexpr int64_t kMaxFusedRouteExperts = 32 * kFusedRouteLanes;
inline constexpr int64_t kMaxFusedRouteK = 16;

// out[t, :] = dequant(table row ids[t])                 ids [n] i32; out [n, in] f32
void embed(const QuantMatrix& table, const int32_t* ids, int64_t n, float* out, Stream s);

// ---- cuda_faults.cu ---------------------------------------------------------------------
// Test only (--test-fault ...:device): a kernel storing through a null pointer, which
// poisons the context exactly as a kernel bug does; the error surfaces at the next sync.
void launch_poison_context(Stream s);

// y[t, r] = sum_c W[row_begin + r, c] x[t, c]            x [n, in] f32; y [n, rows] f32; n <= 8
// The generic GEMV; CudaBackend::matmul takes stream_gemv instead where that applies.
void gemv(const QuantMatrix& w, int64_t row_begin, int64_t rows, const float* x, int64_t n,
          float* y, Stream s);

// ---- stream_gemv.cu (gemv of one token over a tall Q4 matrix: lm_head) ------------------
// CudaBackend::matmul routes here when stream_gemv_applies: n == 1, Q4, in of 1024 or 2048, at
// least kStreamGemvMinRows rows, 16-byte aligned buffers, the kernel enabled (the backend
// enables it when the code running on the device was built for compute capability 9.0+, for
// the bulk copies, unless --cuda-disable stream-gemv) and its tiles fitting the device's
// shared memory per block (144 KB for in = 2048: an H100/H200 has 227 KB, sm_86/89/120 GPUs
// 99 KB). Same contract as gemv and bit-identical results; persistent blocks keep tiles of
// rows in flight.
inline constexpr int64_t kStreamGemvMinRows = 32768;
// The backend's choice for the kernel: enabled, and the device's opt-in shared memory per block.
struct StreamGemvConfig {
  bool enabled = false;
  size_t max_shared_bytes = 0;
};
// Dynamic shared memory the kernel needs for rows of `in` values (1024 or 2048; 0 otherwise).
size_t stream_gemv_shared_bytes(int64_t in);
// Whether the kernel is enabled and its tiles for rows of `in` values fit the shared memory.
bool stream_gemv_enabled_for(int64_t in, const StreamGemvConfig& config);
// Whether the kernel's body is in the code the device runs: built for sm_90 or newer (a
// device JIT-compiling the compute_80 PTX gets an empty kernel, so it must stay off there).
bool stream_gemv_built_for_device();
bool stream_gemv_applies(const QuantMatrix& w, int64_t rows, const float* x, int64_t n,
                         const StreamGemvConfig& config);
void stream_gemv(const QuantMatrix& w, int64_t row_begin, int64_t rows, const float* x, float* y,
                 const StreamGemvConfig& config, Stream s);

// Several projections of one input in one launch (the decode fusions: GDN qkv|z|a|b,
// attention q|k|v, router|shared-expert gate). For each target, as gemv. Every target has the
// same bit width and input width, rows > 0; at most kMaxGemvTargets targets.
struct GemvTarget {
  QuantMatrix w;
  int64_t row_begin = 0;
  int64_t rows = 0;
  float* y = nullptr;  // [n, rows] f32
};
inline constexpr int kMaxGemvTargets = 4;
// Optional side job of a batch (any n): after the wait, the launch's threads shift a conv
// window by one token, as conv1d_silu does for n = 1: window row j <- row j + 1 for
// j < K-2, row K-2 <- mixed (one token's inputs). For gated_delta_step, whose window update
// has to wait until all its blocks have read it: the output projection launched after it.
struct WindowShift {
  const float* mixed = nullptr;  // [channels] f32
  float* window = nullptr;       // [K-1, channels] f32, updated; nullptr: nothing to do
  int64_t channels = 0;
  int conv_kernel = 0;           // K, 2..8
};
void gemv_batch(const GemvTarget* targets, int count, const float* x, int64_t n, Stream s,
                const WindowShift& shift = WindowShift{});

// out[t] = index of the largest logit (lowest index on ties; NaN never wins over a number,
// where the CPU's strict scan would keep a NaN at index 0: a difference only for NaN logits).
// logits [n, vocab] f32; out [n] i32
void argmax(const float* logits, int64_t n, int64_t vocab, int32_t* out, Workspace& ws,
            Stream s);

// h[t, j, :] = silu(G_e x[t]) * U_e x[t], e = ids[t, j] (ids == nullptr: e = 0), n <= 8.
// x [n, in] f32; ids [n, k] i32 (device); h [n, k, I] f32 with I = gate.out
void expert_swiglu_gemv(const QuantMatrix& gate, const QuantMatrix& up, const float* x,
                        const int32_t* ids, int64_t n, int64_t k, float* h, Stream s);

// expert_swiglu_gemv for the routed experts and, in the same launch, the shared expert:
// shared_h [n, S] = silu(Gs x) * Us x. The shared matrices need the routed ones' bit widths and
// input width. shared_gate == nullptr: routed only.
void expert_swiglu_shared_gemv(const QuantMatrix& gate, const QuantMatrix& up, const int32_t* ids,
                               int64_t k, float* h, const QuantMatrix* shared_gate,
                               const QuantMatrix* shared_up, float* shared_h, const float* x,
                               int64_t n, Stream s);

// moe_route (logits [n, E] -> ids, weights [n, k]) fused into expert_swiglu_shared_gemv: one
// launch routes, gathers the routed experts and runs the shared expert. n <= 8, k <= 16,
// k <= E <= 256; the shared matrices as for expert_swiglu_shared_gemv. next_down (nullptr:
// none): the stacked down projection [E, H, I], whose rows of the chosen experts the launch
// prefetches into L2 for expert_down_combine_gemv.
void route_expert_swiglu_gemv(const float* logits, int64_t experts, int32_t* ids, float* weights,
                              const QuantMatrix& gate, const QuantMatrix& up, int64_t k, float* h,
                              const QuantMatrix& shared_gate, const QuantMatrix& shared_up,
                              float* shared_h, const float* x, int64_t n,
                              const QuantMatrix* next_down, Stream s);

// out[t] = sum_j weights[t, j] D_{ids[t,j]} h[t, j] + sigmoid(shared_logit[t]) D_s shared_h[t], n <= 8
// h [n, k, I]; ids, weights [n, k]; shared_h [n, S]; shared_logit [n]; out [n, H] (H = down.out)
void expert_down_combine_gemv(const QuantMatrix& down, const float* h, const int32_t* ids,
                              const float* weights, int64_t n, int64_t k,
                              const QuantMatrix& shared_down, const float* shared_h,
                              const float* shared_logit, float* out, Stream s);

// ---- quant_gemm.cu, moe_grouped.cu (prefill: many tokens, tensor cores) -----------------
// Same contract as gemv, any n >= 1: dequantised BF16 weight tiles x BF16 activations on
// tensor cores, f32 accumulation.
void gemm(const QuantMatrix& w, int64_t row_begin, int64_t rows, const float* x, int64_t n,
          float* y, Workspace& ws, Stream s);

// Same contracts as the _gemv versions, any n >= 1: the n*k (token, expert) pairs are sorted
// by expert on the device (no host round trip) and each expert's tokens run as one GEMM.
void expert_swiglu_grouped(const QuantMatrix& gate, const QuantMatrix& up, const float* x,
                           const int32_t* ids, int64_t n, int64_t k, float* h, Workspace& ws,
                           Stream s);
void expert_down_combine_grouped(const QuantMatrix& down, const float* h, const int32_t* ids,
                                 const float* weights, int64_t n, int64_t k,
                                 const QuantMatrix& shared_down, const float* shared_h,
                                 const float* shared_logit, float* out, Workspace& ws,
                                 Stream s);

// ---- norms.cu -------------------------------------------------------------------------
// out = x / sqrt(mean(x^2) + eps) * gain                x, out [n, dim]; gain [dim] f32
void rms_norm(const float* x, const float* gain, int64_t n, int64_t dim, float eps, float* out,
              Stream s);
// residual += delta; out = rms_norm(residual)           residual, delta, out [n, dim]
void add_rms_norm(float* residual, const float* delta, const float* gain, int64_t n, int64_t dim,
                  float eps, float* out, Stream s);
// out = rms_norm(x) * gain * silu(z) per row            x, z, out [rows, dim]; gain [dim] f32
void gated_rms_norm(const float* x, const float* z, const float* gain, int64_t rows, int64_t dim,
                    float eps, float* out, Stream s);

// ---- attention.cu ----------------------------------------------------------------------
struct AttentionShape {
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;    // 256 in the model; kernels may require it (CudaBackend checks)
  int rotary_dim = 0;  // 64: NeoX rotate-half over the first rotary_dim dims
  double rope_theta = 0;
};
// The position of the first token: *pos_device when pos_device != nullptr (then n == 1),
// else pos_host.
// In place: zero-centred RMSNorm (baked gains, f32 [head_dim]) of each query head of
// qg [n, q_heads, 2, head_dim] (query then gate) and each head of k [n, kv_heads, head_dim],
// then RoPE at positions pos + t.
void attention_prepare(float* qg, float* k, const float* q_norm, const float* k_norm,
                       const AttentionShape& a, int64_t pos_host, const int32_t* pos_device,
                       int64_t n, float eps, Stream s);
// The two KV caches of an attention layer, [capacity, kv_heads, head_dim] each, of one
// element type: f32, bf16 (__nv_bfloat16, written with round-to-nearest-even) or int8 (codes,
// with key_scales / value_scales [capacity, kv_heads] f32: quantize_kv_row's, backend.h).
enum class KvType { f32, bf16, int8 };
struct KvCaches {
  void* keys = nullptr;
  void* values = nullptr;
  KvType type = KvType::f32;
  float* key_scales = nullptr;    // int8 only
  float* value_scales = nullptr;  // int8 only
};
// Writes k, v [n, kv_heads, head_dim] f32 into the caches at rows pos.. (bf16: rounded; int8:
// quantised per (token, kv head) row as quantize_kv_row, backend.h), then
// causal attention of each query over cache rows 0..pos+t as stored (the new rows too, so a
// bf16 cache's rounding is seen from the token that writes it), scaled by 1/sqrt(head_dim),
// times sigmoid(gate); f32 arithmetic.  out [n, q_heads * head_dim] f32.
// With pos_device the kernels size their grids by `capacity` (the position is unknown when
// a graph is captured) and never touch rows >= capacity.
// Returns the kernel path it took: decode (n == 1) over a bf16 cache with head_dim 256 and
// query groups of 8 (the model's shape) runs on tensor cores, every other decode on CUDA cores.
// An int8 cache with that shape decodes on tensor cores too (decode_int8_tensor_cores: int8
// MMAs for the scores, f16 for the value sum); its other shapes on CUDA cores.
enum class AttentionPath { none, prefill, decode_cuda_cores, decode_tensor_cores, decode_int8_tensor_cores };
// Whether the device has the shared memory the tensor-core decode kernel needs (else that shape
// decodes on CUDA cores too).
bool tensor_core_decode_attention_fits();
bool int8_tensor_core_decode_attention_fits();
AttentionPath attention(const float* qg, const float* k, const float* v, const KvCaches& caches,
                        int64_t capacity, const AttentionShape& a, int64_t pos_host,
                        const int32_t* pos_device, int64_t n, float* out, Workspace& ws,
                        Stream s);

// ---- gated_delta_net.cu, moe_route.cu --------------------------------------------------
struct DeltaNetShape {
  int key_heads = 0;    // 16
  int value_heads = 0;  // 32; value head h reads key head h / (value_heads / key_heads)
  int key_dim = 0;      // 128
  int value_dim = 0;    // 128
  int conv_kernel = 0;  // 4
  int64_t channels() const { return 2LL * key_heads * key_dim + static_cast<int64_t>(value_heads) * value_dim; }
};
// Causal depthwise conv over time with the cached last K-1 inputs, then SiLU.
// mixed, out [n, C]; window [K-1, C] (oldest first) updated; weight f32 [C, K] (tap K-1
// multiplies the current token).
void conv1d_silu(const float* mixed, float* window, const float* weight, const DeltaNetShape& d,
                 int64_t n, float* out, Stream s);
// Gated delta rule over n tokens in order (see Backend::gated_delta_rule).
// conv [n, C] = q | k | v; a, b [n, value_heads]; a_log, dt_bias f32 [value_heads];
// state [value_heads, key_dim, value_dim] f32 (updated); out [n, value_heads, value_dim]
void gated_delta_rule(const float* conv, const float* a, const float* b, const float* a_log,
                      const float* dt_bias, float* state, const DeltaNetShape& d, int64_t n,
                      float* out, Stream s);
// One token of conv1d_silu fused into the one-token gated delta rule, one launch: mixed [C]
// is this token's projection, window [K-1, C] is read and NOT updated (the caller shifts it
// with a WindowShift on a later launch, after every block of this one has read it), weight
// f32 [C, K]; the rest as gated_delta_rule with n = 1. Supported: gated_delta_step_supports.
inline constexpr int kFusedConvKernel = 4;  // the model's conv_kernel
bool gated_delta_step_supports(const DeltaNetShape& d);
// With `norm`, the same launch also forms norm->out = gated_rms_norm(out, norm->z, norm->gain)
// per value head, bit-identical to gated_rms_norm (a head's column tiles are one thread-block
// cluster): needs gated_delta_norm_supports(d) (value_dim <= 256) and code built for compute
// capability 9.0 (gated_delta_norm_built_for_device) on a device of 9.0 or newer.
struct DeltaGatedNorm {
  const float* z = nullptr;     // [value_heads, value_dim]
  const float* gain = nullptr;  // [value_dim] f32
  float eps = 0.0f;
  float* out = nullptr;         // [value_heads, value_dim]
};
bool gated_delta_norm_supports(const DeltaNetShape& d);
bool gated_delta_norm_built_for_device();
void gated_delta_step(const float* mixed, const float* window, const float* conv_weight,
                      const float* a, const float* b, const float* a_log, const float* dt_bias,
                      float* state, const DeltaNetShape& d, float* out, Stream s,
                      const DeltaGatedNorm* norm = nullptr);
// softmax over E logits, top-k (ties: lower id first), weights renormalised to sum 1.
// logits [n, E]; ids [n, k] i32; weights [n, k]
void moe_route(const float* logits, int64_t n, int64_t experts, int64_t k, int32_t* ids,
               float* weights, Stream s);

// ---- moe_layer.cu (the decode plan's MoE block: one persistent launch per layer) --------
// One token: residual += delta; normed = rms_norm(residual) * norm_gain; the router and
// shared-gate logits; top-k routing; the routed and shared SwiGLU; out = down + combine.
// Bit-identical to add_rms_norm + gemv_batch + route_expert_swiglu_gemv +
// expert_down_combine_gemv. out may be delta (it is written only after delta is read).
struct MoeLayerParams {
  int64_t hidden = 0;   // H
  int64_t experts = 0;  // E
  int64_t k = 0;        // experts per token
  float eps = 0.0f;
  float* residual = nullptr;         // [H] f32, in/out
  const float* delta = nullptr;      // [H] f32, the mixer's output
  const float* norm_gain = nullptr;  // [H] f32 (post_attention_norm)
  float* normed = nullptr;           // [H] f32 out
  QuantMatrix router;                // [E, H]
  QuantMatrix shared_expert_gate;    // [1, H]
  QuantMatrix gate, up, down;        // [E x I, H], [E x I, H], [E x H, I]
  QuantMatrix shared_gate, shared_up, shared_down;  // [S, H], [S, H], [H, S]
  float* router_logits = nullptr;    // [E] f32 scratch
  float* shared_logit = nullptr;     // [1] f32 scratch
  int32_t* ids = nullptr;            // [k] i32 out
  float* weights = nullptr;          // [k] f32 out
  float* h = nullptr;                // [k, I] f32 scratch
  float* shared_h = nullptr;         // [S] f32 scratch
  float* out = nullptr;              // [H] f32 out
  unsigned long long* barrier = nullptr;  // [1] u64 device, zeroed once, owned by one grid size
  // Profiling only (tools/lab/moe_layer_lab.cu), nullptr in the server: [grid, kMoeLayerStamps]
  // u64 %globaltimer stamps of each block's phase ends.
  unsigned long long* timeline = nullptr;
};
// The phase ends moe_layer stamps into MoeLayerParams::timeline: after the dependency wait,
// the norm, the router, barrier 1, the routing, the SwiGLU, barrier 2, the staging, the end.
inline constexpr int kMoeLayerStamps = 9;
// Empty when moe_layer takes these shapes and code widths, else why not.
std::string moe_layer_unsupported(const MoeLayerParams& p);
// The grid moe_layer must be launched with: every block co-resident (blocks per SM from the
// occupancy calculator x SMs); 0 when none fits.
int moe_layer_grid(const MoeLayerParams& p);
size_t moe_layer_shared_bytes(const MoeLayerParams& p);
void moe_layer(const MoeLayerParams& p, int grid, Stream s);

// ---- sampler.cu -------------------------------------------------------------------------
// The sampler ops' device state that must start zeroed (counters, a histogram): the backend
// allocates this many bytes once, zero-filled, and passes them to every call of both ops.
size_t sampler_state_bytes();
// Backend::sample: the stages of sampling.h on logits [vocab] f32 with the SamplerBuffers in
// device memory; *token_out, counts[token] += 1, step += 1. A fixed sequence of launches that
// read every parameter from device memory (capturable; nothing from the host at replay).
// vocab in [1, kMaxSamplerVocab]; parameters as sampler_params_error accepts (the host checks
// them before they are uploaded; out-of-contract values are memory-safe but unspecified).
void sample(const float* logits, int64_t vocab, const SamplerBuffers& sampler, int32_t* token_out,
            void* state, Workspace& ws, Stream s);
// Backend::token_logprobs: record [TokenRecordLayout::kWords] i32 for *token (< vocab) with
// n = params->top_logprobs (clamped to 0..20) from params [kSamplerParamWords].
void token_logprobs(const float* logits, int64_t vocab, const int32_t* token, const int32_t* params,
                    int32_t* record, void* state, Workspace& ws, Stream s);

}  // namespace lily::cuda

// The backend interface: the coarse ops the model graph is written against, with contracts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "backend/decode_plan.h"
#include "backend/fault_injection.h"
#include "backend/sampling.h"
#include "checkpoint/weights.h"

namespace lily {

struct CudaOptions;  // backend/cuda/cuda_options.h

// Sizes the attention and Gated DeltaNet ops need, from the model shape.
struct AttentionDims {
  int64_t q_heads = 0;     // 16 (tiny 8)
  int64_t kv_heads = 0;    // 2 (tiny 1); query head h reads kv head h / (q_heads / kv_heads)
  int64_t head_dim = 0;    // 256
  int64_t rotary_dim = 0;  // 64: NeoX rotate-half over the first rotary_dim dims
  double rope_theta = 0;   // 1e7
};

struct GatedDeltaNetDims {
  int64_t key_heads = 0;    // 16 (tiny 2)
  int64_t value_heads = 0;  // 32 (tiny 4); value head h reads key head h / (value_heads / key_heads)
  int64_t key_dim = 0;      // 128
  int64_t value_dim = 0;    // 128
  int64_t conv_kernel = 0;  // 4
  int64_t channels() const { return 2 * key_heads * key_dim + value_heads * value_dim; }
};

// The sequence position of an op's first token. When `device` is set it points at an i32 in
// backend memory that holds the position at the time the op runs, and `host` is ignored: a
// replayed CUDA graph reads the current position there instead of the one it was captured
// with. Device positions are only accepted with n == 1 (a decode step).
struct SeqPos {
  SeqPos(int64_t host_position = 0) : host(host_position) {}  // NOLINT: implicit on purpose
  SeqPos(int64_t host_position, const int32_t* device_position)
      : host(host_position), device(device_position) {}
  int64_t host = 0;
  const int32_t* device = nullptr;
};

// The element type of the attention layers' KV caches, chosen at start-up (--kv-cache,
// docs/precision.md): f32 (exact: the reference path), bf16 (half the bytes; each key and
// value rounded to nearest-even when it is written, read back widened exactly to f32) or int8
// (a quarter of f32's bytes, plus one f32 scale per row of head_dim values: each (token, KV
// head) row of keys or values quantised symmetrically when it is written, quantize_kv_row).
enum class KvDtype : uint8_t { f32, bf16, int8 };
const char* kv_dtype_name(KvDtype dtype);             // "f32", "bf16", "int8"
size_t kv_dtype_bytes(KvDtype dtype);                 // bytes per element: 4, 2, 1 (int8's scales apart)
std::optional<KvDtype> parse_kv_dtype(std::string_view name);  // "f32" / "bf16" / "int8", else nullopt
// Bytes of one KV cache buffer of `count` elements in rows of head_dim: the elements, and for
// int8 the f32 scale of each row.
uint64_t kv_cache_bytes(KvDtype dtype, uint64_t count, int64_t head_dim);

// The int8 cache's code of each value of a row: the row's scale is max |x| / 127 and value i
// is stored as code[i] = round-to-nearest-even(x[i] * (127 / max |x|)), in [-127, 127], read
// back as code[i] * scale; an all-zero row has scale 0 and codes 0, a row with a NaN or an
// infinity scale NaN and codes 0 (every value reads NaN, as the f32 cache's arithmetic would
// turn it). Every backend quantises with exactly these f32 operations, so CPU and CUDA store
// the same codes and scale for the same row. Returns the scale.
float quantize_kv_row(const float* x, int64_t width, int8_t* codes);

// One KV cache buffer (keys or values) [capacity, kv_heads, head_dim] in backend memory,
// with the type of its elements: f32 values, bf16 bit patterns (uint16_t: the top half of the
// f32, core/bf16.h), or int8 codes with scales [capacity, kv_heads] f32 (one per head_dim
// values, `scale_group` = head_dim). Does not own the memory. A float* converts implicitly to
// an f32 view (what a float* holds); the others are only made by KvCacheView::bf16 / ::int8
// or alloc_kv_cache.
struct KvCacheView {
  KvCacheView() = default;
  KvCacheView(float* f32_values)  // NOLINT: implicit on purpose, the f32 cache is a float*
      : data(f32_values), dtype(KvDtype::f32) {}
  static KvCacheView bf16(uint16_t* bits) {
    KvCacheView view;
    view.data = bits;
    view.dtype = KvDtype::bf16;
    return view;
  }
  static KvCacheView int8(int8_t* codes, float* row_scales, int64_t head_dim) {
    KvCacheView view;
    view.data = codes;
    view.dtype = KvDtype::int8;
    view.scales = row_scales;
    view.scale_group = head_dim;
    return view;
  }
  // The typed pointer; std::logic_error when the view holds another dtype.
  float* f32() const;
  uint16_t* bf16_bits() const;
  int8_t* int8_codes() const;
  float* int8_scales() const;
  // The row scales that go with `count` elements: count / scale_group for int8, else 0.
  size_t scale_count(size_t count) const {
    return dtype == KvDtype::int8 ? count / static_cast<size_t>(scale_group) : 0;
  }

  void* data = nullptr;
  KvDtype dtype = KvDtype::f32;
  float* scales = nullptr;   // int8 only: [count / scale_group] f32
  int64_t scale_group = 0;   // int8 only: values per scale (head_dim)
};

// One output of Backend::matmul_group: y [n, rows] = rows row_begin.. of *w times x.
struct MatmulTarget {
  const QuantView* w = nullptr;
  int64_t row_begin = 0;
  int64_t rows = 0;
  float* y = nullptr;
};

// Called while weights are prepared (uploaded): bytes done so far and the total.
using LoadProgressFn = std::function<void(uint64_t done, uint64_t total)>;

// All activations are f32, row-major, in memory the backend allocated (host memory for the
// CPU backend, device memory for CUDA). Weights are the checkpoint views of weights.h; a
// device backend uploads them once (`prepare`) and resolves views to its copies. Every op
// validates its arguments and throws std::invalid_argument for what it cannot serve:
// there are no silent fallbacks. Norm gains named "baked" are the stored zero-centred
// norms with the +1 already in the weight (gain = stored value).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int threads() const = 0;
  // The hardware, for reports: e.g. "AMD EPYC 7B13" or "NVIDIA H200".
  virtual std::string device_name() const = 0;
  // The code paths chosen for this device, for the start-up banner (CUDA: the compute
  // capability, the machine code or PTX it runs, the Hopper-only paths on or off).
  virtual std::string code_path() const { return ""; }

  // Called once with the weights before any op uses them. A device backend uploads them here
  // and reports progress to `progress` (may be empty).
  virtual void prepare(const ModelWeights& weights, const LoadProgressFn& progress) = 0;
  void prepare(const ModelWeights& weights) { prepare(weights, LoadProgressFn()); }
  // The backend's decode plan for the prepared `weights`, or nullptr when it has none (the
  // CPU): the model then runs every step on the ops below.
  virtual std::unique_ptr<DecodePlan> make_decode_plan(const ModelWeights& weights,
                                                       const DecodePlanShape& shape) {
    (void)weights;
    (void)shape;
    return nullptr;
  }
  // Zero-filled f32 buffer of `count` values, owned by the backend until it is destroyed.
  virtual float* alloc(size_t count) = 0;
  virtual int32_t* alloc_i32(size_t count) = 0;
  // KV cache buffers of `count` elements of `dtype` in rows of head_dim, zero-filled, owned
  // by the backend; and their zeroing and host copies (ops in issue order; the host copies
  // wait, as copy_to_host). host_dst / host_src hold kv_cache_bytes(dtype, count, head_dim)
  // bytes: count elements of the dtype (float, uint16_t bf16 bits, int8 codes), for int8
  // followed by the count / head_dim f32 row scales. A backend serves the dtypes
  // serves_kv_cache says and refuses the others with std::invalid_argument; the defaults serve
  // f32 through alloc, zero and the float copies.
  virtual bool serves_kv_cache(KvDtype dtype) const { return dtype == KvDtype::f32; }
  virtual KvCacheView alloc_kv_cache(size_t count, KvDtype dtype, int64_t head_dim);
  virtual void zero_kv_cache(const KvCacheView& cache, size_t count);
  virtual void copy_kv_to_host(const KvCacheView& cache, size_t count, void* host_dst);
  virtual void copy_kv_from_host(const void* host_src, size_t count, const KvCacheView& cache);
  // Ops run in the order they are issued; a device backend may return before they finish.
  // The host copies below wait for the ops before them and for their own transfer.
  virtual void zero(float* buffer, size_t count) = 0;
  virtual void copy_to_host(const float* src, size_t count, float* host_dst) = 0;
  virtual void copy_from_host(const int32_t* host_src, size_t count, int32_t* dst) = 0;
  virtual void copy_from_host(const float* host_src, size_t count, float* dst) = 0;
  virtual void copy_to_host_i32(const int32_t* src, size_t count, int32_t* host_dst) = 0;
  // dst[i] = src[i] for i < count, both in backend memory, not overlapping (an op: call
  // synchronize() to wait for it). Uses the whole device (all threads / SMs): `lily bench`
  // measures copy bandwidth with it.
  virtual void copy(const float* src, size_t count, float* dst) = 0;
  // *value += delta, in op order (a decode step advances its device position with it).
  virtual void add_i32(int32_t* value, int32_t delta) = 0;

  // Asynchronous delivery of one i32 to the host, for the pipelined decode: read_async
  // enqueues the copy of *src into host slot `slot` (0 or 1) behind the ops before it;
  // wait_read blocks until that copy is done and returns the value.
  virtual void read_async(const int32_t* src, int slot) = 0;
  virtual int32_t wait_read(int slot) = 0;
  // Blocks until every op issued so far has finished.
  virtual void synchronize() = 0;
  // Bytes the backend holds in its own memory now: buffers, scratch and (on a device) the
  // uploaded weights. Never shrinks, so after a run it is that run's peak.
  virtual uint64_t allocated_bytes() const = 0;

  // Graph capture: a backend that can record a sequence of ops and replay it (CUDA graphs)
  // returns true from can_capture. Between begin_capture and end_capture ops are recorded,
  // not run; replay(graph) runs the recording again with the same pointers and arguments.
  // Backends without capture throw std::logic_error from the other three.
  virtual bool can_capture() const { return false; }
  virtual void begin_capture();
  virtual int end_capture();
  virtual void replay(int graph);
  // Ends a capture that begin_capture opened and that will not be completed (an op threw
  // while recording), discarding what was recorded, so that the stream runs ops again.
  // Never throws (it runs during unwinding); a capture backend must override it. Use it
  // through CaptureScope (backend/capture_scope.h), not directly.
  virtual void abort_capture() noexcept {}

  // Test only (--test-fault): arms one fault, fired at the given site after `skip` visits.
  void arm_fault(const FaultInjection& fault) { armed_fault_ = fault; has_armed_fault_ = true; }
  // A fault site of the decode path (the model calls it for `step` and `capture`, a capture
  // backend's replay for `replay`). Does nothing unless a fault is armed for this site; then
  // an `error` throws std::runtime_error and a `device` calls lose_device.
  void fault_point(FaultSite site);

  // out[t, :] = dequant(table row ids[t]).            ids [n] i32 < table.rows(); out [n, in]
  virtual void embed(const QuantView& table, const int32_t* ids, int64_t n, float* out) = 0;

  // y[t, r] = sum_c W[row_begin + r, c] x[t, c]        x [n, in], y [n, rows] (Q4 or Q8)
  virtual void matmul(const QuantView& w, int64_t row_begin, int64_t rows, const float* x,
                      int64_t n, float* y) = 0;

  // matmul of one input x [n, in] by several weights: the model's fused projection groups
  // (GDN qkv|z|a|b, attention q|k|v, router|shared-expert gate). Same contract as matmul for
  // each target. A device backend issues a group as one launch where it can, as Lily fuses its
  // decode GEMVs (docs/cuda.md, *What one step launches*); the default runs the targets one
  // after another.
  virtual void matmul_group(std::span<const MatmulTarget> targets, const float* x, int64_t n);
  // out = x / sqrt(mean(x^2) + eps) * gain             x, out [n, dim]; gain BF16 [dim], baked
  virtual void rms_norm(const float* x, const DenseView& gain, int64_t n, int64_t dim, float eps,
                        float* out) = 0;

  // residual += delta; out = rms_norm(residual)        residual, delta, out [n, dim]
  virtual void add_rms_norm(float* residual, const float* delta, const DenseView& gain,
                            int64_t n, int64_t dim, float eps, float* out) = 0;

  // In place on the q_proj output qg [n, q_heads, 2, head_dim] (query then gate per head) and
  // k [n, kv_heads, head_dim]: zero-centred RMSNorm of each query and key head (baked gains
  // [head_dim]), then RoPE at positions start_pos + t.
  virtual void attention_prepare(float* qg, float* k, const DenseView& q_norm,
                                 const DenseView& k_norm, const AttentionDims& dims,
                                 SeqPos start_pos, int64_t n, float eps) = 0;

  // Writes k, v [n, kv_heads, head_dim] f32 into the caches [capacity, kv_heads, head_dim]
  // (both of one dtype; bf16: each value rounded to nearest-even) at rows start_pos.., then
  // causal attention of each query (read from qg) over cache rows 0..start_pos+t as the cache
  // holds them (the new rows too: a bf16 cache's rounded values), scaled by 1/sqrt(head_dim),
  // times sigmoid(gate); f32 arithmetic.  out [n, q_heads*head_dim] f32
  virtual void attention(const float* qg, const float* k, const float* v, KvCacheView k_cache,
                         KvCacheView v_cache, int64_t capacity, const AttentionDims& dims,
                         SeqPos start_pos, int64_t n, float* out) = 0;

  // Causal depthwise conv over time with the cached last K-1 inputs, then SiLU.
  // mixed, out [n, C]; window [K-1, C] (oldest first) is updated; weight BF16 [C, K] taps
  // (tap K-1 multiplies the current token).
  virtual void conv1d_silu(const float* mixed, float* window, const DenseView& weight,
                           const GatedDeltaNetDims& dims, int64_t n, float* out) = 0;

  // Gated delta rule over n tokens, sequentially, from conv output [n, C] = q | k | v.
  // beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); q, k L2-normalised, q / sqrt(Dk);
  // per value head: S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q.
  // a, b [n, value_heads]; state [value_heads, key_dim, value_dim] f32; out [n, value_heads, value_dim]
  virtual void gated_delta_rule(const float* conv, const float* a, const float* b,
                                const DenseView& a_log, const DenseView& dt_bias, float* state,
                                const GatedDeltaNetDims& dims, int64_t n, float* out) = 0;

  // The Gated DeltaNet mixer after its input projections, for n tokens: conv1d_silu(mixed,
  // window) -> conv_out, gated_delta_rule(conv_out, a, b, state) -> core_out, then
  // gated_rms_norm(core_out, z, w.norm) -> normed, then w.out_proj times normed -> y (the
  // norm per value head: rows = n * value_heads of value_dim). Buffers as for those ops:
  // mixed [n, C], z [n, Hv * Dv], a, b [n, Hv], window and state updated, y [n, H]; conv_out,
  // core_out and normed are scratch that a backend fusing the ops may leave unwritten (the
  // CUDA backend leaves conv_out unwritten for n == 1). The default runs the four ops.
  virtual void gated_delta_net_mixer(const GatedDeltaNetWeights& w, const GatedDeltaNetDims& dims,
                                     float eps, const float* mixed, const float* z,
                                     const float* a, const float* b, float* window, float* state,
                                     int64_t n, float* conv_out, float* core_out, float* normed,
                                     float* y);
  // out = rms_norm(x per head) * gain * silu(z)        x, z, out [rows, dim]; gain [dim] plain
  virtual void gated_rms_norm(const float* x, const float* z, const DenseView& gain,
                              int64_t rows, int64_t dim, float eps, float* out) = 0;

  // softmax over E logits, top-k (ties: lower expert id first), weights renormalised to sum 1.
  // logits [n, E]; ids [n, k] i32; weights [n, k]
  virtual void moe_route(const float* logits, int64_t n, int64_t experts, int64_t k, int32_t* ids,
                         float* weights) = 0;

  // h[t, j, :] = silu(G_e x[t]) * U_e x[t] with e = ids[t, j] (rows e*I .. e*I+I of the
  // stacked gate/up weights).  x [n, in]; ids [n, k] (nullptr: expert 0); h [n, k, I]
  virtual void expert_swiglu(const QuantView& gate, const QuantView& up, const float* x,
                             const int32_t* ids, int64_t n, int64_t k, float* h) = 0;

  // expert_swiglu of the routed experts (gate, up, ids, k -> h) and of the shared expert
  // (shared_gate, shared_up, k = 1 -> shared_h [n, S]) on the same x [n, in]. A device
  // backend computes both in one launch where it can; the default runs the two in turn.
  virtual void expert_swiglu_with_shared(const QuantView& gate, const QuantView& up,
                                         const int32_t* ids, int64_t k, float* h,
                                         const QuantView& shared_gate,
                                         const QuantView& shared_up, float* shared_h,
                                         const float* x, int64_t n);
  // moe_route(router_logits [n, experts] -> ids, weights [n, k]) followed by
  // expert_swiglu_with_shared with those ids: the MoE block up to the down projection. A
  // device backend routes inside the SwiGLU launch where it can; the default runs the two ops.
  // next_down (may be nullptr) is the stacked down projection that will read h next: a hint
  // only (a device backend may start fetching the chosen experts' rows); results do not change.
  virtual void route_expert_swiglu(const float* router_logits, int64_t experts, int64_t k,
                                   int32_t* ids, float* weights, const QuantView& gate,
                                   const QuantView& up, float* h, const QuantView& shared_gate,
                                   const QuantView& shared_up, float* shared_h, const float* x,
                                   int64_t n, const QuantView* next_down);
  // out[t] = sum_j weights[t, j] D_{ids[t,j]} h[t, j] + sigmoid(shared_logit[t]) D_s shared_h[t]
  // h [n, k, I]; shared_h [n, S]; shared_logit [n]; out [n, H]
  virtual void expert_down_combine(const QuantView& down, const float* h, const int32_t* ids,
                                   const float* weights, int64_t n, int64_t k,
                                   const QuantView& shared_down, const float* shared_h,
                                   const float* shared_logit, float* out) = 0;

  // out[t] = index of the largest logit (lowest index on ties).  logits [n, V]; out [n]
  virtual void argmax(const float* logits, int64_t n, int64_t vocab, int32_t* out) = 0;

  // One token drawn from one row of logits by the stages of SamplerParams (sampling.h, in
  // that order), reading the parameters, counts, prompt_seen and step from `sampler`; then
  // counts[token] += 1 and step += 1, and *token_out = the token.   logits [vocab] f32
  // (left unchanged); token_out [1] i32. Deterministic: the same logits, buffers and step give
  // the same token on every run and on every backend (sampling.h: the stages are exact f32
  // and integer arithmetic). vocab in [1, kMaxSamplerVocab]. The parameters must pass
  // sampler_params_error: the CPU checks them (std::invalid_argument); a device backend reads
  // them where it cannot check them, so the host checks them before it uploads them.
  virtual void sample(const float* logits, int64_t vocab, const SamplerBuffers& sampler,
                      int32_t* token_out) = 0;

  // The log-probabilities of one step for the API's logprobs (TokenRecordLayout): log_softmax
  // of the raw logits at *token, and the n = top_logprobs (from sampler.params; -1 counts as 0;
  // at most vocab) largest logits' ids and log-probabilities, the unused slots 0. NaN logits
  // count as -inf and +inf as FLT_MAX, as for sample. logits [vocab] f32; token [1] i32 <
  // vocab; record [TokenRecordLayout::kWords] i32. Only sampler.params is read.
  virtual void token_logprobs(const float* logits, int64_t vocab, const int32_t* token,
                              const SamplerBuffers& sampler, int32_t* record) = 0;

  // Asynchronous delivery of `count` i32 (at most TokenRecordLayout::kWords) to host slot
  // `slot` (0 or 1), like read_async; wait_read_words blocks until that copy is done and
  // returns the slot's words (valid until the slot is used again).
  virtual void read_words_async(const int32_t* src, int64_t count, int slot) = 0;
  virtual const int32_t* wait_read_words(int slot) = 0;

 protected:
  // A `device` fault at `site` (test only): the default throws DeviceFault; a device backend
  // overrides it to poison its context for real.
  virtual void lose_device(FaultSite site);

 private:
  FaultInjection armed_fault_;
  bool has_armed_fault_ = false;
};

// How the CPU backend computes its quantized matrix products, decode and prefill (--cpu-precision;
// docs/precision.md). exact: f32 on the dequantised codes, the reference path. fast: the input
// quantised per group of 64 in two int8 planes and integer dot products against the codes (AVX-512
// VNNI, AVX-VNNI or AVX2: backend/cpu/int8_dot.h), about 5e-5 relative per dot; the prefill's
// products bit for bit the decode's. q8: the same integer dots on one int8 plane (llama.cpp's Q8
// activations): half the integer work, about 4e-3 relative per dot.
enum class CpuPrecision { exact, fast, q8 };
const char* cpu_precision_name(CpuPrecision precision);
// The int8 planes a precision quantises activations into: 0 (exact: none), 2 (fast), 1 (q8).
int cpu_precision_planes(CpuPrecision precision);

// The CPU backend (src/backend/cpu). threads = 0: all cores.
std::unique_ptr<Backend> make_cpu_backend(int threads, CpuPrecision precision = CpuPrecision::exact);

// The CUDA backend (src/backend/cuda) on device 0, with the code paths `options` allows
// (backend/cuda/cuda_options.h). Throws std::runtime_error naming the reason when CUDA is
// unusable: built without CUDA, no device or driver, compute capability below 8.0, or less
// free device memory than `required_bytes` (weights + state + scratch).
std::unique_ptr<Backend> make_cuda_backend(uint64_t required_bytes, const CudaOptions& options);

// Whether make_cuda_backend could succeed (ignoring memory); `why` gets the reason if not.
bool cuda_available(std::string* why);

}  // namespace lily

// The CUDA backend: device memory, weight upload, op dispatch to the kernels, graph capture.
#pragma once

#include <cuda_runtime.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_options.h"
#include "backend/cuda/launch_order.h"

namespace lily {

// Grow-only scratch (see cuda::Workspace): old buffers stay alive for graphs that use them.
class CudaWorkspace final : public cuda::Workspace {
 public:
  explicit CudaWorkspace(cudaStream_t stream) : stream_(stream) {}
  ~CudaWorkspace() override;
  void* get(int slot, size_t bytes) override;
  uint64_t bytes() const { return bytes_; }

 private:
  cudaStream_t stream_;
  struct Slot {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  Slot slots_[cuda::kWsCount];
  std::vector<void*> retired_;
  uint64_t bytes_ = 0;  // every buffer, retired ones included
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  int threads() const override { return 1; }  // one stream; the SMs are not threads to set
  std::string device_name() const override { return device_name_; }
  using Backend::prepare;
  void prepare(const ModelWeights& weights, const LoadProgressFn& progress) override;
  float* alloc(size_t count) override;
  int32_t* alloc_i32(size_t count) override;
  // f32 and bf16 KV caches (bf16: 2 bytes per element, 16-byte loads of 8 in the kernels).
  bool serves_kv_cache(KvDtype dtype) const override;
  KvCacheView alloc_kv_cache(size_t count, KvDtype dtype, int64_t head_dim) override;
  void zero_kv_cache(const KvCacheView& cache, size_t count) override;
  void copy_kv_to_host(const KvCacheView& cache, size_t count, void* host_dst) override;
  void copy_kv_from_host(const void* host_src, size_t count, const KvCacheView& cache) override;
  void zero(float* buffer, size_t count) override;
  void copy_to_host(const float* src, size_t count, float* host_dst) override;
  void copy_from_host(const int32_t* host_src, size_t count, int32_t* dst) override;
  void copy_from_host(const float* host_src, size_t count, float* dst) override;
  void copy_to_host_i32(const int32_t* src, size_t count, int32_t* host_dst) override;
  void copy(const float* src, size_t count, float* dst) override;
  void add_i32(int32_t* value, int32_t delta) override;
  void read_async(const int32_t* src, int slot) override;
  int32_t wait_read(int slot) override;
  void synchronize() override;
  uint64_t allocated_bytes() const override;
  bool can_capture() const override { return true; }
  void begin_capture() override;
  int end_capture() override;
  void replay(int graph) override;
  void abort_capture() noexcept override;
  std::string code_path() const override;
  std::unique_ptr<DecodePlan> make_decode_plan(const ModelWeights& weights,
                                               const DecodePlanShape& shape) override;

  void embed(const QuantView& table, const int32_t* ids, int64_t n, float* out) override;
  void matmul(const QuantView& w, int64_t row_begin, int64_t rows, const float* x, int64_t n,
              float* y) override;
  void matmul_group(std::span<const MatmulTarget> targets, const float* x, int64_t n) override;
  void gated_delta_net_mixer(const GatedDeltaNetWeights& w, const GatedDeltaNetDims& dims,
                             float eps, const float* mixed, const float* z, const float* a,
                             const float* b, float* window, float* state, int64_t n,
                             float* conv_out, float* core_out, float* normed, float* y) override;
  void rms_norm(const float* x, const DenseView& gain, int64_t n, int64_t dim, float eps,
                float* out) override;
  void add_rms_norm(float* residual, const float* delta, const DenseView& gain, int64_t n,
                    int64_t dim, float eps, float* out) override;
  void attention_prepare(float* qg, float* k, const DenseView& q_norm, const DenseView& k_norm,
                         const AttentionDims& dims, SeqPos start_pos, int64_t n,
                         float eps) override;
  void attention(const float* qg, const float* k, const float* v, KvCacheView k_cache,
                 KvCacheView v_cache, int64_t capacity, const AttentionDims& dims,
                 SeqPos start_pos, int64_t n, float* out) override;
  void conv1d_silu(const float* mixed, float* window, const DenseView& weight,
                   const GatedDeltaNetDims& dims, int64_t n, float* out) override;
  void gated_delta_rule(const float* conv, const float* a, const float* b, const DenseView& a_log,
                        const DenseView& dt_bias, float* state, const GatedDeltaNetDims& dims,
                        int64_t n, float* out) override;
  void gated_rms_norm(const float* x, const float* z, const DenseView& gain, int64_t rows,
                      int64_t dim, float eps, float* out) override;
  void moe_route(const float* logits, int64_t n, int64_t experts, int64_t k, int32_t* ids,
                 float* weights) override;
  void expert_swiglu(const QuantView& gate, const QuantView& up, const float* x,
                     const int32_t* ids, int64_t n, int64_t k, float* h) override;
  void expert_swiglu_with_shared(const QuantView& gate, const QuantView& up, const int32_t* ids,
                                 int64_t k, float* h, const QuantView& shared_gate,
                                 const QuantView& shared_up, float* shared_h, const float* x,
                                 int64_t n) override;
  void route_expert_swiglu(const float* router_logits, int64_t experts, int64_t k, int32_t* ids,
                           float* weights, const QuantView& gate, const QuantView& up, float* h,
                           const QuantView& shared_gate, const QuantView& shared_up,
                           float* shared_h, const float* x, int64_t n,
                           const QuantView* next_down) override;
  void expert_down_combine(const QuantView& down, const float* h, const int32_t* ids,
                           const float* weights, int64_t n, int64_t k,
                           const QuantView& shared_down, const float* shared_h,
                           const float* shared_logit, float* out) override;
  void argmax(const float* logits, int64_t n, int64_t vocab, int32_t* out) override;
  void sample(const float* logits, int64_t vocab, const SamplerBuffers& sampler,
              int32_t* token_out) override;
  void token_logprobs(const float* logits, int64_t vocab, const int32_t* token,
                      const SamplerBuffers& sampler, int32_t* record) override;
  void read_words_async(const int32_t* src, int64_t count, int slot) override;
  const int32_t* wait_read_words(int slot) override;

  // Free and total device memory in bytes, now.
  void memory_info(size_t* free_bytes, size_t* total_bytes) const;
  // The options it was built with, and how often each kernel path ran (cuda_options.h).
  const CudaOptions& options() const { return options_; }
  const CudaPathCounts& path_counts() const { return counts_; }

 private:
  friend class CudaDecodePlan;  // resolves weights and allocates through the backend
  // The device copy of a weight, uploaded on first use (prepare uploads the model's). Not
  // during graph capture: device_alloc refuses then.
  const cuda::QuantMatrix& quant(const QuantView& view);
  const float* dense(const DenseView& view);
  // Host-to-device copy of a weight's bytes, ordered on stream_ and finished on return.
  void upload_weight(void* dst, const void* host_src, size_t bytes);
  // Validates every target of a projection group and resolves it into `batch`; returns
  // whether the group fits one batched GEMV launch (n <= kGemvMaxTokens, at most
  // kMaxGemvTargets weights, one bit width and input width).
  bool resolve_group(std::span<const MatmulTarget> targets, const float* x, int64_t n,
                     const char* op, cuda::GemvTarget (&batch)[cuda::kMaxGemvTargets]);
  // Checks a SwiGLU step's arguments as the two expert_swiglu calls would (the routed
  // experts, the shared one) and resolves the matrices. `fits` says whether one fused launch
  // takes them (n <= kGemvMaxTokens, ids given, shared widths equal to the routed ones).
  struct SwigluMatrices {
    const cuda::QuantMatrix* gate;
    const cuda::QuantMatrix* up;
    const cuda::QuantMatrix* shared_gate;
    const cuda::QuantMatrix* shared_up;
    bool fits;
  };
  SwigluMatrices resolve_swiglu(const QuantView& gate, const QuantView& up,
                                const QuantView& shared_gate, const QuantView& shared_up,
                                const float* x, const int32_t* ids, int64_t k, float* h,
                                float* shared_h, int64_t n, const char* op);
  void lose_device(FaultSite site) override;
  bool capturing() const;
  void* device_alloc(size_t bytes);
  // options_.fused_conv: gated_delta_net_mixer with n == 1 runs the conv inside the delta
  // rule's launch and shifts the window in the output projection's (cuda::gated_delta_step,
  // cuda::WindowShift): one launch fewer per Gated DeltaNet layer.
  CudaOptions options_;
  CudaPathCounts counts_;  // counted at dispatch (cuda_options.h): eager and recorded calls
  // The stream's operations in issue order, and which of them wrote an input that a later
  // kernel reads before its dependency wait (launch_order.h): checked at dispatch, so in eager
  // calls and while a graph is recorded alike.
  cuda::LaunchOrder order_;
  cudaStream_t stream_ = nullptr;
  // What the kernels launch on: stream_, PDL on where options_.pdl and the code allow it.
  cuda::Stream launch_;
  // The bulk-copy lm_head GEMV: on where options_.stream_gemv and the device allow it.
  cuda::StreamGemvConfig stream_gemv_;
  // The fused mixer's gated norm inside its delta rule launch (cuda::DeltaGatedNorm): where
  // options_.fused_conv and the device and code allow thread-block clusters (9.0).
  bool gated_norm_in_delta_ = false;
  std::string device_name_;
  // The device's compute capability and the code it runs (major * 10 + minor each): the
  // machine code's architecture and the PTX it came from (lower when JIT-compiled).
  int compute_capability_ = 0;
  int code_binary_version_ = 0;
  int code_ptx_version_ = 0;
  std::unique_ptr<CudaWorkspace> workspace_;
  std::map<std::string, cuda::QuantMatrix> quant_;  // by weight_key (cuda_backend.cu)
  std::map<std::string, const float*> dense_;
  std::vector<void*> allocations_;
  uint64_t allocated_ = 0;  // bytes in allocations_
  std::vector<cudaGraphExec_t> graphs_;
  cudaGraph_t capture_ = nullptr;
  int32_t* pinned_reads_ = nullptr;  // [2] pinned host i32, the read_async slots
  cudaEvent_t read_events_[2] = {nullptr, nullptr};
  // The sampler ops' zero-initialised device state (cuda::sampler_state_bytes, in
  // allocations_), allocated by the first sample or token_logprobs call (not during capture).
  void* sampler_state_ = nullptr;
  // [2][TokenRecordLayout::kWords] pinned host i32, the read_words_async slots, and their events.
  int32_t* pinned_words_ = nullptr;
  cudaEvent_t word_events_[2] = {nullptr, nullptr};
};

}  // namespace lily

// The CPU backend: every backend op on host memory, multithreaded over rows and heads.
#pragma once

#include <deque>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"

namespace lily {

// Not final: tests derive probes from it (e.g. to observe routing margins).
class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(threads) {}

  std::string name() const override { return "cpu"; }
  int threads() const override { return pool_.size(); }
  std::string device_name() const override;
  using Backend::prepare;
  void prepare(const ModelWeights& weights, const LoadProgressFn& progress) override;
  float* alloc(size_t count) override;
  int32_t* alloc_i32(size_t count) override;
  void zero(float* buffer, size_t count) override;
  void copy_to_host(const float* src, size_t count, float* host_dst) override;
  void copy_from_host(const int32_t* host_src, size_t count, int32_t* dst) override;
  void copy_from_host(const float* host_src, size_t count, float* dst) override;
  void copy_to_host_i32(const int32_t* src, size_t count, int32_t* host_dst) override;
  void copy(const float* src, size_t count, float* dst) override;
  void add_i32(int32_t* value, int32_t delta) override { *value += delta; }
  // Ops run on submit, so a read is done when it is enqueued.
  void read_async(const int32_t* src, int slot) override;
  int32_t wait_read(int slot) override;
  void synchronize() override {}
  uint64_t allocated_bytes() const override;

  void embed(const QuantView& table, const int32_t* ids, int64_t n, float* out) override;
  void matmul(const QuantView& w, int64_t row_begin, int64_t rows, const float* x, int64_t n,
              float* y) override;
  void rms_norm(const float* x, const DenseView& gain, int64_t n, int64_t dim, float eps,
                float* out) override;
  void add_rms_norm(float* residual, const float* delta, const DenseView& gain, int64_t n,
                    int64_t dim, float eps, float* out) override;
  void attention_prepare(float* qg, float* k, const DenseView& q_norm, const DenseView& k_norm,
                         const AttentionDims& dims, SeqPos start_pos, int64_t n,
                         float eps) override;
  void attention(const float* qg, const float* k, const float* v, float* k_cache, float* v_cache,
                 int64_t capacity, const AttentionDims& dims, SeqPos start_pos, int64_t n,
                 float* out) override;
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
  void expert_down_combine(const QuantView& down, const float* h, const int32_t* ids,
                           const float* weights, int64_t n, int64_t k,
                           const QuantView& shared_down, const float* shared_h,
                           const float* shared_logit, float* out) override;
  void argmax(const float* logits, int64_t n, int64_t vocab, int32_t* out) override;

 private:
  // Scratch that only grows: after the first step of a shape nothing is allocated per call.
  enum ScratchSlot { kSumsA, kSumsB, kPermutedA, kPermutedB, kProbs, kSlotCount };
  float* scratch(ScratchSlot slot, size_t count);

  ThreadPool pool_;
  std::vector<float> scratch_[kSlotCount];
  std::vector<int32_t> order_;
  int32_t reads_[2] = {0, 0};
  std::deque<std::vector<float>> buffers_;
  std::deque<std::vector<int32_t>> int_buffers_;
};

}  // namespace lily

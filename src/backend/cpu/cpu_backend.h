// The CPU backend: every backend op on host memory, multithreaded over rows and heads.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/int8_dot.h"
#include "backend/cpu/thread_pool.h"

namespace lily {

namespace cpu {

// The CPU sampler's grow-only work buffers (src/backend/cpu/sampler.cpp).
struct SamplerWork {
  std::vector<float> processed;     // [vocab] logits after stages 1-3
  std::vector<float> block_max;     // [vocab / 64] max of each 64-id block of `processed`
  std::vector<float> order_scratch; // [vocab / 64] for the k-th largest block max
  std::vector<uint64_t> mass;       // [vocab] q of the ids in candidate blocks (general path)
  std::vector<int32_t> blocks;      // the blocks that can hold a positive mass (candidates)
  std::vector<uint64_t> block_sums; // [blocks] per candidate block: drawable mass
  std::vector<uint64_t> block_z;    // [vocab / 64] per block: sum of q
  std::vector<uint64_t> block_drawable;  // [vocab / 64] per block: sum of q >= q_min
  std::vector<uint64_t> block_positive;  // [vocab / 64] per block: ids with q > 0
  std::vector<double> block_exp;    // [vocab / 64] token_logprobs: per block sum of e^(l - M)
  std::vector<uint64_t> items;      // rank keys (top-k path: its candidates; select scratch)
  std::vector<uint64_t> item_mass;  // their q (or 1 for a count)
  std::vector<uint64_t> items_b;    // select scratch
  std::vector<uint64_t> item_mass_b;
  std::vector<std::pair<int32_t, uint64_t>> picked;  // top-k path: survivors (id, q)
};

// How sample_row finds the cuts. automatic: the top-k path for top_k <= kSamplerSmallK, else
// the general path, which tries a top_p cut among the kSamplerList first ids before it selects
// over mass bands. Tests force the slower ways to check that every way gives the same draw.
enum class SamplerPath { automatic, general, bands };

// What one draw decided, for tests (filled when sample_row gets one).
struct SamplerTrace {
  bool greedy = false;   // stage 4 (T == 0 or every processed logit -inf)
  bool fast_path = false;  // the top-k path (k <= kSamplerSmallK) rather than the general one
  bool list_cut = false;   // the general path found the top_p cut among its first ids
  uint64_t cut = 0;      // rank_key of the last survivor of stages 5 and 7 (0: none cut)
  uint64_t z = 0;        // the mass of stage 5's survivors
  std::vector<int32_t> survivors;  // stage 9's candidates with q > 0, id order
  std::vector<uint64_t> masses;    // their q
  int32_t token = -1;
};

// top_k up to this takes the top-k path: only the k largest logits get a mass.
inline constexpr int64_t kSamplerSmallK = 1024;
// The general path's first ids for a top_p cut before it selects over mass bands.
inline constexpr int64_t kSamplerList = 256;

// One draw of Backend::sample over host arrays, without the counts/step update: the token for
// draw number `step`. Parameters must be valid (sampler_params_error). With a pool, the passes over the vocabulary are split over its threads (the
// result does not depend on it).
int32_t sample_row(const float* logits, int64_t vocab, const SamplerParams& params,
                   const int32_t* counts, const int32_t* prompt_seen, uint32_t step,
                   SamplerWork& work, SamplerTrace* trace = nullptr,
                   SamplerPath path = SamplerPath::automatic, ThreadPool* pool = nullptr);

// Backend::token_logprobs over host arrays: fills record [TokenRecordLayout::kWords].
void token_logprobs_row(const float* logits, int64_t vocab, int32_t token, int top_n,
                        SamplerWork& work, int32_t* record, ThreadPool* pool = nullptr);

}  // namespace cpu

// Not final: tests derive probes from it (e.g. to observe routing margins).
class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int threads, CpuPrecision precision = CpuPrecision::exact)
      : pool_(threads), precision_(precision) {}

  std::string name() const override { return "cpu"; }
  // Which matrix-product path runs (--cpu-precision), and on which instructions.
  std::string code_path() const override;
  CpuPrecision precision() const { return precision_; }
  // The thread pool's barriers so far (ThreadPool::barriers): the tests of the one-barrier decode
  // ops assert with it that the merged path ran.
  uint64_t pool_barriers() const { return pool_.barriers(); }
  int threads() const override { return pool_.size(); }
  std::string device_name() const override;
  using Backend::prepare;
  void prepare(const ModelWeights& weights, const LoadProgressFn& progress) override;
  float* alloc(size_t count) override;
  int32_t* alloc_i32(size_t count) override;
  // KV caches of every dtype (--kv-cache): f32 buffers as alloc; bf16 bit patterns (uint16_t,
  // core/bf16.h), which attention rounds to nearest-even when it writes a row and widens
  // exactly to f32 when it reads one; int8 codes and f32 row scales, which attention
  // quantises (quantize_kv_row) when it writes a row and reads as code * scale
  // (attention.cpp).
  bool serves_kv_cache(KvDtype dtype) const override {
    return dtype == KvDtype::f32 || dtype == KvDtype::bf16 || dtype == KvDtype::int8;
  }
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
  void add_i32(int32_t* value, int32_t delta) override { *value += delta; }
  // Ops run on submit, so a read is done when it is enqueued.
  void read_async(const int32_t* src, int slot) override;
  int32_t wait_read(int slot) override;
  void synchronize() override {}
  uint64_t allocated_bytes() const override;

  void embed(const QuantView& table, const int32_t* ids, int64_t n, float* out) override;
  void matmul(const QuantView& w, int64_t row_begin, int64_t rows, const float* x, int64_t n,
              float* y) override;
  // One token: the input prepared once and every target's rows in one parallel_for (one pool
  // barrier per group, not one per target); otherwise the targets in turn. Same bits either way.
  void matmul_group(std::span<const MatmulTarget> targets, const float* x, int64_t n) override;
  void rms_norm(const float* x, const DenseView& gain, int64_t n, int64_t dim, float eps,
                float* out) override;
  void add_rms_norm(float* residual, const float* delta, const DenseView& gain, int64_t n,
                    int64_t dim, float eps, float* out) override;
  void attention_prepare(float* qg, float* k, const DenseView& q_norm, const DenseView& k_norm,
                         const AttentionDims& dims, SeqPos start_pos, int64_t n,
                         float eps) override;
  void attention(const float* qg, const float* k, const float* v, KvCacheView k_view,
                 KvCacheView v_view, int64_t capacity, const AttentionDims& dims,
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
  // One token: the routed and the shared expert's rows in one parallel_for on one prepared
  // input; otherwise the two expert_swiglu calls. Same bits either way.
  void expert_swiglu_with_shared(const QuantView& gate, const QuantView& up, const int32_t* ids,
                                 int64_t k, float* h, const QuantView& shared_gate,
                                 const QuantView& shared_up, float* shared_h, const float* x,
                                 int64_t n) override;
  void expert_down_combine(const QuantView& down, const float* h, const int32_t* ids,
                           const float* weights, int64_t n, int64_t k,
                           const QuantView& shared_down, const float* shared_h,
                           const float* shared_logit, float* out) override;
  void argmax(const float* logits, int64_t n, int64_t vocab, int32_t* out) override;
  void sample(const float* logits, int64_t vocab, const SamplerBuffers& sampler,
              int32_t* token_out) override;
  void token_logprobs(const float* logits, int64_t vocab, const int32_t* token,
                      const SamplerBuffers& sampler, int32_t* record) override;
  // Ops run on submit: the words are copied when the read is enqueued.
  void read_words_async(const int32_t* src, int64_t count, int slot) override;
  const int32_t* wait_read_words(int slot) override;

 private:
  // Scratch that only grows: after the first step of a shape nothing is allocated per call.
  enum ScratchSlot { kProbs, kSlotCount };
  float* scratch(ScratchSlot slot, size_t count);

  // One token's input to the one-token GEMVs, prepared once per op call for the precision:
  // exact: the permuted copy [in] f32 and the group sums [in / 64] f32 (quant_matmul.cpp);
  // fast and q8: the int8 quantisation in two or one planes (cpu/int8_dot.h). Reused: nothing is
  // allocated per call once a shape has been seen.
  struct DecodeInput {
    bool fast = false;
    std::vector<float> permuted;
    std::vector<float> sums;
    cpu::Q8Activations q8;
    void prepare(const float* x, int64_t in, int planes);  // planes: planes_for(w); 0 = f32
    float dot(const QuantView& w, int64_t row) const;  // sum_c W[row, c] x[c]
    // y[r] = dot(w, row_begin + r) for r in [0, rows): y f32 [rows]. One call streams the rows
    // in order (the fast path's int8_rows_dot checks the range once).
    void dots(const QuantView& w, int64_t row_begin, int64_t rows, float* y) const;
  };
  // The index-th input of an op (expert_down_combine prepares k + 1); grows on demand.
  DecodeInput& decode_input(size_t index);

  // Prefill (n > 1) with --cpu-precision fast or q8: quantises the count rows of x [count, in]
  // (f32) into prefill_q8_[first, first + count), over the pool, and returns their pointers
  // (prefill_ptrs_ + first, valid until the next call). A non-finite element is an
  // std::invalid_argument naming op and the row.
  const cpu::Q8Activations* const* quantize_tokens(const float* x, int64_t count, int64_t in,
                                                   size_t first, int planes, const char* op);

  // The int8 planes the input of w is quantised into: 0 for exact (f32), 2 for fast; for q8,
  // 1, except 2 for 8-bit weights (the router and the shared expert's gate in this model:
  // the expert choice is discontinuous, and their products are a few percent of a token's).
  int planes_for(const QuantView& w) const {
    const int planes = cpu_precision_planes(precision_);
    return planes == 1 && w.bits == 8 ? 2 : planes;
  }

  ThreadPool pool_;
  CpuPrecision precision_;
  std::deque<DecodeInput> decode_inputs_;
  // Grow-only: one quantised token per row of a prefill op's inputs (expert_down_combine: the
  // n * k routed slots, then the n shared rows), and pointers to them.
  std::vector<cpu::Q8Activations> prefill_q8_;
  std::vector<const cpu::Q8Activations*> prefill_ptrs_;
  std::vector<const cpu::Q8Activations*> expert_ptrs_;  // the MoE's token lists, grouped by expert
  std::vector<float> scratch_[kSlotCount];
  std::vector<int32_t> order_;
  int32_t reads_[2] = {0, 0};
  int32_t word_reads_[2][TokenRecordLayout::kWords] = {};
  cpu::SamplerWork sampler_work_;
  std::deque<std::vector<float>> buffers_;
  std::deque<std::vector<int32_t>> int_buffers_;
  std::deque<std::vector<uint16_t>> bf16_kv_buffers_;  // the bf16 KV caches
  std::deque<std::vector<int8_t>> int8_kv_buffers_;    // the int8 KV caches' codes (scales: buffers_)
};

}  // namespace lily

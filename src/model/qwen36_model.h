// The Qwen3.6-35B-A3B forward graph, written once against the backend ops.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "model/decode_state.h"

namespace lily {

// How a step's token is chosen from its logits, and what the host reads back.
struct TokenChoice {
  // null: the argmax of the raw logits (Backend::argmax). Otherwise Backend::sample with these
  // buffers (their params, counts and step, uploaded by the caller before the first token).
  const SamplerBuffers* sampler = nullptr;
  // Also compute the token's record (Backend::token_logprobs, top_logprobs from
  // logprob_params->params) and read it back with the token. Needs logprob_params.
  bool logprobs = false;
  const SamplerBuffers* logprob_params = nullptr;
};

// Runs prompts (prefill, in chunks) and single decode steps over a DecodeState. Scratch is
// sized once for `chunk` tokens at construction; forward() allocates nothing.
class Qwen36Model {
 public:
  // `progress` sees the weight upload of a device backend (Backend::prepare).
  Qwen36Model(const Checkpoint& checkpoint, Backend& backend, int64_t chunk = 256,
              const LoadProgressFn& progress = LoadProgressFn());

  const ModelShape& shape() const { return shape_; }
  Backend& backend() { return backend_; }
  int64_t chunk() const { return chunk_; }
  // Which decode path runs (the backend's plan, or the ops), for the start-up line.
  std::string decode_path() const;
  // The backend's decode plan; nullptr when every step runs on the ops.
  const DecodePlan* decode_plan() const { return plan_.get(); }

  // Feeds `tokens` (ids < vocab) at state.position.., in chunks; leaves the logits of the last
  // token in logits() and the argmax in next_token(). Throws std::invalid_argument if the
  // tokens do not fit the state's capacity or an id is out of range.
  void forward(DecodeState& state, std::span<const int32_t> tokens);
  // The same with the last token chosen by `choice` (see submit_prefill).
  void forward(DecodeState& state, std::span<const int32_t> tokens, const TokenChoice& choice);

  // Last-token logits [vocab] f32 in backend memory, and its argmax [1] i32.
  const float* logits() const { return logits_; }
  const int32_t* next_token() const { return next_token_; }
  void logits_to_host(std::vector<float>& out);
  int32_t next_token_to_host();

  // Depth-2 pipelined decode, the way `lily bench` and the generator drive the model: a step feeds the token the
  // submit just before it produced, which stays in backend memory (ids_[0]), so the host does
  // not have to read it first; each submit also starts an asynchronous copy of its token into
  // host slot `to_slot` (0 or 1), read with wait_token. submit_decode's from_slot must be the
  // previous submit's to_slot (std::logic_error otherwise, e.g. after a forward). On a synchronous
  // backend (the CPU) every submit runs to completion before it returns. On a backend that
  // captures graphs, a state's first decode step runs op by op (sizing every scratch buffer),
  // the second is captured as a graph, and every later step replays it: token id and position
  // are read from device memory, so nothing of the step passes through the host.
  // `choice` picks how each token is chosen (argmax when default) and whether its logprob
  // record is read back too (then wait_record returns it after wait_token). A decode graph is
  // captured per (state, choice), so changing the choice between requests is allowed.
  void submit_prefill(DecodeState& state, std::span<const int32_t> prompt, int to_slot,
                      const TokenChoice& choice = {});
  void submit_decode(DecodeState& state, int from_slot, int to_slot,
                     const TokenChoice& choice = {});
  int32_t wait_token(int slot);
  // The record (TokenRecordLayout words) of the token wait_token(slot) just returned, when its
  // submit asked for logprobs; nullptr otherwise. Valid until the slot is submitted again.
  const int32_t* wait_record(int slot) const;

 private:
  void run_chunk(DecodeState& state, const int32_t* host_ids, int64_t n, bool last_chunk,
                 const TokenChoice& choice);
  // One token already in ids_[0] -> logits_, next_token_; advances the position (host and
  // device). Replays the state's captured graph where the backend can.
  void decode_step(DecodeState& state, const TokenChoice& choice);
  // The body of a decode step, with positions read from the device.
  // `site`: the test-only fault site of these ops (capture while recording a graph).
  void decode_step_ops(DecodeState& state, const TokenChoice& choice,
                       FaultSite site = FaultSite::step);
  // Embedding, the 40 layers and the final norm for n tokens at `pos` (normed_ holds the result).
  void layers_forward(DecodeState& state, SeqPos pos, int64_t n);
  void head(int64_t n, const TokenChoice& choice);
  // Starts the copy of the chosen token (or its record) into host slot `to_slot`.
  void read_back(const TokenChoice& choice, int to_slot);
  void sync_device_position(DecodeState& state);
  // The projections that read normed_: matmul_group on normed_, after residual_ += delta_ and
  // normed_ = rms_norm(residual_) * pending_norm when pending_norm is set.
  void project(std::span<const MatmulTarget> targets, int64_t n, const DenseView* pending_norm);
  void delta_net_mixer(const LayerWeights& layer, DecodeState::DeltaNetState& s, int64_t n,
                       const DenseView* pending_norm);
  void attention_mixer(const LayerWeights& layer, DecodeState::AttentionCache& cache,
                       int64_t capacity, SeqPos start_pos, int64_t n,
                       const DenseView* pending_norm);
  // Layer `index`'s MoE block: the decode plan's fused kernel for one token where it has one,
  // else the ops.
  void moe(size_t index, int64_t n, const DenseView* pending_norm);

  const ModelWeights& weights_;
  ModelShape shape_;
  Backend& backend_;
  int64_t chunk_;
  float eps_;
  AttentionDims attn_dims_;
  GatedDeltaNetDims gdn_dims_;

  // Scratch, [chunk, ...] each (see the constructor for the shapes).
  int32_t* ids_;
  float* residual_;
  float* normed_;
  float* delta_;
  float* mixed_;
  float* z_;
  float* a_;
  float* b_;
  float* conv_out_;
  float* gdn_out_;
  float* gdn_normed_;
  float* qg_;
  float* k_;
  float* v_;
  float* attn_out_;
  float* router_logits_;
  int32_t* expert_ids_;
  float* expert_weights_;
  float* expert_h_;
  float* shared_h_;
  float* shared_logit_;
  float* logits_;
  int32_t* next_token_;   // [1] i32: the chosen token, an alias of ids_[0] (the next step's input)
  int32_t* record_;       // [TokenRecordLayout::kWords] i32: the chosen token's logprob record
  int token_slot_ = -1;   // the host slot the token in ids_[0] is being read into; -1: none
  bool slot_has_record_[2] = {false, false};  // whether that slot's read is a whole record
  const int32_t* slot_record_[2] = {nullptr, nullptr};  // the record wait_token(slot) read

  // Captured decode graphs, keyed by the state's device position buffer and the token choice
  // (sampler params, logprob params, logprobs: backend memory is never freed, so a key cannot
  // be reused by other buffers). A state is captured on its
  // second decode step; `warmed_` holds states that ran their first.
  using GraphKey = std::tuple<const int32_t*, const int32_t*, const int32_t*, bool>;
  static GraphKey graph_key(const DecodeState& state, const TokenChoice& choice);
  std::map<GraphKey, int> graphs_;
  std::set<GraphKey> warmed_;
  std::unique_ptr<DecodePlan> plan_;  // built after the weights are prepared
};

}  // namespace lily

// The Qwen3.6-35B-A3B forward graph, written once against the backend ops.
#include "model/qwen36_model.h"

#include <stdexcept>
#include <string>

#include "backend/capture_scope.h"

namespace lily {

Qwen36Model::Qwen36Model(const Checkpoint& checkpoint, Backend& backend, int64_t chunk,
                         const LoadProgressFn& progress)
    : weights_(checkpoint.weights),
      shape_(checkpoint.config.shape),
      backend_(backend),
      chunk_(chunk),
      eps_(static_cast<float>(checkpoint.config.shape.rms_norm_eps)) {
  if (chunk <= 0) throw std::invalid_argument("Qwen36Model: chunk must be positive");
  const ModelShape& s = shape_;
  attn_dims_ = {static_cast<int64_t>(s.num_attention_heads), static_cast<int64_t>(s.num_key_value_heads),
                static_cast<int64_t>(s.head_dim), static_cast<int64_t>(s.rotary_dim()), s.rope_theta};
  gdn_dims_ = {static_cast<int64_t>(s.linear_num_key_heads), static_cast<int64_t>(s.linear_num_value_heads),
               static_cast<int64_t>(s.linear_key_head_dim), static_cast<int64_t>(s.linear_value_head_dim),
               static_cast<int64_t>(s.linear_conv_kernel_dim)};
  backend_.prepare(weights_, progress);
  const auto c = static_cast<size_t>(chunk);
  const size_t H = s.hidden_size;
  const size_t k = s.num_experts_per_tok;
  ids_ = backend_.alloc_i32(c);
  residual_ = backend_.alloc(c * H);
  normed_ = backend_.alloc(c * H);
  delta_ = backend_.alloc(c * H);
  mixed_ = backend_.alloc(c * s.gdn_conv_channels());
  z_ = backend_.alloc(c * s.gdn_value_width());
  a_ = backend_.alloc(c * s.linear_num_value_heads);
  b_ = backend_.alloc(c * s.linear_num_value_heads);
  conv_out_ = backend_.alloc(c * s.gdn_conv_channels());
  gdn_out_ = backend_.alloc(c * s.gdn_value_width());
  gdn_normed_ = backend_.alloc(c * s.gdn_value_width());
  qg_ = backend_.alloc(c * s.attn_q_rows());
  k_ = backend_.alloc(c * s.attn_kv_rows());
  v_ = backend_.alloc(c * s.attn_kv_rows());
  attn_out_ = backend_.alloc(c * s.attn_o_in());
  router_logits_ = backend_.alloc(c * s.num_experts);
  expert_ids_ = backend_.alloc_i32(c * k);
  expert_weights_ = backend_.alloc(c * k);
  expert_h_ = backend_.alloc(c * k * s.moe_intermediate_size);
  shared_h_ = backend_.alloc(c * s.shared_expert_intermediate_size);
  shared_logit_ = backend_.alloc(c);
  logits_ = backend_.alloc(s.vocab_size);
  // The argmax lands in ids_[0], where the next decode step's embedding reads it: a pipelined
  // step needs no copy between steps (submit_decode).
  next_token_ = ids_;
  record_ = backend_.alloc_i32(TokenRecordLayout::kWords);
  plan_ = backend_.make_decode_plan(
      weights_, DecodePlanShape{static_cast<int64_t>(H), static_cast<int64_t>(s.num_experts),
                                static_cast<int64_t>(k), eps_});
}

std::string Qwen36Model::decode_path() const {
  return plan_ == nullptr ? "every step on the backend ops" : plan_->describe();
}

void Qwen36Model::forward(DecodeState& state, std::span<const int32_t> tokens) {
  forward(state, tokens, TokenChoice{});
}

void Qwen36Model::forward(DecodeState& state, std::span<const int32_t> tokens,
                          const TokenChoice& choice) {
  if (choice.logprobs && choice.logprob_params == nullptr) {
    throw std::invalid_argument("forward: logprobs need logprob_params");
  }
  if (tokens.empty()) throw std::invalid_argument("forward: no tokens");
  token_slot_ = -1;  // ids_ is about to be overwritten
  const auto count = static_cast<int64_t>(tokens.size());
  if (state.position + count > state.capacity) {
    throw std::invalid_argument("forward: " + std::to_string(state.position) + " + " +
                                std::to_string(count) + " tokens exceed the state capacity " +
                                std::to_string(state.capacity));
  }
  for (int32_t id : tokens) {
    if (id < 0 || static_cast<uint64_t>(id) >= shape_.vocab_size) {
      throw std::invalid_argument("forward: token id " + std::to_string(id) +
                                  " outside the vocabulary of " + std::to_string(shape_.vocab_size));
    }
  }
  for (int64_t begin = 0; begin < count; begin += chunk_) {
    const int64_t n = std::min(chunk_, count - begin);
    run_chunk(state, tokens.data() + begin, n, begin + n == count, choice);
  }
}

void Qwen36Model::run_chunk(DecodeState& state, const int32_t* host_ids, int64_t n,
                            bool last_chunk, const TokenChoice& choice) {
  backend_.copy_from_host(host_ids, static_cast<size_t>(n), ids_);
  if (n == 1 && last_chunk) {
    decode_step(state, choice);
    return;
  }
  layers_forward(state, SeqPos(state.position), n);
  state.position += n;
  if (last_chunk) head(n, choice);
}

void Qwen36Model::layers_forward(DecodeState& state, SeqPos pos, int64_t n) {
  Backend& be = backend_;
  const auto H = static_cast<int64_t>(shape_.hidden_size);
  be.embed(weights_.embed, ids_, n, residual_);
  be.rms_norm(residual_, weights_.layers[0].input_norm, n, H, eps_, normed_);
  // Each residual add + norm runs just before the projections that read it (`project`):
  // `pending` is the norm still owed to the residual stream when the next block starts.
  const DenseView* pending = nullptr;
  for (size_t i = 0; i < weights_.layers.size(); ++i) {
    const LayerWeights& layer = weights_.layers[i];
    if (layer.kind == LayerKind::linear_attention) {
      delta_net_mixer(layer, state.delta_net[i], n, pending);
    } else {
      attention_mixer(layer, state.attention[i], state.capacity, pos, n, pending);
    }
    moe(i, n, &layer.post_attention_norm);
    pending = i + 1 < weights_.layers.size() ? &weights_.layers[i + 1].input_norm : nullptr;
  }
  be.add_rms_norm(residual_, delta_, weights_.final_norm, n, H, eps_, normed_);
}

void Qwen36Model::project(std::span<const MatmulTarget> targets, int64_t n,
                          const DenseView* pending_norm) {
  if (pending_norm != nullptr) {
    backend_.add_rms_norm(residual_, delta_, *pending_norm, n,
                          static_cast<int64_t>(shape_.hidden_size), eps_, normed_);
  }
  backend_.matmul_group(targets, normed_, n);
}

void Qwen36Model::head(int64_t n, const TokenChoice& choice) {
  const auto H = static_cast<int64_t>(shape_.hidden_size);
  const auto V = static_cast<int64_t>(shape_.vocab_size);
  backend_.matmul(weights_.lm_head, 0, V, normed_ + (n - 1) * H, 1, logits_);
  if (choice.sampler != nullptr) {
    backend_.sample(logits_, V, *choice.sampler, next_token_);
  } else {
    backend_.argmax(logits_, 1, V, next_token_);
  }
  if (choice.logprobs) backend_.token_logprobs(logits_, V, next_token_, *choice.logprob_params, record_);
}

void Qwen36Model::read_back(const TokenChoice& choice, int to_slot) {
  if (choice.logprobs) {
    backend_.read_words_async(record_, TokenRecordLayout::kWords, to_slot);
  } else {
    backend_.read_async(next_token_, to_slot);
  }
  slot_has_record_[to_slot] = choice.logprobs;
  slot_record_[to_slot] = nullptr;
}

Qwen36Model::GraphKey Qwen36Model::graph_key(const DecodeState& state, const TokenChoice& choice) {
  return {state.device_position, choice.sampler ? choice.sampler->params : nullptr,
          choice.logprob_params ? choice.logprob_params->params : nullptr, choice.logprobs};
}

void Qwen36Model::sync_device_position(DecodeState& state) {
  if (state.device_position_value == state.position) return;
  const auto value = static_cast<int32_t>(state.position);
  backend_.copy_from_host(&value, 1, state.device_position);
  state.device_position_value = state.position;
}

void Qwen36Model::decode_step_ops(DecodeState& state, const TokenChoice& choice,
                                  FaultSite site) {
  backend_.fault_point(site);  // test only (--test-fault); nothing when no fault is armed
  layers_forward(state, SeqPos(state.position, state.device_position), 1);
  head(1, choice);
  backend_.add_i32(state.device_position, 1);
}

void Qwen36Model::decode_step(DecodeState& state, const TokenChoice& choice) {
  if (state.position + 1 > state.capacity) {
    throw std::invalid_argument("decode: position " + std::to_string(state.position) +
                                " is at the state capacity " + std::to_string(state.capacity));
  }
  sync_device_position(state);
  const GraphKey key = graph_key(state, choice);
  if (!backend_.can_capture()) {
    decode_step_ops(state, choice);
  } else if (auto it = graphs_.find(key); it != graphs_.end()) {
    backend_.replay(it->second);
  } else if (warmed_.count(key) == 0) {
    decode_step_ops(state, choice);  // eager: sizes the backend's scratch for this state
    warmed_.insert(key);
  } else {
    CaptureScope capture(backend_);
    decode_step_ops(state, choice, FaultSite::capture);
    const int graph = capture.end();
    graphs_.emplace(key, graph);
    backend_.replay(graph);
  }
  state.position += 1;
  state.device_position_value += 1;
}

void Qwen36Model::delta_net_mixer(const LayerWeights& layer, DecodeState::DeltaNetState& s,
                                  int64_t n, const DenseView* pending_norm) {
  Backend& be = backend_;
  const GatedDeltaNetWeights& w = layer.gdn;
  const int64_t C = gdn_dims_.channels();
  const int64_t Hv = gdn_dims_.value_heads;
  const int64_t Dv = gdn_dims_.value_dim;
  const MatmulTarget projections[] = {{&w.in_proj_qkv, 0, C, mixed_},
                                      {&w.in_proj_z, 0, Hv * Dv, z_},
                                      {&w.in_proj_a, 0, Hv, a_},
                                      {&w.in_proj_b, 0, Hv, b_}};
  project(projections, n, pending_norm);
  be.gated_delta_net_mixer(w, gdn_dims_, eps_, mixed_, z_, a_, b_, s.conv_window, s.recurrent, n,
                           conv_out_, gdn_out_, gdn_normed_, delta_);
}

void Qwen36Model::attention_mixer(const LayerWeights& layer, DecodeState::AttentionCache& cache,
                                  int64_t capacity, SeqPos start_pos, int64_t n,
                                  const DenseView* pending_norm) {
  Backend& be = backend_;
  const AttentionWeights& w = layer.attn;
  const int64_t kv_rows = attn_dims_.kv_heads * attn_dims_.head_dim;
  const MatmulTarget projections[] = {
      {&w.q_proj, 0, static_cast<int64_t>(shape_.attn_q_rows()), qg_},
      {&w.k_proj, 0, kv_rows, k_},
      {&w.v_proj, 0, kv_rows, v_}};
  project(projections, n, pending_norm);
  be.attention_prepare(qg_, k_, w.q_norm, w.k_norm, attn_dims_, start_pos, n, eps_);
  be.attention(qg_, k_, v_, cache.keys, cache.values, capacity, attn_dims_, start_pos, n,
               attn_out_);
  be.matmul(w.o_proj, 0, static_cast<int64_t>(shape_.hidden_size), attn_out_, n, delta_);
}

void Qwen36Model::moe(size_t index, int64_t n, const DenseView* pending_norm) {
  Backend& be = backend_;
  const LayerWeights& layer = weights_.layers[index];
  const MoeWeights& w = layer.moe;
  // One token with the norm still owed (always, in layers_forward): the plan's fused block.
  if (n == 1 && pending_norm == &layer.post_attention_norm && plan_ != nullptr &&
      plan_->has_moe_block()) {
    plan_->moe_block(index, MoeBlockBuffers{residual_, delta_, normed_, router_logits_,
                                            shared_logit_, expert_ids_, expert_weights_,
                                            expert_h_, shared_h_});
    return;
  }
  const auto E = static_cast<int64_t>(shape_.num_experts);
  const auto k = static_cast<int64_t>(shape_.num_experts_per_tok);
  const MatmulTarget gates[] = {{&w.router, 0, E, router_logits_},
                                {&w.shared_expert_gate, 0, 1, shared_logit_}};
  project(gates, n, pending_norm);
  be.route_expert_swiglu(router_logits_, E, k, expert_ids_, expert_weights_, w.experts_gate,
                         w.experts_up, expert_h_, w.shared_gate, w.shared_up, shared_h_, normed_,
                         n, &w.experts_down);
  be.expert_down_combine(w.experts_down, expert_h_, expert_ids_, expert_weights_, n, k,
                         w.shared_down, shared_h_, shared_logit_, delta_);
}

void Qwen36Model::logits_to_host(std::vector<float>& out) {
  out.resize(shape_.vocab_size);
  backend_.copy_to_host(logits_, out.size(), out.data());
}

int32_t Qwen36Model::next_token_to_host() {
  int32_t token = 0;
  backend_.copy_to_host_i32(next_token_, 1, &token);
  return token;
}

namespace {
void check_slot(int slot) {
  if (slot != 0 && slot != 1) {
    throw std::invalid_argument("token slot " + std::to_string(slot) + ", expected 0 or 1");
  }
}
}  // namespace

void Qwen36Model::submit_prefill(DecodeState& state, std::span<const int32_t> prompt, int to_slot,
                                 const TokenChoice& choice) {
  check_slot(to_slot);
  forward(state, prompt, choice);
  read_back(choice, to_slot);
  token_slot_ = to_slot;
}

void Qwen36Model::submit_decode(DecodeState& state, int from_slot, int to_slot,
                                const TokenChoice& choice) {
  check_slot(from_slot);
  check_slot(to_slot);
  // The token to feed is the last submit's argmax, still in ids_[0] (next_token_): in op
  // order that submit has been issued before, and its read-back copy runs before this step
  // overwrites it.
  if (from_slot != token_slot_) {
    throw std::logic_error("submit_decode: slot " + std::to_string(from_slot) +
                           " is not the last submit's token (that is slot " +
                           std::to_string(token_slot_) +
                           "; -1: none since the last forward); a pipelined step feeds the "
                           "token of the submit just before it");
  }
  if (choice.logprobs && choice.logprob_params == nullptr) {
    throw std::invalid_argument("submit_decode: logprobs need logprob_params");
  }
  decode_step(state, choice);
  read_back(choice, to_slot);
  token_slot_ = to_slot;
}

int32_t Qwen36Model::wait_token(int slot) {
  check_slot(slot);
  if (!slot_has_record_[slot]) return backend_.wait_read(slot);
  slot_record_[slot] = backend_.wait_read_words(slot);
  return slot_record_[slot][TokenRecordLayout::kToken];
}

const int32_t* Qwen36Model::wait_record(int slot) const {
  check_slot(slot);
  return slot_record_[slot];
}

}  // namespace lily

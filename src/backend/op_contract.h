// The base ops' portable contract: one argument check per op, called by every backend first.
#pragma once

#include <cstdint>

#include "backend/backend.h"

// The 13 base ops of backend.h (the pure virtual arithmetic ops: embed, matmul, rms_norm,
// add_rms_norm, attention_prepare, attention, conv1d_silu, gated_delta_rule, gated_rms_norm,
// moe_route, expert_swiglu, expert_down_combine, argmax) have one contract on every backend:
// what these functions accept. Each backend calls the op's check at the top of the op, so
// the same bad arguments get the same std::invalid_argument with the same text everywhere:
//   "<op>: <argument> is <what it was>, expected <what the contract wants>".
// They check what the host can see: shapes, dimensions, pointers, the weights' views. What
// lies in backend memory (token or expert ids, positions on the device) is the caller's
// promise; a backend that can read it cheaply (the CPU) checks it too. A backend may refuse
// more than the contract (a kernel's limits, e.g. CUDA's head_dim of 64, 128 or 256): that
// is its own check, after this one, naming the backend. `op` names the op in the message:
// the fused ops that are made of a base op reuse its check under their own name.
namespace lily::contract {

// A quantized weight view: codes, scales and biases present, bits 4 or 8, in a positive
// multiple of 64, at least one row. `argument` names it in the message ("w", "gate").
void check_weight(const QuantView& w, const char* op, const char* argument);
// A dense vector of `count` values: data present, BF16 or F32, shape [count], nbytes to match.
void check_vector(const DenseView& v, int64_t count, const char* op, const char* argument);

void check_embed(const QuantView& table, const int32_t* ids, int64_t n, const float* out,
                 const char* op = "embed");
void check_matmul(const QuantView& w, int64_t row_begin, int64_t rows, const float* x, int64_t n,
                  const float* y, const char* op = "matmul");
// Target i of a matmul_group: a weight present ("<group_op>: targets[i].w is null, expected a
// weight"), then check_matmul of its rows under `op`.
void check_matmul_target(const MatmulTarget& t, size_t i, const float* x, int64_t n,
                         const char* group_op, const char* op);
void check_rms_norm(const float* x, const DenseView& gain, int64_t n, int64_t dim,
                    const float* out, const char* op = "rms_norm");
void check_add_rms_norm(const float* residual, const float* delta, const DenseView& gain,
                        int64_t n, int64_t dim, const float* out, const char* op = "add_rms_norm");
void check_attention_prepare(const float* qg, const float* k, const DenseView& q_norm,
                             const DenseView& k_norm, const AttentionDims& dims, SeqPos start_pos,
                             int64_t n, const char* op = "attention_prepare");
// The caches are [capacity, kv_heads, head_dim] of one element type (f32 or bf16): keys and
// values of the same dtype. Which dtypes a backend serves is its own check (serves_kv_cache).
void check_attention(const float* qg, const float* k, const float* v, const KvCacheView& k_cache,
                     const KvCacheView& v_cache, int64_t capacity, const AttentionDims& dims,
                     SeqPos start_pos, int64_t n, const float* out, const char* op = "attention");
void check_conv1d_silu(const float* mixed, const float* window, const DenseView& weight,
                       const GatedDeltaNetDims& dims, int64_t n, const float* out,
                       const char* op = "conv1d_silu");
void check_gated_delta_rule(const float* conv, const float* a, const float* b,
                            const DenseView& a_log, const DenseView& dt_bias, const float* state,
                            const GatedDeltaNetDims& dims, int64_t n, const float* out,
                            const char* op = "gated_delta_rule");
void check_gated_rms_norm(const float* x, const float* z, const DenseView& gain, int64_t rows,
                          int64_t dim, const float* out, const char* op = "gated_rms_norm");
void check_moe_route(const float* logits, int64_t n, int64_t experts, int64_t k,
                     const int32_t* ids, const float* weights, const char* op = "moe_route");
void check_expert_swiglu(const QuantView& gate, const QuantView& up, const float* x,
                         const int32_t* ids, int64_t n, int64_t k, const float* h,
                         const char* op = "expert_swiglu");
void check_expert_down_combine(const QuantView& down, const float* h, const int32_t* ids,
                               const float* weights, int64_t n, int64_t k,
                               const QuantView& shared_down, const float* shared_h,
                               const float* shared_logit, const float* out,
                               const char* op = "expert_down_combine");
void check_argmax(const float* logits, int64_t n, int64_t vocab, const int32_t* out,
                  const char* op = "argmax");

}  // namespace lily::contract

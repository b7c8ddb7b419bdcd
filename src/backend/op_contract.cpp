// The base ops' argument checks (op_contract.h): the same rules and messages on every backend.
#include "backend/op_contract.h"

#include <stdexcept>
#include <string>

#include "checkpoint/safetensors.h"

namespace lily::contract {

namespace {

[[noreturn]] void reject(const char* op, const std::string& argument, const std::string& was,
                         const std::string& expected) {
  throw std::invalid_argument(std::string(op) + ": " + argument + " is " + was + ", expected " +
                              expected);
}

std::string num(int64_t v) { return std::to_string(v); }
std::string num(uint64_t v) { return std::to_string(v); }

// "w" or "w (model.layers.0.mlp.gate)": the argument and, when the view has one, its name.
std::string named(const char* argument, const std::string& name) {
  return name.empty() ? std::string(argument) : std::string(argument) + " (" + name + ")";
}

void require_buffer(const void* p, const char* op, const char* argument, const char* holds) {
  if (p == nullptr) reject(op, argument, "null", std::string("a buffer of ") + holds);
}

void require_positive(int64_t v, const char* op, const char* argument) {
  if (v <= 0) reject(op, argument, num(v), "> 0");
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Data present, BF16 or F32, and nbytes holding exactly `count` values.
void check_dense_data(const DenseView& v, int64_t count, const char* op, const char* argument) {
  const std::string who = named(argument, v.name);
  if (v.data == nullptr) reject(op, who + " data", "null", "the tensor's values");
  if (v.dtype != DType::BF16 && v.dtype != DType::F32) {
    reject(op, who + " dtype", std::string(dtype_name(v.dtype)), "BF16 or F32");
  }
  const uint64_t size = v.dtype == DType::F32 ? 4 : 2;
  if (v.nbytes != static_cast<uint64_t>(count) * size) {
    reject(op, who + " nbytes", num(v.nbytes),
           num(static_cast<uint64_t>(count) * size) + " (" + num(count) + " values)");
  }
}

void check_attention_dims(const AttentionDims& d, const char* op) {
  require_positive(d.q_heads, op, "dims.q_heads");
  require_positive(d.kv_heads, op, "dims.kv_heads");
  if (d.q_heads % d.kv_heads != 0) {
    reject(op, "dims.q_heads", num(d.q_heads), std::string("a multiple of dims.kv_heads = ") + num(d.kv_heads));
  }
  require_positive(d.head_dim, op, "dims.head_dim");
  if (d.rotary_dim <= 0 || d.rotary_dim % 2 != 0 || d.rotary_dim > d.head_dim) {
    reject(op, "dims.rotary_dim", num(d.rotary_dim),
           std::string("even, in [2, dims.head_dim = ") + num(d.head_dim) + "]");
  }
}

void check_delta_net_dims(const GatedDeltaNetDims& d, const char* op) {
  require_positive(d.key_heads, op, "dims.key_heads");
  require_positive(d.value_heads, op, "dims.value_heads");
  if (d.value_heads % d.key_heads != 0) {
    reject(op, "dims.value_heads", num(d.value_heads),
           std::string("a multiple of dims.key_heads = ") + num(d.key_heads));
  }
  require_positive(d.key_dim, op, "dims.key_dim");
  require_positive(d.value_dim, op, "dims.value_dim");
  if (d.conv_kernel < 2) reject(op, "dims.conv_kernel", num(d.conv_kernel), ">= 2");
}

// n > 0 tokens at start_pos: a device position only for one token (a decode step), a host
// position >= 0 and, with a cache (capacity >= 0), its rows inside it.
void check_position(SeqPos pos, int64_t n, int64_t capacity, const char* op) {
  require_positive(n, op, "n");
  if (pos.device != nullptr) {
    if (n != 1) reject(op, "n", num(n), "1 with a device position (one decode step)");
    return;
  }
  if (pos.host < 0) reject(op, "start_pos", num(pos.host), ">= 0");
  if (capacity >= 0 && pos.host + n > capacity) {
    reject(op, "start_pos + n", num(pos.host + n),
           std::string("at most the KV cache capacity ") + num(capacity));
  }
}

}  // namespace

void check_weight(const QuantView& w, const char* op, const char* argument) {
  const std::string who = named(argument, w.name);
  if (w.codes == nullptr) reject(op, who + " codes", "null", "the packed codes");
  if (w.scales == nullptr) reject(op, who + " scales", "null", "the group scales");
  if (w.biases == nullptr) reject(op, who + " biases", "null", "the group biases");
  if (w.bits != 4 && w.bits != 8) reject(op, who + " bits", std::to_string(w.bits), "4 or 8");
  if (w.in == 0 || w.in % 64 != 0) {
    reject(op, who + " input width", num(w.in), "a positive multiple of 64 (the group size)");
  }
  if (w.rows() == 0) {
    reject(op, who + " rows", num(w.experts) + " x " + num(w.out), "at least one row");
  }
}

void check_vector(const DenseView& v, int64_t count, const char* op, const char* argument) {
  if (v.shape.size() != 1 || v.shape[0] != static_cast<uint64_t>(count)) {
    reject(op, named(argument, v.name) + " shape", shape_text(v.shape), std::string("[") + num(count) + "]");
  }
  check_dense_data(v, count, op, argument);
}

void check_embed(const QuantView& table, const int32_t* ids, int64_t n, const float* out,
                 const char* op) {
  check_weight(table, op, "table");
  require_positive(n, op, "n");
  require_buffer(ids, op, "ids", "n token ids");
  require_buffer(out, op, "out", "n x in values");
}

void check_matmul(const QuantView& w, int64_t row_begin, int64_t rows, const float* x, int64_t n,
                  const float* y, const char* op) {
  check_weight(w, op, "w");
  require_positive(n, op, "n");
  require_positive(rows, op, "rows");
  if (row_begin < 0) reject(op, "row_begin", num(row_begin), ">= 0");
  const auto total = static_cast<int64_t>(w.rows());
  if (row_begin + rows > total) {
    reject(op, "row_begin + rows", num(row_begin + rows),
           std::string("at most the ") + num(total) + " rows of " + named("w", w.name));
  }
  require_buffer(x, op, "x", "n x in values");
  require_buffer(y, op, "y", "n x rows values");
}

void check_matmul_target(const MatmulTarget& t, size_t i, const float* x, int64_t n,
                         const char* group_op, const char* op) {
  if (t.w == nullptr) {
    throw std::invalid_argument(std::string(group_op) + ": targets[" + std::to_string(i) +
                                "].w is null, expected a weight");
  }
  check_matmul(*t.w, t.row_begin, t.rows, x, n, t.y, op);
}

void check_rms_norm(const float* x, const DenseView& gain, int64_t n, int64_t dim,
                    const float* out, const char* op) {
  require_positive(n, op, "n");
  require_positive(dim, op, "dim");
  check_vector(gain, dim, op, "gain");
  require_buffer(x, op, "x", "n x dim values");
  require_buffer(out, op, "out", "n x dim values");
}

void check_add_rms_norm(const float* residual, const float* delta, const DenseView& gain,
                        int64_t n, int64_t dim, const float* out, const char* op) {
  require_positive(n, op, "n");
  require_positive(dim, op, "dim");
  check_vector(gain, dim, op, "gain");
  require_buffer(residual, op, "residual", "n x dim values");
  require_buffer(delta, op, "delta", "n x dim values");
  require_buffer(out, op, "out", "n x dim values");
}

void check_attention_prepare(const float* qg, const float* k, const DenseView& q_norm,
                             const DenseView& k_norm, const AttentionDims& dims, SeqPos start_pos,
                             int64_t n, const char* op) {
  check_attention_dims(dims, op);
  check_vector(q_norm, dims.head_dim, op, "q_norm");
  check_vector(k_norm, dims.head_dim, op, "k_norm");
  check_position(start_pos, n, -1, op);
  require_buffer(qg, op, "qg", "n x q_heads x 2 x head_dim values");
  require_buffer(k, op, "k", "n x kv_heads x head_dim values");
}

void check_attention(const float* qg, const float* k, const float* v, const KvCacheView& k_cache,
                     const KvCacheView& v_cache, int64_t capacity, const AttentionDims& dims,
                     SeqPos start_pos, int64_t n, const float* out, const char* op) {
  check_attention_dims(dims, op);
  require_positive(capacity, op, "capacity");
  check_position(start_pos, n, capacity, op);
  require_buffer(qg, op, "qg", "n x q_heads x 2 x head_dim values");
  require_buffer(k, op, "k", "n x kv_heads x head_dim values");
  require_buffer(v, op, "v", "n x kv_heads x head_dim values");
  require_buffer(k_cache.data, op, "k_cache", "capacity x kv_heads x head_dim values");
  require_buffer(v_cache.data, op, "v_cache", "capacity x kv_heads x head_dim values");
  if (v_cache.dtype != k_cache.dtype) {
    reject(op, "v_cache dtype", kv_dtype_name(v_cache.dtype),
           std::string("the keys' dtype ") + kv_dtype_name(k_cache.dtype));
  }
  if (k_cache.dtype == KvDtype::int8) {
    require_buffer(k_cache.scales, op, "k_cache scales", "capacity x kv_heads f32 row scales");
    require_buffer(v_cache.scales, op, "v_cache scales", "capacity x kv_heads f32 row scales");
    for (const KvCacheView* c : {&k_cache, &v_cache}) {
      if (c->scale_group != dims.head_dim) {
        reject(op, c == &k_cache ? "k_cache scale_group" : "v_cache scale_group", num(c->scale_group),
               "one scale per row of head_dim = " + num(dims.head_dim) + " values");
      }
    }
  }
  require_buffer(out, op, "out", "n x q_heads x head_dim values");
}

void check_conv1d_silu(const float* mixed, const float* window, const DenseView& weight,
                       const GatedDeltaNetDims& dims, int64_t n, const float* out,
                       const char* op) {
  check_delta_net_dims(dims, op);
  const auto C = static_cast<uint64_t>(dims.channels());
  const auto K = static_cast<uint64_t>(dims.conv_kernel);
  const std::vector<uint64_t>& s = weight.shape;
  // [C, K, 1] (MLX) or [C, 1, K] (HF): tap k of channel c at c * K + k either way.
  if (s.size() != 3 || s[0] != C || !((s[1] == K && s[2] == 1) || (s[1] == 1 && s[2] == K))) {
    reject(op, named("weight", weight.name) + " shape", shape_text(s),
           std::string("[") + num(C) + ", " + num(K) + ", 1] or [" + num(C) + ", 1, " + num(K) +
               "] (channels, conv_kernel)");
  }
  check_dense_data(weight, dims.channels() * dims.conv_kernel, op, "weight");
  require_positive(n, op, "n");
  require_buffer(mixed, op, "mixed", "n x channels values");
  require_buffer(window, op, "window", "(conv_kernel - 1) x channels values");
  require_buffer(out, op, "out", "n x channels values");
}

void check_gated_delta_rule(const float* conv, const float* a, const float* b,
                            const DenseView& a_log, const DenseView& dt_bias, const float* state,
                            const GatedDeltaNetDims& dims, int64_t n, const float* out,
                            const char* op) {
  check_delta_net_dims(dims, op);
  check_vector(a_log, dims.value_heads, op, "a_log");
  check_vector(dt_bias, dims.value_heads, op, "dt_bias");
  require_positive(n, op, "n");
  require_buffer(conv, op, "conv", "n x channels values");
  require_buffer(a, op, "a", "n x value_heads values");
  require_buffer(b, op, "b", "n x value_heads values");
  require_buffer(state, op, "state", "value_heads x key_dim x value_dim values");
  require_buffer(out, op, "out", "n x value_heads x value_dim values");
}

void check_gated_rms_norm(const float* x, const float* z, const DenseView& gain, int64_t rows,
                          int64_t dim, const float* out, const char* op) {
  require_positive(rows, op, "rows");
  require_positive(dim, op, "dim");
  check_vector(gain, dim, op, "gain");
  require_buffer(x, op, "x", "rows x dim values");
  require_buffer(z, op, "z", "rows x dim values");
  require_buffer(out, op, "out", "rows x dim values");
}

void check_moe_route(const float* logits, int64_t n, int64_t experts, int64_t k,
                     const int32_t* ids, const float* weights, const char* op) {
  require_positive(experts, op, "experts");
  if (k < 1 || k > experts) reject(op, "k", num(k), std::string("in [1, experts = ") + num(experts) + "]");
  require_positive(n, op, "n");
  require_buffer(logits, op, "logits", "n x experts values");
  require_buffer(ids, op, "ids", "n x k ids");
  require_buffer(weights, op, "weights", "n x k values");
}

void check_expert_swiglu(const QuantView& gate, const QuantView& up, const float* x,
                         const int32_t* ids, int64_t n, int64_t k, const float* h,
                         const char* op) {
  check_weight(gate, op, "gate");
  check_weight(up, op, "up");
  if (gate.experts != up.experts || gate.out != up.out || gate.in != up.in) {
    reject(op, named("up", up.name) + " shape",
           num(up.experts) + " x [" + num(up.out) + ", " + num(up.in) + "]",
           std::string("the shape of ") + named("gate", gate.name) + ", " + num(gate.experts) + " x [" +
               num(gate.out) + ", " + num(gate.in) + "]");
  }
  require_positive(n, op, "n");
  require_positive(k, op, "k");
  (void)ids;  // may be null: every slot reads expert 0 (its values are in backend memory)
  require_buffer(x, op, "x", "n x in values");
  require_buffer(h, op, "h", "n x k x out values");
}

void check_expert_down_combine(const QuantView& down, const float* h, const int32_t* ids,
                               const float* weights, int64_t n, int64_t k,
                               const QuantView& shared_down, const float* shared_h,
                               const float* shared_logit, const float* out, const char* op) {
  check_weight(down, op, "down");
  check_weight(shared_down, op, "shared_down");
  if (shared_down.experts != 1 || shared_down.out != down.out) {
    reject(op, named("shared_down", shared_down.name) + " rows",
           num(shared_down.experts) + " x " + num(shared_down.out),
           std::string("one matrix of the routed output width ") + num(down.out));
  }
  require_positive(n, op, "n");
  require_positive(k, op, "k");
  require_buffer(h, op, "h", "n x k x in values");
  require_buffer(ids, op, "ids", "n x k expert ids");
  require_buffer(weights, op, "weights", "n x k values");
  require_buffer(shared_h, op, "shared_h", "n x shared in values");
  require_buffer(shared_logit, op, "shared_logit", "n values");
  require_buffer(out, op, "out", "n x out values");
}

void check_argmax(const float* logits, int64_t n, int64_t vocab, const int32_t* out,
                  const char* op) {
  require_positive(n, op, "n");
  require_positive(vocab, op, "vocab");
  require_buffer(logits, op, "logits", "n x vocab values");
  require_buffer(out, op, "out", "n ids");
}

}  // namespace lily::contract

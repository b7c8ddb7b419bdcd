// CPU mixture of experts: gathered gate/up + SwiGLU, and down + weighted combine + shared expert.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/op_contract.h"

namespace lily {

namespace {

// Routing slots (t * k + j) grouped by expert, so prefill unpacks each expert row once.
struct ExpertGroups {
  std::vector<int64_t> experts;               // experts with at least one slot, ascending
  std::vector<std::vector<int64_t>> slots;    // slots of experts[i]
  ExpertGroups(const int32_t* ids, int64_t slot_count, uint64_t expert_count) {
    std::vector<std::vector<int64_t>> by_expert(expert_count);
    for (int64_t s = 0; s < slot_count; ++s) {
      by_expert[ids != nullptr ? static_cast<size_t>(ids[s]) : 0].push_back(s);
    }
    for (size_t e = 0; e < by_expert.size(); ++e) {
      if (by_expert[e].empty()) continue;
      experts.push_back(static_cast<int64_t>(e));
      slots.push_back(std::move(by_expert[e]));
    }
  }
};

// The ids are in host memory here: checked beyond the contract (a device backend cannot).
void check_ids(const int32_t* ids, int64_t count, uint64_t experts, const char* op) {
  for (int64_t i = 0; ids != nullptr && i < count; ++i) {
    cpu::require(ids[i] >= 0 && static_cast<uint64_t>(ids[i]) < experts, op,
                 "expert id " + std::to_string(ids[i]) + " out of range");
  }
}

// Rows per chunk of the fast prefill's MoE: the chunk's dots for every token routed to an
// expert stay in L1/L2 (f32 [slots, 64]).
constexpr int64_t kRowChunk = 64;

void grow(std::vector<float>& v, int64_t count) {
  if (v.size() < static_cast<size_t>(count)) v.resize(static_cast<size_t>(count));
}

// The fast prefill's per-expert token lists: for each used expert, the quantised input of each
// of its slots (tokens[slot / divisor]), concatenated into `out` (grow-only); returns where
// each expert's list starts.
std::vector<int64_t> gather_tokens(const ExpertGroups& groups, const cpu::Q8Activations* const* tokens,
                                   int64_t divisor, std::vector<const cpu::Q8Activations*>& out) {
  std::vector<int64_t> starts;
  starts.reserve(groups.slots.size());
  size_t size = 0;
  for (const auto& slots : groups.slots) size += slots.size();
  if (out.size() < size) out.resize(size);
  size_t at = 0;
  for (const auto& slots : groups.slots) {
    starts.push_back(static_cast<int64_t>(at));
    for (int64_t slot : slots) out[at++] = tokens[slot / divisor];
  }
  return starts;
}

// SiLU(g) * u, and acc + w * d: one function each for decode and both prefills, so that their
// roundings are the same expressions (the fast prefill must equal decode bit for bit).
inline float swiglu(float g, float u) { return cpu::silu(g) * u; }
inline float add_weighted(float acc, float w, float d) { return acc + w * d; }

// Decode's SwiGLU over rows [row, row + rows) of one expert's gate and up (rows <= kRowChunk):
// the gate rows, then the up rows, each one ordered stream, into h [rows] f32. Same dots, so
// the same bits as one row at a time.
template <typename Input>
void swiglu_rows(const Input& input, const QuantView& gate, const QuantView& up, int64_t row,
                 int64_t rows, float* h) {
  float g[kRowChunk];  // f32 [rows]
  float u[kRowChunk];
  input.dots(gate, row, rows, g);
  input.dots(up, row, rows, u);
  for (int64_t r = 0; r < rows; ++r) h[r] = swiglu(g[r], u[r]);
}

// Decode's items [begin, end) of `slots` blocks of I rows each (item = slot * I + row): expert
// ids[slot] (0 without ids), in chunks that stay within one block.
template <typename Input>
void swiglu_items(const Input& input, const QuantView& gate, const QuantView& up, const int32_t* ids,
                  int64_t I, int64_t begin, int64_t end, float* h) {
  for (int64_t item = begin; item < end;) {
    const int64_t slot = item / I;
    const int64_t r0 = item % I;
    const int64_t rows = std::min({kRowChunk, I - r0, end - item});
    const int64_t e = ids != nullptr ? ids[slot] : 0;
    swiglu_rows(input, gate, up, e * I + r0, rows, h + item);
    item += rows;
  }
}

}  // namespace

void CpuBackend::expert_swiglu(const QuantView& gate, const QuantView& up, const float* x,
                               const int32_t* ids, int64_t n, int64_t k, float* h) {
  contract::check_expert_swiglu(gate, up, x, ids, n, k, h);
  check_ids(ids, n * k, gate.experts, "expert_swiglu");
  const auto I = static_cast<int64_t>(gate.out);
  const auto in = static_cast<int64_t>(gate.in);
  if (n == 1) {  // decode: every (slot, row) is independent work
    DecodeInput& input = decode_input(0);
    input.prepare(x, in, planes_for(gate));
    pool_.parallel_for(k * I, [&](int64_t begin, int64_t end) {
      swiglu_items(input, gate, up, ids, I, begin, end, h);
    });
    return;
  }
  const ExpertGroups groups(ids, n * k, gate.experts);
  const auto used = static_cast<int64_t>(groups.experts.size());
  if (precision_ != CpuPrecision::exact) {  // prefill on integer dots: the tokens quantised once
    const cpu::Q8Activations* const* tokens =
        quantize_tokens(x, n, in, 0, planes_for(gate), "expert_swiglu");
    const std::vector<int64_t> starts = gather_tokens(groups, tokens, k, expert_ptrs_);
    pool_.parallel_for(used * I, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> g_rows, u_rows;  // f32 [slots of the expert, kRowChunk]
      for (int64_t item = begin; item < end;) {  // chunks of rows within one expert
        const auto which = static_cast<size_t>(item / I);
        const int64_t r0 = item % I;
        const int64_t rows = std::min({kRowChunk, I - r0, end - item});
        const std::vector<int64_t>& slots = groups.slots[which];
        const auto count = static_cast<int64_t>(slots.size());
        grow(g_rows, count * rows);
        grow(u_rows, count * rows);
        const cpu::Q8Activations* const* xs = expert_ptrs_.data() + starts[which];
        const int64_t e = groups.experts[which];
        cpu::int8_rows_dot_tokens(gate, e * I + r0, rows, xs, count, g_rows.data(), rows);
        cpu::int8_rows_dot_tokens(up, e * I + r0, rows, xs, count, u_rows.data(), rows);
        for (int64_t i = 0; i < count; ++i) {
          for (int64_t r = 0; r < rows; ++r) {
            h[slots[static_cast<size_t>(i)] * I + r0 + r] =
                swiglu(g_rows[static_cast<size_t>(i * rows + r)], u_rows[static_cast<size_t>(i * rows + r)]);
          }
        }
        item += rows;
      }
    });
    return;
  }
  pool_.parallel_for(used * I, [&](int64_t begin, int64_t end) {
    thread_local cpu::DecodedRow gate_row, up_row;
    for (int64_t item = begin; item < end; ++item) {
      const auto which = static_cast<size_t>(item / I);
      const int64_t r = item % I;
      const int64_t e = groups.experts[which];
      gate_row.load(gate, e * I + r);
      up_row.load(up, e * I + r);
      for (int64_t slot : groups.slots[which]) {
        const int64_t t = slot / k;
        h[slot * I + r] = cpu::silu(gate_row.dot(x + t * in)) * up_row.dot(x + t * in);
      }
    }
  });
}

void CpuBackend::expert_swiglu_with_shared(const QuantView& gate, const QuantView& up,
                                           const int32_t* ids, int64_t k, float* h,
                                           const QuantView& shared_gate, const QuantView& shared_up,
                                           float* shared_h, const float* x, int64_t n) {
  // Prefill, or a shared expert of another width or code width than the routed ones (which the
  // model has not): the two ops in turn.
  if (n != 1 || shared_gate.in != gate.in || planes_for(shared_gate) != planes_for(gate)) {
    return Backend::expert_swiglu_with_shared(gate, up, ids, k, h, shared_gate, shared_up, shared_h, x, n);
  }
  contract::check_expert_swiglu(gate, up, x, ids, n, k, h);
  contract::check_expert_swiglu(shared_gate, shared_up, x, nullptr, n, 1, shared_h);
  check_ids(ids, k, gate.experts, "expert_swiglu_with_shared");
  const auto I = static_cast<int64_t>(gate.out);
  const auto S = static_cast<int64_t>(shared_gate.out);
  DecodeInput& input = decode_input(0);
  input.prepare(x, static_cast<int64_t>(gate.in), planes_for(gate));
  // Items [0, k * I) are the routed slots' rows, [k * I, k * I + S) the shared expert's: one
  // pool barrier for both.
  pool_.parallel_for(k * I + S, [&](int64_t begin, int64_t end) {
    if (begin < k * I) swiglu_items(input, gate, up, ids, I, begin, std::min(end, k * I), h);
    if (end > k * I) {
      const int64_t lo = std::max(begin, k * I) - k * I;
      swiglu_items(input, shared_gate, shared_up, nullptr, S, lo, end - k * I, shared_h);
    }
  });
}

void CpuBackend::expert_down_combine(const QuantView& down, const float* h, const int32_t* ids,
                                     const float* weights, int64_t n, int64_t k,
                                     const QuantView& shared_down, const float* shared_h,
                                     const float* shared_logit, float* out) {
  contract::check_expert_down_combine(down, h, ids, weights, n, k, shared_down, shared_h,
                                     shared_logit, out);
  check_ids(ids, n * k, down.experts, "expert_down_combine");
  const auto H = static_cast<int64_t>(down.out);
  const auto I = static_cast<int64_t>(down.in);
  const auto S = static_cast<int64_t>(shared_down.in);
  if (n == 1) {  // decode: activations prepared once (slot j in input j, shared in k), then rows
    for (int64_t j = 0; j < k; ++j)
      decode_input(static_cast<size_t>(j)).prepare(h + j * I, I, planes_for(down));
    DecodeInput& shared_input = decode_input(static_cast<size_t>(k));
    shared_input.prepare(shared_h, S, planes_for(shared_down));
    const float gate = cpu::sigmoid(shared_logit[0]);
    pool_.parallel_for(H, [&](int64_t begin, int64_t end) {
      // Per chunk of output rows: each slot's expert rows as one ordered stream (not the k
      // experts' rows interleaved row by row), then combined per row in slot order as before.
      thread_local std::vector<float> dots;  // f32 [k + 1, kRowChunk]: slot j's, then shared
      grow(dots, (k + 1) * kRowChunk);
      for (int64_t r0 = begin; r0 < end; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, end - r0);
        for (int64_t j = 0; j < k; ++j) {
          decode_inputs_[static_cast<size_t>(j)].dots(down, ids[j] * H + r0, rows, dots.data() + j * kRowChunk);
        }
        shared_input.dots(shared_down, r0, rows, dots.data() + k * kRowChunk);
        for (int64_t r = 0; r < rows; ++r) {
          float acc = 0.0f;
          for (int64_t j = 0; j < k; ++j) acc = add_weighted(acc, weights[j], dots[static_cast<size_t>(j * kRowChunk + r)]);
          out[r0 + r] = add_weighted(acc, gate, dots[static_cast<size_t>(k * kRowChunk + r)]);
        }
      }
    });
    return;
  }
  const ExpertGroups groups(ids, n * k, down.experts);
  if (precision_ != CpuPrecision::exact) {
    // Prefill on integer dots: the n * k slots and the n shared rows quantised once; per chunk
    // of output rows, every slot's dot (expert by expert) and the shared dots, then combined per
    // token in slot order as decode does, so out[t] is bit for bit the n == 1 result.
    const auto slots_total = static_cast<size_t>(n * k);
    // Both quantisations' room first: growing prefill_q8_ between them would move the slots'.
    if (prefill_q8_.size() < slots_total + static_cast<size_t>(n)) {
      prefill_q8_.resize(slots_total + static_cast<size_t>(n));
      prefill_ptrs_.resize(slots_total + static_cast<size_t>(n));
    }
    const cpu::Q8Activations* const* slot_q =
        quantize_tokens(h, n * k, I, 0, planes_for(down), "expert_down_combine");
    const cpu::Q8Activations* const* shared_q = quantize_tokens(
        shared_h, n, S, slots_total, planes_for(shared_down), "expert_down_combine");
    const std::vector<int64_t> starts = gather_tokens(groups, slot_q, 1, expert_ptrs_);
    pool_.parallel_for(H, [&](int64_t begin, int64_t end) {
      // f32 [n * k, kRowChunk] slot dots, [slots of one expert, kRowChunk], [n, kRowChunk] shared.
      thread_local std::vector<float> dots, expert_dots, shared_dots;
      for (int64_t r0 = begin; r0 < end; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, end - r0);
        grow(dots, n * k * rows);
        grow(shared_dots, n * rows);
        for (size_t which = 0; which < groups.experts.size(); ++which) {
          const std::vector<int64_t>& slots = groups.slots[which];
          const auto count = static_cast<int64_t>(slots.size());
          grow(expert_dots, count * rows);
          cpu::int8_rows_dot_tokens(down, groups.experts[which] * H + r0, rows,
                                    expert_ptrs_.data() + starts[which], count, expert_dots.data(), rows);
          for (int64_t i = 0; i < count; ++i) {
            std::copy_n(expert_dots.data() + i * rows, rows, dots.data() + slots[static_cast<size_t>(i)] * rows);
          }
        }
        cpu::int8_rows_dot_tokens(shared_down, r0, rows, shared_q, n, shared_dots.data(), rows);
        for (int64_t t = 0; t < n; ++t) {
          const float gate = cpu::sigmoid(shared_logit[t]);
          for (int64_t r = 0; r < rows; ++r) {
            float acc = 0.0f;
            for (int64_t j = 0; j < k; ++j) {
              acc = add_weighted(acc, weights[t * k + j], dots[static_cast<size_t>((t * k + j) * rows + r)]);
            }
            out[t * H + r0 + r] = add_weighted(acc, gate, shared_dots[static_cast<size_t>(t * rows + r)]);
          }
        }
      }
    });
    return;
  }
  pool_.parallel_for(H, [&](int64_t begin, int64_t end) {
    thread_local cpu::DecodedRow row;
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t t = 0; t < n; ++t) out[t * H + r] = 0.0f;
      for (size_t which = 0; which < groups.experts.size(); ++which) {
        row.load(down, groups.experts[which] * H + r);
        for (int64_t slot : groups.slots[which]) {
          out[(slot / k) * H + r] += weights[slot] * row.dot(h + slot * I);
        }
      }
      row.load(shared_down, r);
      for (int64_t t = 0; t < n; ++t) {
        const float gate = cpu::sigmoid(shared_logit[t]);
        out[t * H + r] += gate * row.dot(shared_h + t * S);
      }
    }
  });
}

}  // namespace lily

// CPU mixture of experts: gathered gate/up + SwiGLU, and down + weighted combine + shared expert.
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


}  // namespace

void CpuBackend::expert_swiglu(const QuantView& gate, const QuantView& up, const float* x,
                               const int32_t* ids, int64_t n, int64_t k, float* h) {
  contract::check_expert_swiglu(gate, up, x, ids, n, k, h);
  check_ids(ids, n * k, gate.experts, "expert_swiglu");
  const auto I = static_cast<int64_t>(gate.out);
  const auto in = static_cast<int64_t>(gate.in);
  if (n == 1) {  // decode: every (slot, row) is independent work
    DecodeInput& input = decode_input(0);
    input.prepare(x, in, precision_);
    pool_.parallel_for(k * I, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t slot = item / I;
        const int64_t e = ids != nullptr ? ids[slot] : 0;
        const float g = input.dot(gate, e * I + item % I);
        const float u = input.dot(up, e * I + item % I);
        h[item] = cpu::silu(g) * u;
      }
    });
    return;
  }
  const ExpertGroups groups(ids, n * k, gate.experts);
  const auto used = static_cast<int64_t>(groups.experts.size());
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
    for (int64_t j = 0; j < k; ++j) decode_input(static_cast<size_t>(j)).prepare(h + j * I, I, precision_);
    DecodeInput& shared_input = decode_input(static_cast<size_t>(k));
    shared_input.prepare(shared_h, S, precision_);
    const float gate = cpu::sigmoid(shared_logit[0]);
    pool_.parallel_for(H, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float acc = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          acc += weights[j] * decode_inputs_[static_cast<size_t>(j)].dot(down, ids[j] * H + r);
        }
        out[r] = acc + gate * shared_input.dot(shared_down, r);
      }
    });
    return;
  }
  const ExpertGroups groups(ids, n * k, down.experts);
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

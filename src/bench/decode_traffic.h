// What one decode step must move through memory, and what one prefill token costs in FLOPs.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"

namespace lily {

// Bytes one decode step reads or writes at least, whatever the implementation (the floor's
// numerator). Weights are the checkpoint's stored bytes; state bytes use lily's state dtypes:
// the KV cache's (kv_dtype, --kv-cache), f32 for the Gated DeltaNet state.
struct DecodeTraffic {
  uint64_t dense_weight_bytes = 0;   // every non-expert tensor incl. lm_head, norms, the router
  uint64_t routed_expert_bytes = 0;  // top_k of num_experts routed experts, every layer
  uint64_t shared_expert_bytes = 0;  // the shared expert (gate, up, down), every layer
  uint64_t embedding_row_bytes = 0;  // one row of the quantized embedding table
  uint64_t kv_read_bytes = 0;        // K and V of every past token, every attention layer
  uint64_t kv_write_bytes = 0;       // the new token's K and V
  uint64_t delta_net_state_bytes = 0;  // recurrent state + conv window, read and written
  uint64_t total() const {
    return dense_weight_bytes + routed_expert_bytes + shared_expert_bytes + embedding_row_bytes +
           kv_read_bytes + kv_write_bytes + delta_net_state_bytes;
  }
};

// The traffic of a decode step that attends over `position` earlier tokens.
DecodeTraffic decode_traffic(const Checkpoint& checkpoint, int64_t position, KvDtype kv_dtype);

// Multiply-add FLOPs (2 per MAC) for one token at `position`: every projection with the
// routed experts counted top_k times, attention scores and values over position + 1 keys, and
// the delta rule's state update. The embedding lookup costs none.
double token_flops(const Checkpoint& checkpoint, int64_t position);
// The sum of token_flops over positions 0 .. length-1 (a prompt prefilled from empty).
double prefill_flops(const Checkpoint& checkpoint, int64_t length);

}  // namespace lily

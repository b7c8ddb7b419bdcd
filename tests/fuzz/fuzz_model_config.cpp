// libFuzzer target: lily::parse_strict_json then lily::parse_model_config on arbitrary text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/model_config.h"
#include "core/error.h"
#include "core/strict_json.h"

namespace {

bool same_shape(const lily::ModelShape& a, const lily::ModelShape& b) {
  return a.hidden_size == b.hidden_size && a.num_layers == b.num_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
         a.num_experts == b.num_experts && a.vocab_size == b.vocab_size &&
         a.moe_intermediate_size == b.moe_intermediate_size &&
         a.linear_num_value_heads == b.linear_num_value_heads;
}

}  // namespace

// Only InputError may leave the parsers; anything else crashes the fuzzer.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    // Depth 8 as load_model_config uses for config.json.
    const lily::Json config = lily::parse_strict_json(text, "config.json", 8);
    const lily::ModelConfig parsed = lily::parse_model_config(config, "config.json");
    // Accepted means exactly one of the two known shapes, and in-vocabulary EOS ids.
    const lily::ModelShape want = parsed.profile == lily::Profile::tiny
                                      ? lily::ModelShape::tiny()
                                      : lily::ModelShape::production();
    if (!same_shape(parsed.shape, want)) std::abort();
    for (uint32_t id : parsed.eos_token_ids) {
      if (id >= parsed.shape.vocab_size) std::abort();
    }
  } catch (const lily::InputError&) {
  }
  return 0;
}

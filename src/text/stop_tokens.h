// The ids that end generation: tokenizer_config.json's eos_token plus config.json's eos ids.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/strict_json.h"
#include "text/tokenizer.h"

namespace lily {

// As Lily does: (1) tokenizer_config.json's "eos_token", given as a string or as an
// object with a string "content" (null or absent: none), mapped to its id when the
// tokenizer knows it (an unknown text adds nothing, as in Lily); then (2) every id of
// config.json's eos_token_id (lily::ModelConfig::eos_token_ids). De-duplicated, in that
// order. For Qwen3.6 and the synthetic checkpoints: {<|im_end|>, <|endoftext|>}.
// A wrongly typed eos_token throws InputError naming `where` (e.g. the file path).
std::vector<uint32_t> stop_token_ids(const Tokenizer& tokenizer, const Json& tokenizer_config,
                                     const std::vector<uint32_t>& config_eos_ids,
                                     std::string_view where = "tokenizer_config.json");

}  // namespace lily

// Reading and strictly checking a Qwen-style tokenizer.json (HF tokenizers format).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/bpe.h"
#include "text/pretokenizer.h"

namespace lily {

// One entry of tokenizer.json's added_tokens.
struct AddedTokenInfo {
  uint32_t id;
  std::string content;
  bool special;  // dropped by decode(..., skip_special_tokens = true)
};

// The checked content of a tokenizer.json. Not movable: `vocab_index` points into
// `vocab_arena`.
struct TokenizerSpec {
  SplitPattern pattern = SplitPattern::qwen35;
  // Vocab token strings (ByteLevel form, e.g. "Ġthe"), by id: bytes
  // [vocab_offsets[id], vocab_offsets[id + 1]) of vocab_arena. Ids are exactly 0..N-1.
  std::string vocab_arena;
  std::vector<uint32_t> vocab_offsets;
  std::unordered_map<std::string_view, uint32_t> vocab_index;
  std::vector<MergeRule> merges;       // rank order, resolved to ids
  std::vector<AddedTokenInfo> added;   // ids N, N+1, ... in this order
  std::array<uint32_t, 256> byte_ids{};

  TokenizerSpec() = default;
  TokenizerSpec(const TokenizerSpec&) = delete;
  TokenizerSpec& operator=(const TokenizerSpec&) = delete;

  uint32_t vocab_size() const { return static_cast<uint32_t>(vocab_offsets.size() - 1); }
  std::string_view vocab_token(uint32_t id) const {
    return std::string_view(vocab_arena).substr(vocab_offsets[id], vocab_offsets[id + 1] - vocab_offsets[id]);
  }
};

// Parses and checks tokenizer.json text. Accepted is exactly the Qwen2/Qwen3/Qwen3.5/
// Qwen3.6 kind:
//   version "1.0"; truncation and padding null;
//   normalizer {"type": "NFC"};
//   pre_tokenizer Sequence[Split{pattern {"Regex": one of the two Qwen patterns},
//     behavior "Isolated", invert false}, ByteLevel{add_prefix_space false,
//     trim_offsets false, use_regex false}];
//   post_processor null or that ByteLevel; decoder that ByteLevel;
//   model BPE with dropout null, unk_token null, continuing_subword_prefix and
//     end_of_word_suffix "" or null, fuse_unk, byte_fallback and ignore_merges false
//     (absent fields take HF's defaults, which are these), vocab ids exactly 0..N-1
//     with all 256 ByteLevel characters, merges as "a b" strings or ["a", "b"] pairs
//     (one form throughout) whose parts and concatenation are in the vocab;
//   added_tokens with ids N, N+1, ... in order, non-empty distinct contents not in the
//     vocab, single_word, lstrip, rstrip and normalized false (normalized must be
//     given: HF's default is true).
// Unknown fields are refused too. Anything else throws InputError naming `what`, the
// field, what was found and what was expected. Malformed JSON, nesting deeper than 32
// levels and duplicate keys are refused.
std::unique_ptr<TokenizerSpec> parse_tokenizer_json(std::string_view text, std::string_view what);

}  // namespace lily

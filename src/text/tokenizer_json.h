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
  // model.ignore_merges: a whole pre-token that is a vocab token is that token, unmerged.
  bool ignore_merges = false;

  TokenizerSpec() = default;
  TokenizerSpec(const TokenizerSpec&) = delete;
  TokenizerSpec& operator=(const TokenizerSpec&) = delete;

  uint32_t vocab_size() const { return static_cast<uint32_t>(vocab_offsets.size() - 1); }
  std::string_view vocab_token(uint32_t id) const {
    return std::string_view(vocab_arena).substr(vocab_offsets[id], vocab_offsets[id + 1] - vocab_offsets[id]);
  }
};

// Parses and checks tokenizer.json text. Accepted is the Qwen2/Qwen3/Qwen3.5/Qwen3.6 kind
// in every variant that HF tokenizers reads and that cannot change its ids or decoded
// text (docs/checkpoint.md has the table of fields, decisions and reasons):
//   version "1.0" or absent; truncation and padding null or absent;
//   normalizer NFC (or a Sequence of just NFC);
//   pre_tokenizer Sequence[Split{pattern {"Regex": one of the two Qwen patterns},
//     behavior "Isolated", invert true or false}, ByteLevel{add_prefix_space false,
//     use_regex false, trim_offsets true or false}];
//   post_processor absent, null, ByteLevel or a Sequence of ByteLevels, and decoder
//     ByteLevel (or a Sequence of just that), each ByteLevel with any booleans for
//     add_prefix_space and trim_offsets (required by HF) and use_regex (optional);
//   model BPE (or without "type") with dropout null or 0, unk_token null or any string,
//     fuse_unk and byte_fallback any boolean or null (they act only on characters missing
//     from the vocab, and the vocab must hold all 256 ByteLevel characters),
//     continuing_subword_prefix and end_of_word_suffix "" or null, ignore_merges any
//     boolean or null (absent fields take HF's defaults, which are acceptable), vocab ids
//     exactly 0..N-1, merges as "a b" strings or ["a", "b"] pairs (one form throughout)
//     whose parts and concatenation are in the vocab;
//   added_tokens with ids N, N+1, ... in order, non-empty distinct contents not in the
//     vocab, single_word, lstrip, rstrip and normalized false and special a boolean (all
//     five required, as HF requires them).
// Unknown fields are refused too. Anything else throws InputError naming `what`, the
// field, what was found, what was expected and, where it is not obvious, what it would
// change. Malformed JSON, nesting deeper than 32 levels and duplicate keys are refused.
std::unique_ptr<TokenizerSpec> parse_tokenizer_json(std::string_view text, std::string_view what);

}  // namespace lily

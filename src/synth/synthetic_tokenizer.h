// A synthetic byte-level BPE tokenizer in the exact Qwen3.6 tokenizer.json format.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace lily {

// The 33 added tokens of Qwen3.5/3.6, in id order (production ids 248044..248076).
// `special` is the flag tokenizer.json carries: special tokens are dropped when
// decoding with skip_special_tokens, the others (tool/think markers, FIM) are kept.
struct AddedTokenSpec {
  const char* content;
  bool special;
};
extern const std::array<AddedTokenSpec, 33> kQwen36AddedTokens;

// The Qwen3.5/3.6 pre-tokenizer split pattern, exactly as in the checkpoint's tokenizer.json.
extern const char* const kQwen36SplitPattern;

struct SyntheticTokenizerFiles {
  std::string tokenizer_json;         // HF tokenizers format, BPE model
  std::string tokenizer_config_json;  // eos <|im_end|>, pad <|endoftext|>
  uint32_t endoftext_id = 0;
  uint32_t im_end_id = 0;
};

// `bpe_tokens` regular ids (256 byte tokens + merges), then the 33 added tokens right
// after them. Merges come from pseudo-words in several scripts (English-like words, code,
// whitespace runs, CJK, kana, Cyrillic, Greek, Arabic, Devanagari with combining marks,
// emoji), so real text exercises real merges. Deterministic for a given seed.
SyntheticTokenizerFiles make_synthetic_tokenizer(uint64_t bpe_tokens, uint64_t seed);

}  // namespace lily

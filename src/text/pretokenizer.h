// The Split pre-tokenizer of Qwen's tokenizer.json, hand-written over Unicode classes.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace lily {

// The two split regexes lily accepts (tokenizer.json pre_tokenizer Split, behavior
// Isolated), each matched exactly as HF tokenizers' Oniguruma engine does:
//   qwen35: Qwen3.5/3.6   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|
//                         ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2:  Qwen2/Qwen3   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//                         ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
enum class SplitPattern { qwen35, qwen2 };

// The exact pattern strings as they appear in tokenizer.json.
extern const std::string_view kQwen35SplitRegex;
extern const std::string_view kQwen2SplitRegex;

// One pre-token: bytes [begin, end) of the split text.
struct Piece {
  size_t begin;
  size_t end;
};

// Splits `text` (valid UTF-8, already NFC-normalised, one stretch between added tokens)
// into consecutive non-empty pieces that cover it exactly. Leftmost-first alternation
// with Oniguruma's backtracking, evaluated without a regex engine:
//   - (?i:...) is case-insensitive with Unicode simple case folding, so 's also matches
//     'S and 'ſ (U+017F, whose fold is s);
//   - \s+(?!\S) takes a whitespace run up to the end of the text, or all but its last
//     character when a non-space follows (runs of one such character fall to \s+);
//   - \s*[\r\n]+ ends right after the run's last CR or LF.
// Linear time in the length of `text`. `out` is cleared first.
void split_pretokens(std::string_view text, SplitPattern pattern, std::vector<Piece>& out);

}  // namespace lily

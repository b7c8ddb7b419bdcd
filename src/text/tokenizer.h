// The lily tokenizer: Qwen's byte-level BPE from tokenizer.json, encode and decode.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/pretokenizer.h"
#include "text/tokenizer_json.h"

namespace lily {

// Encodes and decodes exactly as HF tokenizers does with encode(text,
// add_special_tokens=false) and decode(ids, skip_special_tokens), for the tokenizer.json
// kinds parse_tokenizer_json accepts:
//   encode: added tokens are found in the raw text first (leftmost, then longest); each
//     stretch between them is NFC-normalised, split by the Split pattern, and every piece
//     is BPE-merged from its bytes (with model.ignore_merges, a piece that is itself a vocab
//     token is taken whole, as HF does). Nothing is added at either end.
//   decode: ids map to their tokens' bytes (ByteLevel decoding), added tokens whose
//     "special" flag is set are dropped when skip_special_tokens is true, ids that are
//     not in the tokenizer are dropped (as HF does), and ill-formed UTF-8 in the joined
//     bytes becomes U+FFFD per maximal ill-formed subpart (Rust's from_utf8_lossy).
// Thread-safe: all methods are const; the BPE word cache is synchronised.
class Tokenizer {
 public:
  // Reads and checks the file (at most kMaxFileBytes). Throws InputError naming the file,
  // the field, what was found and what was expected.
  static Tokenizer from_file(const std::string& path);
  // The same from text in memory; `what` names it in messages.
  static Tokenizer from_json(std::string_view json_text, std::string_view what);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text`, which must be valid UTF-8 of at most kMaxTextBytes: ill-formed
  // UTF-8 is refused with InputError (naming the byte offset) rather than repaired; HF's
  // Rust API cannot receive it at all (&str), and its bindings replace it before encoding.
  std::vector<uint32_t> encode(std::string_view text) const;
  // Appends the ids of `text` to `out` (same rules).
  void encode(std::string_view text, std::vector<uint32_t>& out) const;

  // The text of `ids` (valid UTF-8, see the class comment).
  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens) const;

  // The bytes `id` contributes to decode() (empty for unknown ids and, with
  // skip_special_tokens, for special added tokens). Not necessarily whole characters.
  std::string_view token_bytes(uint32_t id, bool skip_special_tokens) const;

  // The id of a token given as its tokenizer.json string: an added token's content
  // ("<|im_end|>") or a vocab key in ByteLevel form ("Ġthe"); nullopt when neither.
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  // The tokenizer.json string of `id`; nullopt for unknown ids.
  std::optional<std::string_view> id_to_token(uint32_t id) const;

  uint32_t vocab_size() const;  // BPE ids 0..vocab_size()-1
  uint32_t id_count() const;    // vocab plus added tokens
  const std::vector<AddedTokenInfo>& added_tokens() const;
  bool is_special(uint32_t id) const;  // an added token flagged "special"
  SplitPattern split_pattern() const;

  // Empties the BPE word cache (for cold-cache benchmarks).
  void clear_cache() const;

  static constexpr uint64_t kMaxFileBytes = uint64_t{512} << 20;
  static constexpr size_t kMaxTextBytes = size_t{1} << 30;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns ids into text one at a time, for streaming. Only whole characters come out: the
// bytes of a character split across tokens are held back (at most 3) until it completes.
// Ill-formed bytes come out as U+FFFD as soon as they can no longer become well-formed.
// The concatenation of all push() results and finish() equals
// tokenizer.decode(all ids, skip_special_tokens). Keeps a reference to the tokenizer.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  // Adds one id; returns the text that became complete (possibly empty).
  std::string push(uint32_t id);
  // End of the stream: a held-back incomplete character becomes one U+FFFD. The object can
  // be reused afterwards for a new stream.
  std::string finish();
  // Bytes currently held back (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace lily

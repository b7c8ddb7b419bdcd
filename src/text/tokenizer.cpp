// The lily tokenizer: Qwen's byte-level BPE from tokenizer.json, encode and decode.
#include "text/tokenizer.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/unicode.h"
#include "text/utf8.h"

namespace lily {

struct Tokenizer::Impl {
  std::unique_ptr<TokenizerSpec> spec;
  std::unique_ptr<BpeModel> bpe;
  AddedTokenMatcher matcher;
  // Decoded bytes of every id: [bytes_offsets[id], bytes_offsets[id + 1]) of bytes_arena.
  std::string bytes_arena;
  std::vector<uint32_t> bytes_offsets;
  std::vector<bool> special;  // by id

  uint32_t id_count() const { return static_cast<uint32_t>(bytes_offsets.size() - 1); }

  // HF's BPE with ignore_merges: a piece whose ByteLevel string is a vocab token is that
  // one token, even where merging its bytes would give other tokens.
  bool emit_whole_token(std::string_view word, std::vector<uint32_t>& out) const {
    const auto it = spec->vocab_index.find(byte_level::encode(word));
    if (it == spec->vocab_index.end()) return false;
    out.push_back(it->second);
    return true;
  }

  void encode_stretch(std::string_view raw, std::vector<uint32_t>& out) const {
    thread_local std::string normalized;
    thread_local std::vector<Piece> pieces;
    normalized.clear();
    unicode::append_nfc(raw, normalized);
    split_pretokens(normalized, spec->pattern, pieces);
    const std::string_view text(normalized);
    for (const Piece& piece : pieces) {
      const std::string_view word = text.substr(piece.begin, piece.end - piece.begin);
      if (spec->ignore_merges && emit_whole_token(word, out)) continue;
      bpe->encode_word(word, out);
    }
    if (normalized.capacity() > (size_t{1} << 20)) normalized = std::string();
    if (pieces.capacity() > (size_t{1} << 16)) pieces = std::vector<Piece>();
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw InputError("cannot open tokenizer file " + path + ": " +
                     (std::filesystem::exists(path, error) ? "not a regular file" : "no such file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open tokenizer file " + path);
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw InputError("cannot read " + path);
  if (static_cast<uint64_t>(size) > kMaxFileBytes) {
    throw InputError(path + ": file is " + std::to_string(size) + " bytes, expected at most " +
                     std::to_string(kMaxFileBytes));
  }
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.read(text.data(), size)) throw InputError("cannot read " + path);
  return from_json(text, path);
}

Tokenizer Tokenizer::from_json(std::string_view json_text, std::string_view what) {
  auto impl = std::make_unique<Impl>();
  impl->spec = parse_tokenizer_json(json_text, what);
  const TokenizerSpec& spec = *impl->spec;
  impl->bpe = std::make_unique<BpeModel>(spec.byte_ids, spec.merges);
  const uint32_t n = spec.vocab_size();
  const auto total = static_cast<uint32_t>(n + spec.added.size());
  impl->bytes_offsets.reserve(size_t{total} + 1);
  impl->bytes_arena.reserve(spec.vocab_arena.size());
  impl->special.assign(total, false);
  for (uint32_t id = 0; id < n; ++id) {
    impl->bytes_offsets.push_back(static_cast<uint32_t>(impl->bytes_arena.size()));
    impl->bytes_arena += byte_level::decode_token(spec.vocab_token(id));
  }
  for (const AddedTokenInfo& added : spec.added) {
    impl->bytes_offsets.push_back(static_cast<uint32_t>(impl->bytes_arena.size()));
    impl->bytes_arena += byte_level::decode_token(added.content);
    impl->special[added.id] = added.special;
    impl->matcher.add(added.content, added.id);
  }
  impl->bytes_offsets.push_back(static_cast<uint32_t>(impl->bytes_arena.size()));
  return Tokenizer(std::move(impl));
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids;
  encode(text, ids);
  return ids;
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  if (text.size() > kMaxTextBytes) {
    throw InputError("text to tokenize is " + std::to_string(text.size()) +
                     " bytes, expected at most " + std::to_string(kMaxTextBytes));
  }
  if (const size_t bad = utf8::find_invalid(text); bad != std::string_view::npos) {
    throw InputError("text to tokenize is not valid UTF-8 (ill-formed sequence at byte " +
                     std::to_string(bad) + ")");
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const auto match = impl_->matcher.find(text, pos);
    const size_t stop = match ? match->begin : text.size();
    if (stop > pos) impl_->encode_stretch(text.substr(pos, stop - pos), out);
    if (!match) break;
    out.push_back(match->id);
    pos = match->end;
  }
}

std::string_view Tokenizer::token_bytes(uint32_t id, bool skip_special_tokens) const {
  if (id >= impl_->id_count()) return {};
  if (skip_special_tokens && impl_->special[id]) return {};
  const uint32_t begin = impl_->bytes_offsets[id];
  return std::string_view(impl_->bytes_arena).substr(begin, impl_->bytes_offsets[id + 1] - begin);
}

std::string Tokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (uint32_t id : ids) bytes += token_bytes(id, skip_special_tokens);
  if (utf8::find_invalid(bytes) == std::string_view::npos) return bytes;
  return utf8::lossy(bytes);
}

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedTokenInfo& added : impl_->spec->added) {
    if (added.content == token) return added.id;
  }
  auto it = impl_->spec->vocab_index.find(token);
  if (it == impl_->spec->vocab_index.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> Tokenizer::id_to_token(uint32_t id) const {
  const TokenizerSpec& spec = *impl_->spec;
  if (id < spec.vocab_size()) return spec.vocab_token(id);
  if (id < impl_->id_count()) return std::string_view(spec.added[id - spec.vocab_size()].content);
  return std::nullopt;
}

uint32_t Tokenizer::vocab_size() const { return impl_->spec->vocab_size(); }
uint32_t Tokenizer::id_count() const { return impl_->id_count(); }
const std::vector<AddedTokenInfo>& Tokenizer::added_tokens() const { return impl_->spec->added; }
bool Tokenizer::is_special(uint32_t id) const { return id < impl_->id_count() && impl_->special[id]; }
SplitPattern Tokenizer::split_pattern() const { return impl_->spec->pattern; }
void Tokenizer::clear_cache() const { impl_->bpe->clear_cache(); }

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(uint32_t id) {
  pending_ += tokenizer_.token_bytes(id, skip_special_);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const utf8::Sequence seq = utf8::inspect(pending_, i);
    if (seq.kind == utf8::Sequence::Kind::incomplete) break;  // wait for more bytes
    if (seq.kind == utf8::Sequence::Kind::valid) {
      out.append(pending_, i, seq.length);
    } else {
      out += utf8::kReplacement;
    }
    i += seq.length;
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out = pending_.empty() ? std::string() : std::string(utf8::kReplacement);
  pending_.clear();
  return out;
}

}  // namespace lily

// A synthetic byte-level BPE tokenizer in the exact Qwen3.6 tokenizer.json format.
#include "synth/synthetic_tokenizer.h"

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "synth/prng.h"

namespace lily {

const std::array<AddedTokenSpec, 33> kQwen36AddedTokens{{
    {"<|endoftext|>", true},     {"<|im_start|>", true},     {"<|im_end|>", true},
    {"<|object_ref_start|>", true}, {"<|object_ref_end|>", true}, {"<|box_start|>", true},
    {"<|box_end|>", true},       {"<|quad_start|>", true},   {"<|quad_end|>", true},
    {"<|vision_start|>", true},  {"<|vision_end|>", true},   {"<|vision_pad|>", true},
    {"<|image_pad|>", true},     {"<|video_pad|>", true},    {"<tool_call>", false},
    {"</tool_call>", false},     {"<|fim_prefix|>", false},  {"<|fim_middle|>", false},
    {"<|fim_suffix|>", false},   {"<|fim_pad|>", false},     {"<|repo_name|>", false},
    {"<|file_sep|>", false},     {"<tool_response>", false}, {"</tool_response>", false},
    {"<think>", false},          {"</think>", false},        {"<|audio_start|>", true},
    {"<|audio_end|>", true},     {"<tts_pad>", true},        {"<tts_text_bos>", true},
    {"<tts_text_eod>", true},    {"<tts_text_bos_single>", true}, {"<|audio_pad|>", true},
}};

const char* const kQwen36SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

using OrderedJson = nlohmann::ordered_json;

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// GPT-2's byte -> printable code point table (printable bytes map to themselves, the
// rest to 256 + n). Byte tokens take ids 0..255 in this table's order, as in Qwen.
struct ByteLevelAlphabet {
  std::array<uint8_t, 256> order{};      // id -> byte
  std::array<std::string, 256> glyph{};  // byte -> UTF-8 of its code point
  ByteLevelAlphabet() {
    std::array<bool, 256> printable{};
    size_t n = 0;
    auto take = [&](int lo, int hi) {
      for (int b = lo; b <= hi; ++b) {
        printable[static_cast<size_t>(b)] = true;
        order[n++] = static_cast<uint8_t>(b);
        append_utf8(glyph[static_cast<size_t>(b)], static_cast<uint32_t>(b));
      }
    };
    take(33, 126);
    take(161, 172);
    take(174, 255);
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      if (printable[static_cast<size_t>(b)]) continue;
      order[n++] = static_cast<uint8_t>(b);
      append_utf8(glyph[static_cast<size_t>(b)], 256 + extra++);
    }
  }
  std::string encode(std::string_view bytes) const {
    std::string out;
    for (char c : bytes) out += glyph[static_cast<uint8_t>(c)];
    return out;
  }
};

// Grows a BPE vocabulary: each word is built by a random binary split tree, adding the
// merge (left, right) for every new piece, so every merge's parts exist before it.
class MergeBuilder {
 public:
  MergeBuilder(const ByteLevelAlphabet& alphabet, uint64_t target_tokens) : target_(target_tokens) {
    for (uint8_t byte : alphabet.order) add_token(std::string(1, static_cast<char>(byte)));
  }
  bool full() const { return tokens_.size() >= target_; }

  // Returns whether `piece` is a token after the call.
  bool build(std::string_view piece, SplitMix64& rng) {
    if (ids_.count(std::string(piece)) != 0) return true;
    if (piece.size() < 2 || full()) return false;
    const size_t split = 1 + static_cast<size_t>(rng.below(piece.size() - 1));
    if (!build(piece.substr(0, split), rng) || !build(piece.substr(split), rng)) return false;
    if (full()) return false;
    merges_.emplace_back(std::string(piece.substr(0, split)), std::string(piece.substr(split)));
    add_token(std::string(piece));
    return true;
  }

  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<std::pair<std::string, std::string>>& merges() const { return merges_; }

 private:
  void add_token(std::string token) {
    ids_.emplace(token, static_cast<uint32_t>(tokens_.size()));
    tokens_.push_back(std::move(token));
  }
  uint64_t target_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::pair<std::string, std::string>> merges_;
};

std::string pick(SplitMix64& rng, const std::vector<std::string_view>& options) {
  return std::string(options[static_cast<size_t>(rng.below(options.size()))]);
}

std::string english_word(SplitMix64& rng, uint64_t max_syllables) {
  static const std::vector<std::string_view> onsets = {
      "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "y",
      "th", "st", "ch", "sh", "pr", "tr", "str", "gr", "bl", "wh", "", ""};
  static const std::vector<std::string_view> vowels = {"a", "e", "i", "o", "u", "ea", "ou",
                                                       "io", "ee", "ai", "e", "a"};
  static const std::vector<std::string_view> codas = {"", "", "n", "r", "s", "t", "ng", "nd",
                                                      "st", "ll", "ck", "tion", "ed", "ly"};
  std::string word;
  const uint64_t syllables = 1 + rng.below(max_syllables);
  for (uint64_t i = 0; i < syllables; ++i) word += pick(rng, onsets) + pick(rng, vowels);
  word += pick(rng, codas);
  return word;
}

std::string codepoint_word(SplitMix64& rng, uint32_t lo, uint32_t hi, uint64_t max_chars) {
  std::string word;
  const uint64_t chars = 1 + rng.below(max_chars);
  for (uint64_t i = 0; i < chars; ++i) {
    append_utf8(word, lo + static_cast<uint32_t>(rng.below(hi - lo + 1)));
  }
  return word;
}

// Devanagari: consonant, optionally followed by a combining vowel sign (\p{M}).
std::string devanagari_word(SplitMix64& rng, uint64_t max_chars) {
  std::string word;
  const uint64_t chars = 1 + rng.below(max_chars);
  for (uint64_t i = 0; i < chars; ++i) {
    append_utf8(word, 0x0915 + static_cast<uint32_t>(rng.below(0x0939 - 0x0915 + 1)));
    if (rng.below(2) == 0) append_utf8(word, 0x093e + static_cast<uint32_t>(rng.below(15)));
  }
  return word;
}

std::string next_word(SplitMix64& rng, double progress) {
  const auto grow = static_cast<uint64_t>(1.0 + progress * 3.0);
  const uint64_t category = rng.below(100);
  const bool space = rng.below(3) != 0;
  std::string word;
  if (category < 55) {
    word = english_word(rng, grow + 1);
    const uint64_t casing = rng.below(10);
    if (casing < 2) word[0] = static_cast<char>(word[0] - 'a' + 'A');
    if (casing == 2) {
      for (char& c : word) c = static_cast<char>(c - 'a' + 'A');
    }
    return (space ? " " : "") + word;
  }
  if (category < 64) {
    static const std::vector<std::string_view> code = {
        "def", "return", "self", "int", "void", "std", "::", "->", "==", "!=", "();", "{}",
        "//", "/*", "*/", "#include", "import", "const", "auto", "for", "while", "if", "else",
        "){", "});", "[]", "+=", "&&", "||", "=>", "null", "true", "false", "\"\"", "'s", "'t",
        "'re", "'ll", "'ve", "'m", "'d", "...", ".\n", ",\n", ":\n", "\"\n"};
    return pick(rng, code);
  }
  if (category < 69) {
    static const std::vector<std::string_view> blanks = {" ", "\n", "\t", "\r\n"};
    const std::string unit = pick(rng, blanks);
    const uint64_t repeat = 2 + rng.below(8 * grow);
    for (uint64_t i = 0; i < repeat; ++i) word += unit;
    return word;
  }
  if (category < 79) return codepoint_word(rng, 0x4e00, 0x62ff, 1 + grow);  // CJK
  if (category < 82) return codepoint_word(rng, 0x3041, 0x3096, 1 + grow);  // hiragana
  if (category < 87) return (space ? " " : "") + codepoint_word(rng, 0x0430, 0x044f, 2 + grow);
  if (category < 89) return (space ? " " : "") + codepoint_word(rng, 0x03b1, 0x03c9, 2 + grow);
  if (category < 92) return (space ? " " : "") + codepoint_word(rng, 0x0627, 0x064a, 2 + grow);
  if (category < 95) return (space ? " " : "") + devanagari_word(rng, 1 + grow);
  if (category < 97) return codepoint_word(rng, 0x1f600, 0x1f64f, 1);  // emoji
  static const std::vector<std::string_view> punct = {".", ",", "!", "?", ":", ";", "-", "(",
                                                      ")", "\"", "'", "%", "$", "*", "/"};
  for (uint64_t i = 0, n = 1 + rng.below(3); i < n; ++i) word += pick(rng, punct);
  return (space ? " " : "") + word;
}

}  // namespace

SyntheticTokenizerFiles make_synthetic_tokenizer(uint64_t bpe_tokens, uint64_t seed) {
  if (bpe_tokens < 256) throw std::invalid_argument("a byte-level BPE needs at least 256 tokens");
  const ByteLevelAlphabet alphabet;
  MergeBuilder builder(alphabet, bpe_tokens);
  SplitMix64 rng(stream_seed(seed, "tokenizer.merges"));

  // The most common English and code words first, so their merges rank highest.
  static const std::vector<std::string_view> common = {
      " the", " and", " of", " to", " in", " is", " that", " for", " it", " with", " as", " was",
      " on", " be", " are", " this", " by", " you", " not", " or", " have", " from", " at",
      " an", " but", " they", " which", " one", " all", " we", " can", " there", " their",
      "The", "In", "It", "This", " I", " a", "ing", "ed", "er", "es", "ly", "ion", "   ", "    ",
      "\n\n", "  ", "\t\t", " user", " assistant", "user", "assistant", "system", " think"};
  for (std::string_view word : common) builder.build(word, rng);
  while (!builder.full()) {
    const double progress =
        static_cast<double>(builder.tokens().size()) / static_cast<double>(bpe_tokens);
    builder.build(next_word(rng, progress), rng);
  }

  // The vocab is written by hand in id order: ordered_json's object lookup is linear,
  // which is quadratic over 248k entries. A placeholder string marks where it goes.
  std::string vocab_text = "{";
  for (size_t id = 0; id < builder.tokens().size(); ++id) {
    vocab_text += id == 0 ? "\n" : ",\n";
    vocab_text += OrderedJson(alphabet.encode(builder.tokens()[id])).dump(-1, ' ', false);
    vocab_text += ": " + std::to_string(id);
  }
  vocab_text += "\n}";
  const std::string vocab_placeholder = "@@lily-vocab@@";
  OrderedJson merges = OrderedJson::array();
  for (const auto& [left, right] : builder.merges()) {
    merges.push_back(OrderedJson::array({alphabet.encode(left), alphabet.encode(right)}));
  }
  OrderedJson added = OrderedJson::array();
  SyntheticTokenizerFiles files;
  OrderedJson added_decoder = OrderedJson::object();
  for (size_t i = 0; i < kQwen36AddedTokens.size(); ++i) {
    const uint64_t id = bpe_tokens + i;
    const AddedTokenSpec& spec = kQwen36AddedTokens[i];
    added.push_back({{"id", id}, {"content", spec.content}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                     {"special", spec.special}});
    added_decoder[std::to_string(id)] = {{"content", spec.content}, {"lstrip", false},
                                         {"normalized", false}, {"rstrip", false},
                                         {"single_word", false}, {"special", spec.special}};
    if (std::string_view(spec.content) == "<|endoftext|>") files.endoftext_id = static_cast<uint32_t>(id);
    if (std::string_view(spec.content) == "<|im_end|>") files.im_end_id = static_cast<uint32_t>(id);
  }
  const OrderedJson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                  {"trim_offsets", false}, {"use_regex", false}};
  OrderedJson tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         OrderedJson::array({{{"type", "Split"},
                              {"pattern", {{"Regex", kQwen36SplitPattern}}},
                              {"behavior", "Isolated"},
                              {"invert", false}},
                             byte_level})}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
        {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab_placeholder},
        {"merges", merges}}},
  };
  files.tokenizer_json = tokenizer.dump(1, ' ', false) + "\n";
  const std::string quoted_placeholder = "\"" + vocab_placeholder + "\"";
  files.tokenizer_json.replace(files.tokenizer_json.find(quoted_placeholder),
                               quoted_placeholder.size(), vocab_text);
  const OrderedJson config = {
      {"add_bos_token", false},        {"add_prefix_space", false},
      {"added_tokens_decoder", added_decoder},
      {"bos_token", nullptr},          {"clean_up_tokenization_spaces", false},
      {"eos_token", "<|im_end|>"},     {"errors", "replace"},
      {"model_max_length", 262144},    {"pad_token", "<|endoftext|>"},
      {"split_special_tokens", false}, {"tokenizer_class", "Qwen2Tokenizer"},
      {"unk_token", nullptr}};
  files.tokenizer_config_json = config.dump(2, ' ', false) + "\n";
  return files;
}

}  // namespace lily

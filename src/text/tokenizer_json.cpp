// Reading and strictly checking a Qwen-style tokenizer.json (HF tokenizers format).
#include "text/tokenizer_json.h"

#include <set>

#include "core/error.h"
#include "core/strict_json.h"
#include "text/byte_level.h"

namespace lily {

namespace {

constexpr size_t kMaxDepth = 32;

// `s` as a JSON string literal, cut to about `max` characters.
std::string json_quoted(std::string_view s, size_t max = 80) {
  const Json j = std::string(s);
  std::string dumped = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (dumped.size() > max) dumped = dumped.substr(0, max - 3) + "...";
  return dumped;
}

// SAX handler: builds a DOM of everything except model.vocab and model.merges, which are
// streamed into compact arrays (the production file holds 248k of each).
class Sax : public nlohmann::json_sax<Json> {
 public:
  struct VocabEntry {
    uint32_t offset;
    uint32_t length;
    uint64_t id;
  };
  struct MergeText {
    uint32_t left_offset;
    uint32_t left_length;
    uint32_t right_offset;
    uint32_t right_length;
  };

  Json root;
  std::string vocab_arena;
  std::vector<VocabEntry> vocab;
  std::string merge_arena;
  std::vector<MergeText> merges;
  bool saw_vocab = false;
  bool saw_merges = false;
  std::string error;

  bool null() override { return value(Json(nullptr)); }
  bool boolean(bool v) override { return value(Json(v)); }
  bool number_integer(number_integer_t v) override { return value(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    if (!frames_.empty() && frames_.back().kind == Kind::vocab) {
      const auto offset = static_cast<uint32_t>(vocab_arena.size());
      vocab_arena += pending_vocab_key_;
      vocab.push_back(VocabEntry{offset, static_cast<uint32_t>(pending_vocab_key_.size()), v});
      return true;
    }
    return value(Json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return value(Json(v)); }
  bool string(string_t& v) override {
    if (!frames_.empty()) {
      Frame& top = frames_.back();
      if (top.kind == Kind::merges) return legacy_merge(v);
      if (top.kind == Kind::pair) {
        if (top.count >= 2) return fail(top.path + " has more than 2 entries, expected a pair [\"a\", \"b\"]");
        const auto offset = static_cast<uint32_t>(merge_arena.size());
        merge_arena += v;
        if (top.count == 0) {
          current_merge_.left_offset = offset;
          current_merge_.left_length = static_cast<uint32_t>(v.size());
        } else {
          current_merge_.right_offset = offset;
          current_merge_.right_length = static_cast<uint32_t>(v.size());
        }
        ++top.count;
        return true;
      }
    }
    return value(Json(std::move(v)));
  }
  bool binary(binary_t&) override { return fail("binary values are not JSON"); }

  bool start_object(std::size_t) override {
    if (frames_.size() >= kMaxDepth) return fail("JSON nesting deeper than 32 levels");
    if (at_model_field("vocab")) {
      if (saw_vocab) return fail("duplicate key \"vocab\" in model");
      saw_vocab = true;
      frames_.push_back(Frame{Kind::vocab, nullptr, "model.vocab", {}, 0});
      return true;
    }
    Json* node = nullptr;
    std::string path;
    if (!place(Json::object(), node, path)) return false;
    frames_.push_back(Frame{Kind::object, node, std::move(path), {}, 0});
    return true;
  }
  bool key(string_t& k) override {
    Frame& top = frames_.back();
    if (top.kind == Kind::vocab) {
      pending_vocab_key_ = k;
      return true;
    }
    if (top.node->contains(k)) return fail(join(top.path, k) + ": duplicate key");
    top.key = k;
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (frames_.size() >= kMaxDepth) return fail("JSON nesting deeper than 32 levels");
    if (at_model_field("merges")) {
      if (saw_merges) return fail("duplicate key \"merges\" in model");
      saw_merges = true;
      frames_.push_back(Frame{Kind::merges, nullptr, "model.merges", {}, 0});
      return true;
    }
    if (!frames_.empty() && frames_.back().kind == Kind::merges) {
      Frame& merges_frame = frames_.back();
      const std::string path = "model.merges[" + std::to_string(merges.size()) + "]";
      if (merges_frame.count == 1) {
        return fail(path + " is an array, but the earlier merges are \"a b\" strings; "
                    "expected one form throughout");
      }
      merges_frame.count = 2;  // pair form
      current_merge_ = MergeText{};
      frames_.push_back(Frame{Kind::pair, nullptr, path, {}, 0});
      return true;
    }
    Json* node = nullptr;
    std::string path;
    if (!place(Json::array(), node, path)) return false;
    frames_.push_back(Frame{Kind::array, node, std::move(path), {}, 0});
    return true;
  }
  bool end_array() override {
    const Frame top = std::move(frames_.back());
    frames_.pop_back();
    if (top.kind == Kind::pair) {
      if (top.count != 2) {
        return fail(top.path + " has " + std::to_string(top.count) +
                    " entries, expected a pair [\"a\", \"b\"]");
      }
      merges.push_back(current_merge_);
    }
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    if (error.empty()) {
      error = "not valid JSON at byte " + std::to_string(position) + ": " + ex.what();
    }
    return false;
  }

 private:
  enum class Kind { object, array, vocab, merges, pair };
  struct Frame {
    Kind kind;
    Json* node;        // object and array frames
    std::string path;  // dotted path for messages
    std::string key;   // object frames: the key of the next value
    int count;         // merges: 1 = strings, 2 = pairs; pair: strings seen
  };

  static std::string join(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }

  bool fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }

  bool at_model_field(std::string_view name) const {
    return frames_.size() == 2 && frames_[1].kind == Kind::object && frames_[1].path == "model" &&
           frames_[1].key == name;
  }

  // Where a new value goes: the root, the open object under its pending key, or the end
  // of the open array. `node` points to it afterwards, `path` names it.
  bool place(Json v, Json*& node, std::string& path) {
    if (frames_.empty()) {
      root = std::move(v);
      node = &root;
      path.clear();
      return true;
    }
    Frame& top = frames_.back();
    switch (top.kind) {
      case Kind::object:
        if (top.path == "model" && (top.key == "vocab" || top.key == "merges")) {
          return fail("model." + top.key + " is " + describe_json(v) + ", expected " +
                      (top.key == "vocab" ? "an object" : "an array"));
        }
        path = join(top.path, top.key);
        node = &((*top.node)[top.key] = std::move(v));
        return true;
      case Kind::array:
        path = top.path + "[" + std::to_string(top.node->size()) + "]";
        top.node->push_back(std::move(v));
        node = &top.node->back();
        return true;
      case Kind::vocab:
        return fail("model.vocab[" + json_quoted(pending_vocab_key_) + "] is " + describe_json(v) +
                    ", expected a non-negative integer id");
      case Kind::merges:
        return fail("model.merges[" + std::to_string(merges.size()) + "] is " + describe_json(v) +
                    ", expected \"a b\" or [\"a\", \"b\"]");
      case Kind::pair:
        return fail(top.path + "[" + std::to_string(top.count) + "] is " + describe_json(v) +
                    ", expected a string");
    }
    return false;
  }

  bool value(Json v) {
    Json* node = nullptr;
    std::string path;
    return place(std::move(v), node, path);
  }

  bool legacy_merge(const std::string& v) {
    Frame& top = frames_.back();
    const std::string path = "model.merges[" + std::to_string(merges.size()) + "]";
    if (top.count == 2) {
      return fail(path + " is a string, but the earlier merges are [\"a\", \"b\"] pairs; "
                  "expected one form throughout");
    }
    top.count = 1;
    const size_t space = v.find(' ');
    if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos) {
      return fail(path + " is " + json_quoted(v) + ", expected two tokens separated by one space");
    }
    const auto offset = static_cast<uint32_t>(merge_arena.size());
    merge_arena += v;
    merges.push_back(MergeText{offset, static_cast<uint32_t>(space),
                               static_cast<uint32_t>(offset + space + 1),
                               static_cast<uint32_t>(v.size() - space - 1)});
    return true;
  }

  std::vector<Frame> frames_;
  std::string pending_vocab_key_;
  MergeText current_merge_{};
};

// Checks of the DOM part. `what` prefixes every message. The rule for every field: accept
// what HF tokenizers reads and cannot make its ids or decoded text differ from lily's,
// refuse the rest, saying why where the reason is not obvious (docs/checkpoint.md has the
// table of fields and decisions).
class Checker {
 public:
  explicit Checker(std::string_view what) : what_(what) {}

  // "<what>: <field> is <found>, expected <expected>[ (<why>)]".
  [[noreturn]] void fail(const std::string& field, const std::string& found,
                         const std::string& expected, std::string_view why = {}) const {
    std::string message = what_ + ": " + field + " is " + found + ", expected " + expected;
    if (!why.empty()) message += " (" + std::string(why) + ")";
    throw InputError(message);
  }

  const Json* field(const Json& object, std::string_view key) const {
    auto it = object.find(key);
    return it == object.end() ? nullptr : &*it;
  }

  // Unknown fields are refused: HF ignores those inside components but refuses unknown
  // top-level keys, and lily cannot know whether a field it does not read is harmless (a
  // newer HF may give it a meaning, as one did to model.ignore_merges).
  void only_fields(const Json& object, const std::string& path,
                   const std::set<std::string_view>& allowed) const {
    for (auto it = object.begin(); it != object.end(); ++it) {
      if (allowed.count(it.key()) == 0) {
        std::string list;
        for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        throw InputError(what_ + ": " + at(path, it.key()) + " is an unknown field (lily accepts " +
                         list + ")");
      }
    }
  }

  const Json& object(const Json* value, const std::string& path) const {
    if (value == nullptr) throw InputError(what_ + ": " + path + " is missing");
    if (!value->is_object()) fail(path, describe_json(*value), "an object");
    return *value;
  }

  // `key` must be present and equal `expected`.
  void equals(const Json& object, const std::string& path, std::string_view key,
              const Json& expected, std::string_view why = {}) const {
    const Json* value = field(object, key);
    if (value == nullptr) fail(at(path, key), "missing", expected.dump(), why);
    if (*value != expected) fail(at(path, key), describe_json(*value), expected.dump(), why);
  }

  // `key` may be absent (HF's default applies, which must be acceptable) or one of `ok`.
  void optional_in(const Json& object, const std::string& path, std::string_view key,
                   const std::vector<Json>& ok, std::string_view why = {}) const {
    const Json* value = field(object, key);
    if (value == nullptr) return;
    for (const Json& o : ok) {
      if (*value == o) return;
    }
    std::string list;
    for (const Json& o : ok) list += (list.empty() ? "" : " or ") + o.dump();
    fail(at(path, key), describe_json(*value), list, why);
  }

  // `key` must be present (HF refuses the file without it) and a boolean; returns it.
  bool required_bool(const Json& object, const std::string& path, std::string_view key,
                     std::string_view component) const {
    const Json* value = field(object, key);
    if (value == nullptr) {
      fail(at(path, key), "missing", "true or false",
           "HF tokenizers refuses " + std::string(component) + " without it");
    }
    if (!value->is_boolean()) fail(at(path, key), describe_json(*value), "true or false");
    return value->get<bool>();
  }

  // `key` must be present (HF refuses the file without it) and false.
  void required_false(const Json& object, const std::string& path, std::string_view key,
                      std::string_view component, std::string_view why) const {
    const Json* value = field(object, key);
    if (value == nullptr) {
      fail(at(path, key), "missing", "false",
           "HF tokenizers refuses " + std::string(component) + " without it");
    }
    if (*value != false) fail(at(path, key), describe_json(*value), "false", why);
  }

  // `key` may be absent or null (HF's default false then) or a boolean; returns it.
  bool optional_bool(const Json& object, const std::string& path, std::string_view key) const {
    const Json* value = field(object, key);
    if (value == nullptr || value->is_null()) return false;
    if (!value->is_boolean()) fail(at(path, key), describe_json(*value), "true, false or null");
    return value->get<bool>();
  }

  static std::string at(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }

  // ByteLevel as the decoder or a post-processor: HF requires add_prefix_space and
  // trim_offsets (booleans) and defaults use_regex to true, but no value of the three
  // changes ids or text. The decoder maps every character back to its byte whatever they
  // are; the post-processor adds no tokens and uses trim_offsets (with add_prefix_space)
  // only to move the offsets of tokens, which lily does not report; use_regex is read by
  // the pre-tokenizer only.
  void byte_level_any_flags(const Json& o, const std::string& path) const {
    equals(o, path, "type", "ByteLevel");
    only_fields(o, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    required_bool(o, path, "add_prefix_space", "a ByteLevel");
    required_bool(o, path, "trim_offsets", "a ByteLevel");
    const Json* use_regex = field(o, "use_regex");
    if (use_regex != nullptr && !use_regex->is_boolean()) {
      fail(at(path, "use_regex"), describe_json(*use_regex), "true or false");
    }
  }

  // Where `value` is {"type": "Sequence", `list`: [one element]}, that element (and its
  // path); otherwise `value` itself. HF runs a Sequence of one component as that component.
  const Json* unwrap_sequence_of_one(const Json* value, std::string& path, std::string_view list,
                                     std::string_view expected) const {
    if (value == nullptr || !value->is_object()) return value;
    const Json* type = field(*value, "type");
    if (type == nullptr || *type != "Sequence") return value;
    only_fields(*value, path, {"type", list});
    const Json* items = field(*value, list);
    if (items == nullptr || !items->is_array() || items->size() != 1) {
      fail(at(path, list), items == nullptr ? "missing" : describe_json(*items),
           "[" + std::string(expected) + "]");
    }
    path = at(path, list) + "[0]";
    return &(*items)[0];
  }

 private:
  std::string what_;
};

constexpr std::string_view kOtherIds = "other ids than lily's";

SplitPattern check_pre_tokenizer(const Checker& c, const Json* value) {
  const Json& pre = c.object(value, "pre_tokenizer");
  c.equals(pre, "pre_tokenizer", "type", "Sequence",
           "lily implements Sequence[Split, ByteLevel] only");
  c.only_fields(pre, "pre_tokenizer", {"type", "pretokenizers"});
  const Json* list = c.field(pre, "pretokenizers");
  if (list == nullptr) c.fail("pre_tokenizer.pretokenizers", "missing", "[Split, ByteLevel]");
  if (!list->is_array() || list->size() != 2) {
    c.fail("pre_tokenizer.pretokenizers", describe_json(*list), "an array [Split, ByteLevel]");
  }
  const std::string split_path = "pre_tokenizer.pretokenizers[0]";
  const Json& split = c.object(&(*list)[0], split_path);
  c.equals(split, split_path, "type", "Split", kOtherIds);
  c.only_fields(split, split_path, {"type", "pattern", "behavior", "invert"});
  c.equals(split, split_path, "behavior", "Isolated",
           "other behaviours drop the matches or join them to their neighbours: other ids");
  // invert flips which pieces count as matches, and Isolated keeps both kinds as pieces
  // alike (HF's NormalizedString::split ignores the flag for Isolated): no effect.
  c.required_bool(split, split_path, "invert", "a Split");
  const Json& pattern = c.object(c.field(split, "pattern"), split_path + ".pattern");
  const std::string pattern_path = split_path + ".pattern";
  const Json* regex = c.field(pattern, "Regex");
  if (regex == nullptr || pattern.size() != 1 || !regex->is_string()) {
    c.fail(pattern_path, describe_json(pattern), "{\"Regex\": the Qwen3.5/3.6 or Qwen2/Qwen3 split pattern}");
  }
  SplitPattern result = SplitPattern::qwen35;
  const auto& text = regex->get_ref<const std::string&>();
  if (text == kQwen35SplitRegex) {
    result = SplitPattern::qwen35;
  } else if (text == kQwen2SplitRegex) {
    result = SplitPattern::qwen2;
  } else {
    c.fail(pattern_path + ".Regex", describe_json(*regex),
           "the Qwen3.5/3.6 pattern " + json_quoted(kQwen35SplitRegex, 1000) +
               " or the Qwen2/Qwen3 pattern " + json_quoted(kQwen2SplitRegex, 1000),
           "lily implements these two patterns only");
  }
  // The pre-tokenizer's ByteLevel: add_prefix_space and use_regex change the pieces (a
  // space before each, GPT-2's pattern over each), trim_offsets is only read by
  // ByteLevel's post-processor role, so any value is harmless here.
  const std::string byte_path = "pre_tokenizer.pretokenizers[1]";
  const Json& byte = c.object(&(*list)[1], byte_path);
  c.equals(byte, byte_path, "type", "ByteLevel", kOtherIds);
  c.only_fields(byte, byte_path, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
  c.required_false(byte, byte_path, "add_prefix_space", "a ByteLevel",
                   "true puts a space before every piece that lacks one: other ids");
  c.equals(
      byte, byte_path, "use_regex", false,
      "true, HF's default when absent, splits every piece again with GPT-2's pattern: other ids");
  c.required_bool(byte, byte_path, "trim_offsets", "a ByteLevel");
  return result;
}

void check_normalizer(const Checker& c, const Json* value) {
  constexpr std::string_view why = "without NFC, text that is not in NFC gets other ids";
  std::string path = "normalizer";
  if (value == nullptr || value->is_null()) {
    c.fail(path, value == nullptr ? "missing" : "null", "{\"type\": \"NFC\"}", why);
  }
  value = c.unwrap_sequence_of_one(value, path, "normalizers", "NFC");
  const Json& normalizer = c.object(value, path);
  c.equals(normalizer, path, "type", "NFC", "another normalisation gives other ids");
  c.only_fields(normalizer, path, {"type"});
}

void check_decoder(const Checker& c, const Json* value) {
  std::string path = "decoder";
  if (value == nullptr || value->is_null()) {
    c.fail(path, value == nullptr ? "missing" : "null", "a ByteLevel decoder",
           "without a decoder HF joins the token strings with spaces: other text");
  }
  value = c.unwrap_sequence_of_one(value, path, "decoders", "ByteLevel");
  const Json& decoder = c.object(value, path);
  const Json* type = c.field(decoder, "type");
  if (type == nullptr || *type != "ByteLevel") {
    c.fail(Checker::at(path, "type"), type == nullptr ? "missing" : describe_json(*type),
           "\"ByteLevel\"", "another decoder gives other text");
  }
  c.byte_level_any_flags(decoder, path);
}

// Absent, null, ByteLevel, or a Sequence of ByteLevels: none adds a token.
void check_post_processor(const Checker& c, const Json* value) {
  if (value == nullptr || value->is_null()) return;
  const std::string path = "post_processor";
  const Json& post = c.object(value, path);
  const Json* type = c.field(post, "type");
  constexpr std::string_view why =
      "other post-processors add tokens when HF encodes with add_special_tokens, its "
      "default; lily adds none";
  if (type != nullptr && *type == "Sequence") {
    c.only_fields(post, path, {"type", "processors"});
    const Json* list = c.field(post, "processors");
    if (list == nullptr || !list->is_array()) {
      c.fail(path + ".processors", list == nullptr ? "missing" : describe_json(*list),
             "an array of ByteLevel post-processors");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string item_path = path + ".processors[" + std::to_string(i) + "]";
      const Json& item = c.object(&(*list)[i], item_path);
      const Json* item_type = c.field(item, "type");
      if (item_type == nullptr || *item_type != "ByteLevel") {
        c.fail(item_path + ".type", item_type == nullptr ? "missing" : describe_json(*item_type),
               "\"ByteLevel\"", why);
      }
      c.byte_level_any_flags(item, item_path);
    }
    return;
  }
  if (type == nullptr || *type != "ByteLevel") {
    c.fail(path + ".type", type == nullptr ? "missing" : describe_json(*type),
           "\"ByteLevel\", a Sequence of ByteLevels or null", why);
  }
  c.byte_level_any_flags(post, path);
}

// Returns model.ignore_merges.
bool check_model_fields(const Checker& c, const Json* value) {
  const Json& model = c.object(value, "model");
  // HF reads a model without "type" as a BPE when it has vocab and merges.
  c.optional_in(model, "model", "type", {"BPE"}, "lily implements BPE only");
  c.only_fields(model, "model",
                {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                 "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"});
  // Dropout 0 never skips a merge (HF treats it as none); above 0 merges are skipped at
  // random, beyond [0, 1] HF refuses the file.
  if (const Json* dropout = c.field(model, "dropout"); dropout != nullptr && !dropout->is_null()) {
    const bool number = dropout->is_number();
    const double p = number ? dropout->get<double>() : 0.0;
    if (!number || p != 0.0) {
      c.fail("model.dropout", describe_json(*dropout), "null or 0",
             number && p > 0.0 && p <= 1.0
                 ? "dropout skips merges at random: other ids, different on every call"
                 : "HF tokenizers refuses it");
    }
  }
  // unk_token, fuse_unk and byte_fallback only act on a character that is not in the
  // vocab, and every character BPE sees is one of the 256 ByteLevel characters, which
  // the vocab must hold (build_vocab): any value is harmless.
  if (const Json* unk = c.field(model, "unk_token");
      unk != nullptr && !unk->is_null() && !unk->is_string()) {
    c.fail("model.unk_token", describe_json(*unk), "null or a string");
  }
  c.optional_bool(model, "model", "fuse_unk");
  c.optional_bool(model, "model", "byte_fallback");
  // A prefix or suffix changes the strings BPE looks up and merges: "" is none.
  constexpr std::string_view affix_why =
      "a non-empty one changes the strings BPE looks up: other ids";
  c.optional_in(model, "model", "continuing_subword_prefix", {"", nullptr}, affix_why);
  c.optional_in(model, "model", "end_of_word_suffix", {"", nullptr}, affix_why);
  // ignore_merges: a whole piece that is a vocab token becomes that token; lily does the
  // same (Tokenizer::Impl::encode_stretch).
  return c.optional_bool(model, "model", "ignore_merges");
}

void build_vocab(const Checker& c, std::string_view what, Sax& sax, TokenizerSpec& spec) {
  if (!sax.saw_vocab) throw InputError(std::string(what) + ": model.vocab is missing");
  const size_t n = sax.vocab.size();
  if (n < 256 || n >= (size_t{1} << 30)) {
    c.fail("model.vocab", std::to_string(n) + " entries", "256 to 2^30 entries");
  }
  // Ids must be exactly 0..n-1: each below n and none repeated.
  constexpr uint32_t kUnset = UINT32_MAX;
  std::vector<uint32_t> entry_of_id(n, kUnset);
  for (size_t e = 0; e < n; ++e) {
    const Sax::VocabEntry& entry = sax.vocab[e];
    const std::string_view token(sax.vocab_arena.data() + entry.offset, entry.length);
    if (entry.id >= n) {
      c.fail("model.vocab[" + json_quoted(token) + "]", "id " + std::to_string(entry.id),
             "ids 0.." + std::to_string(n - 1) + " (one per entry)");
    }
    if (entry_of_id[entry.id] != kUnset) {
      const Sax::VocabEntry& first = sax.vocab[entry_of_id[entry.id]];
      c.fail("model.vocab[" + json_quoted(token) + "]", "id " + std::to_string(entry.id),
             "an id of its own (" +
                 json_quoted(std::string_view(sax.vocab_arena.data() + first.offset, first.length)) +
                 " has it too)");
    }
    entry_of_id[entry.id] = static_cast<uint32_t>(e);
  }
  spec.vocab_arena.reserve(sax.vocab_arena.size());
  spec.vocab_offsets.reserve(n + 1);
  for (size_t id = 0; id < n; ++id) {
    const Sax::VocabEntry& entry = sax.vocab[entry_of_id[id]];
    spec.vocab_offsets.push_back(static_cast<uint32_t>(spec.vocab_arena.size()));
    spec.vocab_arena.append(sax.vocab_arena, entry.offset, entry.length);
  }
  spec.vocab_offsets.push_back(static_cast<uint32_t>(spec.vocab_arena.size()));
  spec.vocab_index.reserve(n);
  for (uint32_t id = 0; id < n; ++id) {
    if (!spec.vocab_index.emplace(spec.vocab_token(id), id).second) {
      c.fail("model.vocab", "the key " + json_quoted(spec.vocab_token(id)) + " twice",
             "distinct keys");
    }
  }
  for (uint32_t b = 0; b < 256; ++b) {
    std::string glyph;
    glyph = byte_level::encode(std::string(1, static_cast<char>(b)));
    auto it = spec.vocab_index.find(glyph);
    if (it == spec.vocab_index.end()) {
      c.fail("model.vocab", "without " + json_quoted(glyph) + " (the ByteLevel character of byte " +
                                std::to_string(b) + ")",
             "all 256 ByteLevel characters");
    }
    spec.byte_ids[b] = it->second;
  }
}

void build_merges(const Checker& c, std::string_view what, const Sax& sax, TokenizerSpec& spec) {
  if (!sax.saw_merges) throw InputError(std::string(what) + ": model.merges is missing");
  spec.merges.reserve(sax.merges.size());
  std::string joined;
  auto lookup = [&](std::string_view token, size_t rank) {
    auto it = spec.vocab_index.find(token);
    if (it == spec.vocab_index.end()) {
      c.fail("model.merges[" + std::to_string(rank) + "]", "a merge giving or using " + json_quoted(token),
             "tokens that are in model.vocab");
    }
    return it->second;
  };
  for (size_t rank = 0; rank < sax.merges.size(); ++rank) {
    const Sax::MergeText& m = sax.merges[rank];
    const std::string_view left(sax.merge_arena.data() + m.left_offset, m.left_length);
    const std::string_view right(sax.merge_arena.data() + m.right_offset, m.right_length);
    joined.assign(left);
    joined.append(right);
    spec.merges.push_back(MergeRule{lookup(left, rank), lookup(right, rank), lookup(joined, rank)});
  }
}

void build_added(const Checker& c, const Json* value, TokenizerSpec& spec) {
  if (value == nullptr) return;  // HF accepts a file without added tokens
  if (!value->is_array()) c.fail("added_tokens", describe_json(*value), "an array");
  std::set<std::string> seen;
  for (size_t i = 0; i < value->size(); ++i) {
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    const Json& token = c.object(&(*value)[i], path);
    c.only_fields(token, path,
                  {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
    const Json* id = c.field(token, "id");
    const uint64_t expected_id = spec.vocab_size() + i;
    if (id == nullptr || !id->is_number_unsigned() || id->get<uint64_t>() != expected_id) {
      c.fail(path + ".id", id == nullptr ? "missing" : describe_json(*id),
             std::to_string(expected_id),
             "added tokens follow the vocab in order; HF ignores a stated id and numbers them so, "
             "leaving the file's ids and HF's in conflict");
    }
    const Json* content = c.field(token, "content");
    if (content == nullptr || !content->is_string() || content->get_ref<const std::string&>().empty()) {
      c.fail(path + ".content", content == nullptr ? "missing" : describe_json(*content),
             "a non-empty string");
    }
    const auto& text = content->get_ref<const std::string&>();
    if (!seen.insert(text).second) c.fail(path + ".content", json_quoted(text) + " again", "distinct contents");
    if (spec.vocab_index.count(text) != 0) {
      c.fail(path + ".content", json_quoted(text) + ", which is also a model.vocab token",
             "a token of its own", "HF would give it the vocab token's id");
    }
    // HF requires every flag. single_word, lstrip and rstrip change where the token
    // matches; normalized true matches it in the normalised text instead of the raw one.
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      c.required_false(token, path, flag, "an added token",
                       "true changes where the token matches: other ids");
    }
    c.required_false(
        token, path, "normalized", "an added token",
        "true matches the token in the NFC-normalised text instead of the raw text: other ids");
    const bool special = c.required_bool(token, path, "special", "an added token");
    spec.added.push_back(AddedTokenInfo{static_cast<uint32_t>(expected_id), text, special});
  }
}

}  // namespace

std::unique_ptr<TokenizerSpec> parse_tokenizer_json(std::string_view text, std::string_view what) {
  Sax sax;
  const bool ok = Json::sax_parse(text.begin(), text.end(), &sax, Json::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (!ok || !sax.error.empty()) {
    throw InputError(std::string(what) + ": " + (sax.error.empty() ? "not valid JSON" : sax.error));
  }
  const Checker c(what);
  const Json& root = sax.root;
  if (!root.is_object()) c.fail("the top level", describe_json(root), "an object");
  c.only_fields(root, "",
                {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                 "post_processor", "decoder", "model"});
  // HF refuses any version but "1.0" and does not need one.
  c.optional_in(root, "", "version", {"1.0"}, "HF tokenizers refuses other versions");
  c.optional_in(root, "", "truncation", {nullptr}, "truncation cuts the ids");
  c.optional_in(root, "", "padding", {nullptr}, "padding adds pad ids when HF encodes a batch");
  check_normalizer(c, c.field(root, "normalizer"));
  auto spec = std::make_unique<TokenizerSpec>();
  spec->pattern = check_pre_tokenizer(c, c.field(root, "pre_tokenizer"));
  check_post_processor(c, c.field(root, "post_processor"));
  check_decoder(c, c.field(root, "decoder"));
  spec->ignore_merges = check_model_fields(c, c.field(root, "model"));
  build_vocab(c, what, sax, *spec);
  build_merges(c, what, sax, *spec);
  build_added(c, c.field(root, "added_tokens"), *spec);
  return spec;
}

}  // namespace lily

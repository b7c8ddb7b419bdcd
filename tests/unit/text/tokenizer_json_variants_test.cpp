// tokenizer.json variants: harmless ones load and tokenize as the original, others are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_tokenizers.h"
#include "text/utf8.h"

namespace lily {
namespace {

using test::OrderedJson;

// Texts that exercise spaces, contractions, numbers, added tokens, NFC and cut characters.
const std::vector<std::string>& texts() {
  static const std::vector<std::string> t = {
      "",
      "Hello world, I'M here's 12345 the inference server",
      "  \n\n  a  b   c\r\n\td",
      "<|im_start|>user\nhi<|im_end|><think>\n</think>",
      "$hello 'S x\u2019s caf\u00e9 cafe\u0301 <think>\u0338",
      " leading space and trailing   ",
      "\u4e2d\u6587\u5b57\u7b26 \U0001F468\u200d\U0001F469\u200d\U0001F467 "
      "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
  };
  return t;
}

OrderedJson tiny_json() {
  return OrderedJson::parse(test::tiny_files().tokenizer_json);
}

OrderedJson edited(const std::function<void(OrderedJson&)>& edit) {
  OrderedJson json = tiny_json();
  edit(json);
  return json;
}

// The InputError message of loading `json` ("" when it loads).
std::string refusal(const OrderedJson& json) {
  try {
    Tokenizer::from_json(json.dump(), "t.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// A variant that must load and encode and decode every text exactly as the original.
struct Accepted {
  const char* name;
  std::function<void(OrderedJson&)> edit;
};

OrderedJson& pre_byte_level(OrderedJson& j) {
  return j["pre_tokenizer"]["pretokenizers"][1];
}

const std::vector<Accepted>& accepted() {
  static const std::vector<Accepted> v = {
      {"decoder ByteLevel with every flag true",
       [](OrderedJson& j) {
         j["decoder"] = {{"type", "ByteLevel"},
                         {"add_prefix_space", true},
                         {"trim_offsets", true},
                         {"use_regex", true}};
       }},
      {"decoder without use_regex (HF's default true)",
       [](OrderedJson& j) { j["decoder"].erase("use_regex"); }},
      {"decoder Sequence of one ByteLevel",
       [](OrderedJson& j) {
         j["decoder"] = {{"type", "Sequence"}, {"decoders", OrderedJson::array({j["decoder"]})}};
       }},
      {"post_processor ByteLevel with every flag true",
       [](OrderedJson& j) {
         j["post_processor"] = {{"type", "ByteLevel"},
                                {"add_prefix_space", true},
                                {"trim_offsets", true},
                                {"use_regex", true}};
       }},
      {"post_processor without use_regex",
       [](OrderedJson& j) { j["post_processor"].erase("use_regex"); }},
      {"post_processor null", [](OrderedJson& j) { j["post_processor"] = nullptr; }},
      {"post_processor absent", [](OrderedJson& j) { j.erase("post_processor"); }},
      {"post_processor Sequence of ByteLevels",
       [](OrderedJson& j) {
         OrderedJson flagged = j["post_processor"];
         flagged["trim_offsets"] = true;
         j["post_processor"] = {{"type", "Sequence"},
                                {"processors", OrderedJson::array({j["post_processor"], flagged})}};
       }},
      {"post_processor empty Sequence",
       [](OrderedJson& j) {
         j["post_processor"] = {{"type", "Sequence"}, {"processors", OrderedJson::array()}};
       }},
      {"pre-tokenizer ByteLevel trim_offsets true",
       [](OrderedJson& j) { pre_byte_level(j)["trim_offsets"] = true; }},
      {"Split invert true (Isolated keeps every piece either way)",
       [](OrderedJson& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; }},
      {"transformers' Qwen2 converter (ByteLevel defaults)",
       [](OrderedJson& j) {
         pre_byte_level(j)["trim_offsets"] = true;
         j["decoder"] = {{"type", "ByteLevel"},
                         {"add_prefix_space", true},
                         {"trim_offsets", true},
                         {"use_regex", true}};
         j["post_processor"] = {{"type", "ByteLevel"},
                                {"add_prefix_space", true},
                                {"trim_offsets", false},
                                {"use_regex", true}};
       }},
      {"normalizer Sequence of one NFC",
       [](OrderedJson& j) {
         j["normalizer"] = {{"type", "Sequence"},
                            {"normalizers", OrderedJson::array({j["normalizer"]})}};
       }},
      {"version absent", [](OrderedJson& j) { j.erase("version"); }},
      {"truncation and padding absent",
       [](OrderedJson& j) {
         j.erase("truncation");
         j.erase("padding");
       }},
      {"model without type", [](OrderedJson& j) { j["model"].erase("type"); }},
      {"model.dropout 0", [](OrderedJson& j) { j["model"]["dropout"] = 0; }},
      {"model.dropout 0.0", [](OrderedJson& j) { j["model"]["dropout"] = 0.0; }},
      {"model.unk_token not in the vocab",
       [](OrderedJson& j) { j["model"]["unk_token"] = "<unk>"; }},
      {"model.unk_token in the vocab, fuse_unk",
       [](OrderedJson& j) {
         j["model"]["unk_token"] = "!";
         j["model"]["fuse_unk"] = true;
       }},
      {"model.byte_fallback true", [](OrderedJson& j) { j["model"]["byte_fallback"] = true; }},
      {"model options null",
       [](OrderedJson& j) {
         for (const char* k :
              {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
               "fuse_unk", "byte_fallback", "ignore_merges"}) {
           j["model"][k] = nullptr;
         }
       }},
      {"model options absent",
       [](OrderedJson& j) {
         for (const char* k :
              {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
               "fuse_unk", "byte_fallback", "ignore_merges"}) {
           j["model"].erase(k);
         }
       }},
  };
  return v;
}

TEST(TokenizerJsonVariants, HarmlessVariantsLoadAndTokenizeAsTheOriginal) {
  const Tokenizer& original = test::tiny();
  for (const Accepted& variant : accepted()) {
    SCOPED_TRACE(variant.name);
    const OrderedJson json = edited(variant.edit);
    ASSERT_NE(json, tiny_json()) << "the edit changed nothing";
    ASSERT_EQ(refusal(json), "");
    const Tokenizer t = test::load(json);
    EXPECT_EQ(t.id_count(), original.id_count());
    for (const std::string& text : texts()) {
      const std::vector<uint32_t> ids = t.encode(text);
      EXPECT_EQ(ids, original.encode(text)) << text;
      EXPECT_EQ(t.decode(ids, false), original.decode(ids, false)) << text;
      EXPECT_EQ(t.decode(ids, true), original.decode(ids, true)) << text;
    }
  }
}

// Vocab tokens that BPE does not reach from their bytes, ids N, N+1, ... (the added
// tokens move up): with ignore_merges a whole piece that is one of them is that token.
void add_unreachable_tokens(OrderedJson& j) {
  auto& vocab = j["model"]["vocab"];
  for (const char* token : {"\xC4\xA0inference", "\xC4\xA0server", "Hello"}) {
    ASSERT_FALSE(vocab.contains(token)) << token;
    vocab[token] = vocab.size();
  }
  for (auto& added : j["added_tokens"]) added["id"] = added["id"].get<uint32_t>() + 3;
}

TEST(TokenizerJsonVariants, IgnoreMergesTakesWholePiecesThatAreVocabTokens) {
  OrderedJson merged = tiny_json();
  add_unreachable_tokens(merged);
  OrderedJson whole = merged;
  whole["model"]["ignore_merges"] = true;
  const Tokenizer with_merges = test::load(merged);
  const Tokenizer ignoring = test::load(whole);
  const uint32_t inference = 4063;
  const uint32_t server = 4064;
  const uint32_t hello = 4065;
  ASSERT_EQ(ignoring.token_to_id("\xC4\xA0inference"), inference);
  ASSERT_EQ(ignoring.token_to_id("Hello"), hello);

  const std::string text = "Hello world, the inference server.\nHello";
  const std::vector<uint32_t> merged_ids = with_merges.encode(text);
  const std::vector<uint32_t> whole_ids = ignoring.encode(text);
  for (uint32_t id : merged_ids)
    EXPECT_LT(id, inference) << "BPE alone never reaches the new tokens";
  EXPECT_EQ(whole_ids.front(), hello);
  EXPECT_EQ(whole_ids.back(), hello);
  EXPECT_EQ(std::count(whole_ids.begin(), whole_ids.end(), inference), 1);
  EXPECT_EQ(std::count(whole_ids.begin(), whole_ids.end(), server), 1);
  EXPECT_LT(whole_ids.size(), merged_ids.size());
  EXPECT_EQ(ignoring.decode(whole_ids, false), text);
  EXPECT_EQ(with_merges.decode(merged_ids, false), text);
  // " world," is no vocab token: both merge it the same way.
  EXPECT_EQ(ignoring.encode(" world,"), with_merges.encode(" world,"));
  // Part of a piece is not enough: "Helloo" is one piece and merges as usual.
  EXPECT_EQ(ignoring.encode("Helloo"), with_merges.encode("Helloo"));
  // Added tokens are still found first.
  EXPECT_EQ(ignoring.encode("<|im_end|>Hello"), (std::vector<uint32_t>{4063 + 3 + 2, hello}));
}

// The tiny vocab holds tokens that its merges do not reach from their bytes (each
// pseudo-word is built by a random split tree), so ignore_merges changes the ids of such
// words, as in HF (the oracle's variants check the corpus); lily takes them whole too.
TEST(TokenizerJsonVariants, IgnoreMergesChangesIdsOfTheTinyVocab) {
  const Tokenizer& original = test::tiny();
  const Tokenizer ignoring =
      test::load(edited([](OrderedJson& j) { j["model"]["ignore_merges"] = true; }));
  size_t taken_whole = 0;
  size_t merged_alike = 0;
  for (uint32_t id = 256; id < original.vocab_size(); ++id) {
    const std::string word(original.token_bytes(id, false));
    if (utf8::find_invalid(word) != std::string_view::npos) continue;  // part of a character
    const std::vector<uint32_t> ids = ignoring.encode(word);
    if (ids.size() != 1) continue;  // several pieces, or not in NFC
    EXPECT_EQ(ids[0], id) << word;
    EXPECT_EQ(ignoring.decode(ids, false), word);
    if (original.encode(word) == ids) {
      ++merged_alike;
    } else {
      ++taken_whole;
    }
  }
  EXPECT_GT(taken_whole, 10u);
  EXPECT_GT(merged_alike, 1000u);
}

// A variant that must be refused with a message holding every one of `parts`.
struct Refused {
  const char* name;
  std::function<void(OrderedJson&)> edit;
  std::vector<const char*> parts;
};

TEST(TokenizerJsonVariants, VariantsThatChangeIdsOrTextOrThatHfRefusesAreRefused) {
  const std::vector<Refused> cases = {
      // ByteLevel as decoder or post-processor: HF requires the two flags.
      {"decoder only type",
       [](OrderedJson& j) {
         j["decoder"] = {{"type", "ByteLevel"}};
       },
       {"decoder.add_prefix_space is missing", "expected true or false",
        "HF tokenizers refuses a ByteLevel without it"}},
      {"decoder no trim_offsets",
       [](OrderedJson& j) { j["decoder"].erase("trim_offsets"); },
       {"decoder.trim_offsets is missing", "expected true or false"}},
      {"decoder flag not boolean",
       [](OrderedJson& j) { j["decoder"]["use_regex"] = "yes"; },
       {"decoder.use_regex is string \"yes\"", "expected true or false"}},
      {"decoder null",
       [](OrderedJson& j) { j["decoder"] = nullptr; },
       {"decoder is null", "expected a ByteLevel decoder", "joins the token strings with spaces"}},
      {"decoder missing",
       [](OrderedJson& j) { j.erase("decoder"); },
       {"decoder is missing", "expected a ByteLevel decoder"}},
      {"decoder Metaspace",
       [](OrderedJson& j) {
         j["decoder"] = {{"type", "Metaspace"}};
       },
       {"decoder.type is string \"Metaspace\"", "expected \"ByteLevel\"", "other text"}},
      {"decoder Sequence of two",
       [](OrderedJson& j) {
         j["decoder"] = {{"type", "Sequence"},
                         {"decoders", OrderedJson::array({j["decoder"], j["decoder"]})}};
       },
       {"decoder.decoders is array", "expected [ByteLevel]"}},
      {"post_processor no add_prefix_space",
       [](OrderedJson& j) { j["post_processor"].erase("add_prefix_space"); },
       {"post_processor.add_prefix_space is missing", "expected true or false"}},
      {"post_processor TemplateProcessing",
       [](OrderedJson& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       {"post_processor.type is string \"TemplateProcessing\"",
        "expected \"ByteLevel\", a Sequence of ByteLevels or null",
        "add tokens when HF encodes with add_special_tokens"}},
      {"post_processor Sequence with a template",
       [](OrderedJson& j) {
         j["post_processor"] = {{"type", "Sequence"},
                                {"processors", OrderedJson::array({j["post_processor"],
                                                                   {{"type", "BertProcessing"}}})}};
       },
       {"post_processor.processors[1].type is string \"BertProcessing\"",
        "expected \"ByteLevel\""}},
      // The pre-tokenizer's ByteLevel: add_prefix_space and use_regex change the pieces.
      {"pre add_prefix_space true",
       [](OrderedJson& j) { pre_byte_level(j)["add_prefix_space"] = true; },
       {"pre_tokenizer.pretokenizers[1].add_prefix_space is boolean true", "expected false",
        "puts a space before every piece"}},
      {"pre add_prefix_space missing",
       [](OrderedJson& j) { pre_byte_level(j).erase("add_prefix_space"); },
       {"pre_tokenizer.pretokenizers[1].add_prefix_space is missing", "expected false",
        "HF tokenizers refuses"}},
      {"pre use_regex true",
       [](OrderedJson& j) { pre_byte_level(j)["use_regex"] = true; },
       {"pre_tokenizer.pretokenizers[1].use_regex is boolean true", "expected false",
        "GPT-2's pattern"}},
      {"pre use_regex missing",
       [](OrderedJson& j) { pre_byte_level(j).erase("use_regex"); },
       {"pre_tokenizer.pretokenizers[1].use_regex is missing", "expected false",
        "HF's default when absent"}},
      {"pre trim_offsets missing",
       [](OrderedJson& j) { pre_byte_level(j).erase("trim_offsets"); },
       {"pre_tokenizer.pretokenizers[1].trim_offsets is missing", "expected true or false",
        "HF tokenizers refuses"}},
      {"pre trim_offsets not boolean",
       [](OrderedJson& j) { pre_byte_level(j)["trim_offsets"] = 1; },
       {"pre_tokenizer.pretokenizers[1].trim_offsets is number 1", "expected true or false"}},
      {"split invert missing",
       [](OrderedJson& j) { j["pre_tokenizer"]["pretokenizers"][0].erase("invert"); },
       {"pretokenizers[0].invert is missing", "expected true or false",
        "HF tokenizers refuses a Split without it"}},
      {"split behavior missing",
       [](OrderedJson& j) { j["pre_tokenizer"]["pretokenizers"][0].erase("behavior"); },
       {"pretokenizers[0].behavior is missing", "expected \"Isolated\""}},
      // Normalizer.
      {"normalizer null",
       [](OrderedJson& j) { j["normalizer"] = nullptr; },
       {"normalizer is null", "expected {\"type\": \"NFC\"}", "not in NFC gets other ids"}},
      {"normalizer missing",
       [](OrderedJson& j) { j.erase("normalizer"); },
       {"normalizer is missing", "expected {\"type\": \"NFC\"}"}},
      {"normalizer NFKC",
       [](OrderedJson& j) { j["normalizer"]["type"] = "NFKC"; },
       {"normalizer.type is string \"NFKC\"", "expected \"NFC\"", "other ids"}},
      {"normalizer Sequence of NFC and Lowercase",
       [](OrderedJson& j) {
         j["normalizer"] = {
             {"type", "Sequence"},
             {"normalizers", OrderedJson::array({j["normalizer"], {{"type", "Lowercase"}}})}};
       },
       {"normalizer.normalizers is array", "expected [NFC]"}},
      // Top level.
      {"version 2.0",
       [](OrderedJson& j) { j["version"] = "2.0"; },
       {"version is string \"2.0\"", "expected \"1.0\"", "HF tokenizers refuses other versions"}},
      {"truncation",
       [](OrderedJson& j) {
         j["truncation"] = {{"max_length", 5}};
       },
       {"truncation is object", "expected null", "cuts the ids"}},
      {"padding",
       [](OrderedJson& j) {
         j["padding"] = {{"strategy", "BatchLongest"}};
       },
       {"padding is object", "expected null", "pad ids"}},
      {"unknown top-level field",
       [](OrderedJson& j) { j["extra"] = nullptr; },
       {"extra is an unknown field"}},
      // Model.
      {"model.type WordPiece",
       [](OrderedJson& j) { j["model"]["type"] = "WordPiece"; },
       {"model.type is string \"WordPiece\"", "expected \"BPE\"", "BPE only"}},
      {"model.dropout 0.5",
       [](OrderedJson& j) { j["model"]["dropout"] = 0.5; },
       {"model.dropout is number 0.5", "expected null or 0", "skips merges at random"}},
      {"model.dropout 2",
       [](OrderedJson& j) { j["model"]["dropout"] = 2; },
       {"model.dropout is number 2", "expected null or 0", "HF tokenizers refuses it"}},
      {"model.dropout string",
       [](OrderedJson& j) { j["model"]["dropout"] = "0"; },
       {"model.dropout is string \"0\"", "expected null or 0", "HF tokenizers refuses it"}},
      {"model.unk_token number",
       [](OrderedJson& j) { j["model"]["unk_token"] = 5; },
       {"model.unk_token is number 5", "expected null or a string"}},
      {"model.fuse_unk string",
       [](OrderedJson& j) { j["model"]["fuse_unk"] = "no"; },
       {"model.fuse_unk is string \"no\"", "expected true, false or null"}},
      {"model.ignore_merges number",
       [](OrderedJson& j) { j["model"]["ignore_merges"] = 1; },
       {"model.ignore_merges is number 1", "expected true, false or null"}},
      {"model.continuing_subword_prefix",
       [](OrderedJson& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       {"model.continuing_subword_prefix is string \"##\"", "expected \"\" or null",
        "changes the strings BPE looks up"}},
      {"model.end_of_word_suffix",
       [](OrderedJson& j) { j["model"]["end_of_word_suffix"] = "</w>"; },
       {"model.end_of_word_suffix is string \"</w>\"", "expected \"\" or null"}},
      {"model unknown field",
       [](OrderedJson& j) { j["model"]["cache_capacity"] = 5; },
       {"model.cache_capacity is an unknown field"}},
      // Added tokens: HF requires every flag.
      {"added normalized true",
       [](OrderedJson& j) { j["added_tokens"][2]["normalized"] = true; },
       {"added_tokens[2].normalized is boolean true", "expected false", "NFC-normalised text"}},
      {"added lstrip true",
       [](OrderedJson& j) { j["added_tokens"][2]["lstrip"] = true; },
       {"added_tokens[2].lstrip is boolean true", "expected false",
        "changes where the token matches"}},
      {"added single_word missing",
       [](OrderedJson& j) { j["added_tokens"][0].erase("single_word"); },
       {"added_tokens[0].single_word is missing", "expected false",
        "HF tokenizers refuses an added token without it"}},
      {"added rstrip missing",
       [](OrderedJson& j) { j["added_tokens"][1].erase("rstrip"); },
       {"added_tokens[1].rstrip is missing", "expected false"}},
      {"added normalized missing",
       [](OrderedJson& j) { j["added_tokens"][1].erase("normalized"); },
       {"added_tokens[1].normalized is missing", "expected false", "HF tokenizers refuses"}},
      {"added special missing",
       [](OrderedJson& j) { j["added_tokens"][3].erase("special"); },
       {"added_tokens[3].special is missing", "expected true or false", "HF tokenizers refuses"}},
      {"added special string",
       [](OrderedJson& j) { j["added_tokens"][3]["special"] = "true"; },
       {"added_tokens[3].special is string \"true\"", "expected true or false"}},
      {"added id elsewhere",
       [](OrderedJson& j) { j["added_tokens"][0]["id"] = 99999; },
       {"added_tokens[0].id is number 99999",
        "expected 4063 (added tokens follow the vocab in order", "HF ignores a stated id"}},
  };
  for (const Refused& r : cases) {
    SCOPED_TRACE(r.name);
    const std::string message = refusal(edited(r.edit));
    ASSERT_FALSE(message.empty()) << "was accepted";
    EXPECT_EQ(message.rfind("t.json: ", 0), 0u) << message;
    for (const char* part : r.parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "missing \"" << part << "\" in: " << message;
    }
  }
}

}  // namespace
}  // namespace lily

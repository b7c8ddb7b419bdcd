// tokenizer.json of any other kind is refused, naming the field, what was found and expected.
#include <gtest/gtest.h>

#include <functional>
#include <typeinfo>

#include "core/error.h"
#include "test_tokenizers.h"

namespace lily {
namespace {

using test::OrderedJson;

// Loads `text` and returns the InputError message ("" when it loads).
std::string refusal(const std::string& text) {
  try {
    Tokenizer::from_json(text, "t.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string refusal(const std::function<void(OrderedJson&)>& edit) {
  OrderedJson json = test::small_json();
  edit(json);
  return refusal(json.dump());
}

// Every message starts with the source name and holds all of `parts`.
void expect_refused(const std::string& message, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(message.empty()) << "was accepted";
  EXPECT_EQ(message.rfind("t.json: ", 0), 0u) << message;
  for (const char* part : parts) EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in: " << message;
}

TEST(Strict, TheBaselineLoads) { EXPECT_EQ(refusal([](OrderedJson&) {}), ""); }

TEST(Strict, MalformedJson) {
  expect_refused(refusal("{\"version\": "), {"not valid JSON"});
  expect_refused(refusal("[1, 2]"), {"the top level", "expected an object"});
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += "[";
  expect_refused(refusal(deep), {"nesting deeper than 32"});
  expect_refused(refusal("{\"version\": \"1.0\", \"version\": \"1.0\"}"), {"version: duplicate key"});
}

TEST(Strict, TopLevel) {
  expect_refused(refusal([](OrderedJson& j) { j["version"] = "2.0"; }), {"version", "\"2.0\"", "expected \"1.0\""});
  expect_refused(refusal([](OrderedJson& j) { j["truncation"] = {{"max_length", 5}}; }), {"truncation", "expected null"});
  expect_refused(refusal([](OrderedJson& j) { j["padding"] = {{"strategy", "BatchLongest"}}; }), {"padding", "expected null"});
  expect_refused(refusal([](OrderedJson& j) { j["extra"] = 1; }), {"extra is an unknown field"});
}

TEST(Strict, Normalizer) {
  expect_refused(refusal([](OrderedJson& j) { j["normalizer"] = {{"type", "NFKC"}}; }),
                 {"normalizer.type", "\"NFKC\"", "expected \"NFC\""});
  expect_refused(refusal([](OrderedJson& j) { j["normalizer"] = nullptr; }), {"normalizer is null", "expected {\"type\": \"NFC\"}"});
  expect_refused(refusal([](OrderedJson& j) { j.erase("normalizer"); }), {"normalizer is missing"});
}

TEST(Strict, PreTokenizer) {
  expect_refused(refusal([](OrderedJson& j) { j["pre_tokenizer"] = j["pre_tokenizer"]["pretokenizers"][1]; }),
                 {"pre_tokenizer", "expected \"Sequence\""});
  expect_refused(refusal([](OrderedJson& j) { j["pre_tokenizer"]["pretokenizers"].push_back({{"type", "Digits"}}); }),
                 {"pre_tokenizer.pretokenizers", "expected an array [Split, ByteLevel]"});
  expect_refused(refusal([](OrderedJson& j) {
                   j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}};
                 }),
                 {"pre_tokenizer.pretokenizers[0].pattern", "String", "expected {\"Regex\""});
  expect_refused(refusal([](OrderedJson& j) {
                   j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+";
                 }),
                 {"pre_tokenizer.pretokenizers[0].pattern.Regex", "\"\\\\s+\"", "the Qwen3.5/3.6 pattern", "Qwen2/Qwen3 pattern"});
  expect_refused(refusal([](OrderedJson& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }),
                 {"pretokenizers[0].behavior", "\"Removed\"", "expected \"Isolated\""});
  expect_refused(refusal([](OrderedJson& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = 0; }),
                 {"pretokenizers[0].invert", "number 0", "expected true or false"});
  expect_refused(refusal([](OrderedJson& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; }),
                 {"pretokenizers[1].add_prefix_space", "expected false"});
  expect_refused(refusal([](OrderedJson& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; }),
                 {"pretokenizers[1].use_regex", "expected false"});
  expect_refused(refusal([](OrderedJson& j) { j["pre_tokenizer"]["pretokenizers"][1].erase("trim_offsets"); }),
                 {"pretokenizers[1].trim_offsets is missing", "expected true or false"});
}

TEST(Strict, Qwen2PatternIsAccepted) {
  OrderedJson j = test::small_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = std::string(kQwen2SplitRegex);
  EXPECT_EQ(test::load(j).split_pattern(), SplitPattern::qwen2);
}

TEST(Strict, PostProcessorAndDecoder) {
  expect_refused(refusal([](OrderedJson& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; }),
                 {"post_processor"});
  EXPECT_EQ(refusal([](OrderedJson& j) { j["post_processor"] = nullptr; }), "");
  expect_refused(refusal([](OrderedJson& j) { j["decoder"] = {{"type", "Metaspace"}}; }), {"decoder"});
  // The decoder's flags change nothing (tokenizer_json_variants_test.cpp has the variants).
  EXPECT_EQ(refusal([](OrderedJson& j) { j["decoder"]["add_prefix_space"] = true; }), "");
  expect_refused(refusal([](OrderedJson& j) { j.erase("decoder"); }), {"decoder is missing"});
}

TEST(Strict, ModelOptions) {
  expect_refused(refusal([](OrderedJson& j) { j["model"]["type"] = "WordPiece"; }),
                 {"model.type", "\"WordPiece\"", "expected \"BPE\""});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["dropout"] = 0.1; }), {"model.dropout", "0.1", "expected null"});
  // unk_token, byte_fallback, fuse_unk and ignore_merges are accepted with any value
  // (tokenizer_json_variants_test.cpp).
  expect_refused(refusal([](OrderedJson& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
                 {"model.continuing_subword_prefix", "\"##\"", "expected \"\" or null"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["end_of_word_suffix"] = "</w>"; }), {"model.end_of_word_suffix"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["cache_capacity"] = 5; }), {"model.cache_capacity is an unknown field"});
  // Absent options take HF's defaults, which are the accepted values.
  EXPECT_EQ(refusal([](OrderedJson& j) {
              for (const char* k : {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                                    "fuse_unk", "byte_fallback", "ignore_merges"}) {
                j["model"].erase(k);
              }
            }),
            "");
}

TEST(Strict, Vocab) {
  expect_refused(refusal([](OrderedJson& j) { j["model"].erase("vocab"); }), {"model.vocab is missing"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["vocab"] = OrderedJson::array(); }),
                 {"model.vocab is array", "expected an object"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["vocab"]["extra"] = 1000; }),
                 {"model.vocab[\"extra\"]", "id 1000", "expected ids 0..300"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["vocab"]["extra"] = 3; }),
                 {"model.vocab[\"extra\"]", "id 3", "an id of its own"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["vocab"]["extra"] = -1; }),
                 {"model.vocab[\"extra\"] is number -1", "expected a non-negative integer id"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["vocab"]["extra"] = "7"; }),
                 {"model.vocab[\"extra\"] is string", "expected a non-negative integer id"});
  {
    std::string text = test::small_json().dump();
    const size_t at = text.find("\"vocab\":{");
    ASSERT_NE(at, std::string::npos);
    text.insert(at + 9, "\"!\":300,");
    expect_refused(refusal(text), {"model.vocab", "the key \"!\" twice", "expected distinct keys"});
  }
  // Without the ByteLevel character of byte 0x21 ("!"), whose id is 0.
  expect_refused(refusal([](OrderedJson& j) {
                   OrderedJson vocab = OrderedJson::object();
                   for (auto& [k, v] : j["model"]["vocab"].items()) {
                     if (k == "!") continue;
                     vocab[k] = v.get<uint32_t>() - 1;
                   }
                   j["model"]["vocab"] = vocab;
                   j["model"]["merges"] = OrderedJson::array();
                   for (auto& t : j["added_tokens"]) t["id"] = t["id"].get<uint32_t>() - 1;
                 }),
                 {"model.vocab", "without \"!\"", "byte 33", "expected all 256 ByteLevel characters"});
}

TEST(Strict, Merges) {
  expect_refused(refusal([](OrderedJson& j) { j["model"].erase("merges"); }), {"model.merges is missing"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["merges"].push_back(OrderedJson::array({"zz", "q"})); }),
                 {"model.merges[", "\"zz\"", "expected tokens that are in model.vocab"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["merges"].push_back(OrderedJson::array({"q", "z"})); }),
                 {"\"qz\"", "expected tokens that are in model.vocab"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["merges"][1] = "a b"; }),
                 {"model.merges[1] is a string, but the earlier merges are [\"a\", \"b\"] pairs"});
  expect_refused(refusal([](OrderedJson& j) {
                   for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
                   j["model"]["merges"][1] = "a b c";
                 }),
                 {"model.merges[1]", "\"a b c\"", "expected two tokens separated by one space"});
  expect_refused(refusal([](OrderedJson& j) {
                   for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
                   j["model"]["merges"][1] = OrderedJson::array({"a", "b"});
                 }),
                 {"model.merges[1] is an array, but the earlier merges are \"a b\" strings"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["merges"][0].push_back("c"); }),
                 {"model.merges[0] has more than 2 entries"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["merges"][0] = OrderedJson::array({"a"}); }),
                 {"model.merges[0] has 1 entries", "expected a pair"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["merges"][0] = 5; }),
                 {"model.merges[0] is number 5", "expected \"a b\" or [\"a\", \"b\"]"});
  expect_refused(refusal([](OrderedJson& j) { j["model"]["merges"][0] = OrderedJson::array({"a", 5}); }),
                 {"model.merges[0][1] is number 5", "expected a string"});
}

TEST(Strict, AddedTokens) {
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][0]["id"] = 9999; }),
                 {"added_tokens[0].id", "9999", "expected 300 (added tokens follow the vocab in order"});
  expect_refused(refusal([](OrderedJson& j) { std::swap(j["added_tokens"][0], j["added_tokens"][1]); }),
                 {"added_tokens[0].id", "expected 300"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2]["lstrip"] = true; }),
                 {"added_tokens[2].lstrip", "expected false"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2]["rstrip"] = true; }), {"added_tokens[2].rstrip"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2]["single_word"] = true; }), {"added_tokens[2].single_word"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2]["normalized"] = true; }),
                 {"added_tokens[2].normalized", "true", "expected false"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2].erase("normalized"); }),
                 {"added_tokens[2].normalized is missing", "expected false", "HF tokenizers refuses"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2]["content"] = "<|endoftext|>"; }),
                 {"added_tokens[2].content", "again", "expected distinct contents"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2]["content"] = "a"; }),
                 {"added_tokens[2].content", "also a model.vocab token"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2]["content"] = ""; }),
                 {"added_tokens[2].content", "expected a non-empty string"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2]["special"] = "yes"; }), {"added_tokens[2].special"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"][2]["weight"] = 1; }),
                 {"added_tokens[2].weight is an unknown field"});
  expect_refused(refusal([](OrderedJson& j) { j["added_tokens"] = {{"a", 1}}; }), {"added_tokens", "expected an array"});
}

TEST(Strict, MissingFilesAndSizes) {
  try {
    Tokenizer::from_file("/nonexistent/tokenizer.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace lily

namespace lily {
namespace {

// Hostile files: every truncation point and random byte changes of a valid file either
// load or are refused with InputError; nothing else escapes (and nothing crashes).
TEST(Strict, TruncatedAndCorruptedFilesAreRefusedCleanly) {
  const std::string text = test::small_json().dump();
  auto check = [](const std::string& candidate) {
    try {
      const Tokenizer t = Tokenizer::from_json(candidate, "t.json");
      (void)t.encode("probe text <|im_end|> \u00e9");
    } catch (const InputError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected " << typeid(e).name() << ": " << e.what();
    }
  };
  for (size_t cut = 0; cut < text.size(); cut += 1 + cut / 50) check(text.substr(0, cut));
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>(state >> 33);
  };
  for (int trial = 0; trial < 400; ++trial) {
    std::string corrupted = text;
    for (int k = 0; k < 3; ++k) corrupted[next() % corrupted.size()] = static_cast<char>(next() % 256);
    check(corrupted);
  }
}

}  // namespace
}  // namespace lily

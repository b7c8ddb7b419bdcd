// Shared tokenizers for the text tests: synthetic ones built in memory, and JSON helpers.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "synth/synthetic_tokenizer.h"
#include "text/tokenizer.h"

namespace lily::test {

using OrderedJson = nlohmann::ordered_json;

// The tiny profile's tokenizer (4063 BPE ids + 33 added), seed 1.
inline const SyntheticTokenizerFiles& tiny_files() {
  static const SyntheticTokenizerFiles files = make_synthetic_tokenizer(4063, 1);
  return files;
}
inline const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::from_json(tiny_files().tokenizer_json, "tiny tokenizer.json");
  return t;
}

// The production-shaped one (248044 BPE ids + 33 added), seed 1.
inline const Tokenizer& full() {
  static const Tokenizer t =
      Tokenizer::from_json(make_synthetic_tokenizer(248044, 1).tokenizer_json, "full tokenizer.json");
  return t;
}

// A small valid tokenizer.json (300 BPE ids) as editable JSON, for the strict checks.
inline OrderedJson small_json() {
  static const std::string text = make_synthetic_tokenizer(300, 7).tokenizer_json;
  return OrderedJson::parse(text);
}

inline Tokenizer load(const OrderedJson& json) { return Tokenizer::from_json(json.dump(), "t.json"); }


}  // namespace lily::test

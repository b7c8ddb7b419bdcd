// Incremental detokenisation: only whole characters come out, same text as decode().
#include <gtest/gtest.h>

#include <random>

#include "test_tokenizers.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace lily {
namespace {

// Id of the one-byte token for byte b in the tiny tokenizer.
uint32_t byte_id(uint8_t b) {
  std::string bytes(1, static_cast<char>(b));
  const Tokenizer& t = test::tiny();
  for (uint32_t id = 0; id < 256; ++id) {
    if (t.token_bytes(id, false) == bytes) return id;
  }
  ADD_FAILURE() << "no token for byte " << int{b};
  return 0;
}

TEST(IncrementalDetokenizer, HoldsBackSplitCharacters) {
  IncrementalDetokenizer d(test::tiny());
  EXPECT_EQ(d.push(byte_id('a')), "a");
  EXPECT_EQ(d.push(byte_id(0xC3)), "");
  EXPECT_EQ(d.pending(), 1u);
  EXPECT_EQ(d.push(byte_id(0xA9)), "\u00e9");
  EXPECT_EQ(d.pending(), 0u);
  // A 4-byte emoji one byte at a time.
  EXPECT_EQ(d.push(byte_id(0xF0)), "");
  EXPECT_EQ(d.push(byte_id(0x9F)), "");
  EXPECT_EQ(d.push(byte_id(0x98)), "");
  EXPECT_EQ(d.push(byte_id(0x80)), "\U0001F600");
  EXPECT_EQ(d.finish(), "");
}

TEST(IncrementalDetokenizer, IllFormedBytesBecomeReplacementCharacters) {
  IncrementalDetokenizer d(test::tiny());
  EXPECT_EQ(d.push(byte_id(0xE2)), "");
  EXPECT_EQ(d.push(byte_id(0x82)), "");
  EXPECT_EQ(d.push(byte_id('A')), "\uFFFDA");        // E2 82 can no longer complete
  EXPECT_EQ(d.push(byte_id(0xFF)), "\uFFFD");        // never valid: out at once
  EXPECT_EQ(d.push(byte_id(0xF0)), "");
  EXPECT_EQ(d.finish(), "\uFFFD");                   // cut off by the end
  EXPECT_EQ(d.pending(), 0u);
  EXPECT_EQ(d.push(byte_id('b')), "b");              // reusable after finish()
}

TEST(IncrementalDetokenizer, SkipsSpecialTokensLikeDecode) {
  const Tokenizer& t = test::tiny();
  IncrementalDetokenizer skip(t, true);
  IncrementalDetokenizer keep(t, false);
  const uint32_t im_end = *t.token_to_id("<|im_end|>");
  const uint32_t think = *t.token_to_id("<think>");
  EXPECT_EQ(skip.push(im_end), "");
  EXPECT_EQ(keep.push(im_end), "<|im_end|>");
  EXPECT_EQ(skip.push(think), "<think>");
  // A special token between the bytes of a character does not end it when skipped.
  EXPECT_EQ(skip.push(byte_id(0xC3)), "");
  EXPECT_EQ(skip.push(im_end), "");
  EXPECT_EQ(skip.push(byte_id(0xA9)), "\u00e9");
}

TEST(IncrementalDetokenizer, ConcatenationEqualsDecodeOnRandomIds) {
  const Tokenizer& t = test::tiny();
  std::mt19937 engine(5);
  auto rng = [&engine] { return static_cast<uint32_t>(engine()); };
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint32_t> ids;
    const size_t n = rng() % 12;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t r = rng() % 100;
      // Mostly byte tokens (to cut characters), some merged tokens, added and unknown ids.
      ids.push_back(r < 60 ? rng() % 256 : r < 90 ? rng() % t.vocab_size() : r < 97 ? 4063 + rng() % 33 : 4096 + rng() % 500);
    }
    for (bool skip : {true, false}) {
      IncrementalDetokenizer d(t, skip);
      std::string streamed;
      for (uint32_t id : ids) {
        const std::string piece = d.push(id);
        EXPECT_LE(d.pending(), 3u);
        streamed += piece;
      }
      streamed += d.finish();
      ASSERT_EQ(streamed, t.decode(ids, skip));
    }
  }
}

TEST(IncrementalDetokenizer, StreamsRealTextExactly) {
  const Tokenizer& t = test::tiny();
  const std::string text = "Stream: \u00e9\u00e8 \u4e2d\u6587 \U0001F468\u200d\U0001F469 \u0926\u093f\u0932 done";
  IncrementalDetokenizer d(t);
  std::string streamed;
  for (uint32_t id : t.encode(text)) {
    const std::string piece = d.push(id);
    // Each piece is whole characters: valid UTF-8 on its own.
    EXPECT_EQ(utf8::find_invalid(piece), std::string_view::npos);
    streamed += piece;
  }
  EXPECT_EQ(streamed + d.finish(), text);
}

}  // namespace
}  // namespace lily

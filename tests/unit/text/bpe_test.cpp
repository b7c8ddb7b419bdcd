// BPE merging: rank order, ties, HF's queue semantics, the cache, both merge forms.
#include "text/bpe.h"

#include <gtest/gtest.h>

#include <numeric>

#include "test_tokenizers.h"
#include "text/byte_level.h"

namespace lily {
namespace {

// Byte b has id b; merges name their parts by text for readability.
class Bpe {
 public:
  explicit Bpe(std::initializer_list<std::pair<std::string, std::string>> merges) {
    for (uint32_t b = 0; b < 256; ++b) ids_[std::string(1, static_cast<char>(b))] = b;
    std::array<uint32_t, 256> byte_ids{};
    std::iota(byte_ids.begin(), byte_ids.end(), 0u);
    for (const auto& [a, b] : merges) {
      if (ids_.count(a + b) != 0) continue;
      ids_[a + b] = static_cast<uint32_t>(256 + names_.size());
      names_.push_back(a + b);
    }
    std::vector<MergeRule> rules;
    for (const auto& [a, b] : merges) rules.push_back({ids_.at(a), ids_.at(b), ids_.at(a + b)});
    model_ = std::make_unique<BpeModel>(byte_ids, rules);
  }
  // Token texts of `word`, through the cache (encode_word) and without (merge_word).
  std::vector<std::string> tokens(std::string_view word) const {
    std::vector<uint32_t> cached;
    std::vector<uint32_t> direct;
    model_->encode_word(word, cached);
    model_->encode_word(word, cached);  // second time from the cache
    model_->merge_word(word, direct);
    std::vector<std::string> out;
    for (uint32_t id : direct) out.push_back(id < 256 ? std::string(1, static_cast<char>(id)) : names_[id - 256]);
    EXPECT_EQ(cached.size(), 2 * direct.size());
    EXPECT_TRUE(std::equal(direct.begin(), direct.end(), cached.begin()));
    EXPECT_TRUE(std::equal(direct.begin(), direct.end(), cached.begin() + static_cast<std::ptrdiff_t>(direct.size())));
    return out;
  }
  const BpeModel& model() const { return *model_; }

 private:
  std::map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
  std::unique_ptr<BpeModel> model_;
};

using V = std::vector<std::string>;

TEST(Bpe, MergesByRankNotByPosition) {
  const Bpe bpe({{"b", "c"}, {"a", "b"}, {"ab", "c"}});
  EXPECT_EQ(bpe.tokens("abc"), (V{"a", "bc"}));  // (b,c) ranks first, (a,bc) is no rule
  EXPECT_EQ(bpe.tokens("ab"), (V{"ab"}));
  EXPECT_EQ(bpe.tokens("abab"), (V{"ab", "ab"}));
  EXPECT_EQ(bpe.tokens("x"), (V{"x"}));
  EXPECT_EQ(bpe.tokens(""), (V{}));
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  const Bpe bpe({{"a", "a"}});
  EXPECT_EQ(bpe.tokens("aaa"), (V{"aa", "a"}));
  EXPECT_EQ(bpe.tokens("aaaaa"), (V{"aa", "aa", "a"}));
}

TEST(Bpe, NewPairsJoinTheQueue) {
  const Bpe bpe({{"a", "a"}, {"aa", "aa"}, {"aaaa", "a"}});
  EXPECT_EQ(bpe.tokens("aaaa"), (V{"aaaa"}));
  EXPECT_EQ(bpe.tokens("aaaaa"), (V{"aaaaa"}));
  EXPECT_EQ(bpe.tokens("aaaaaaa"), (V{"aaaa", "aa", "a"}));
}

TEST(Bpe, LaterRuleRanksCanApplyBeforeEarlierOnesWhenTheirPairAppearsFirst) {
  // (x,y) ranks last but is the only pair present at first; its product then merges.
  const Bpe bpe({{"xy", "z"}, {"x", "y"}});
  EXPECT_EQ(bpe.tokens("xyz"), (V{"xyz"}));
}

TEST(Bpe, TwoRoutesToTheSameToken) {
  // "abc" from (ab,c) and from (a,bc): whichever pair the queue offers first.
  const Bpe bpe({{"a", "b"}, {"b", "c"}, {"a", "bc"}, {"ab", "c"}});
  EXPECT_EQ(bpe.tokens("abc"), (V{"abc"}));
  EXPECT_EQ(bpe.tokens("abcbc"), (V{"abc", "bc"}));
}

TEST(Bpe, RepeatedPairTheLaterRuleWins) {
  // HF collects merges into a map: the later duplicate's rank counts. Here (c,d) at rank
  // 2 loses against (b,c) at rank 1, so "bcd" gives b+c first.
  const Bpe bpe({{"c", "d"}, {"b", "c"}, {"c", "d"}});
  EXPECT_EQ(bpe.tokens("bcd"), (V{"bc", "d"}));
}

TEST(Bpe, LongWordsMergeInNLogN) {
  const Bpe bpe({{"a", "a"}, {"aa", "aa"}, {"aaaa", "aaaa"}});
  const std::string word(1 << 20, 'a');
  std::vector<uint32_t> ids;
  bpe.model().merge_word(word, ids);
  EXPECT_EQ(ids.size(), (size_t{1} << 20) / 8);
}

TEST(Bpe, StringAndPairMergeFormsAreTheSame) {
  test::OrderedJson pairs = test::small_json();
  test::OrderedJson strings = pairs;
  test::OrderedJson& list = strings["model"]["merges"];
  for (auto& m : list) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  ASSERT_TRUE(list[0].is_string());
  const Tokenizer a = test::load(pairs);
  const Tokenizer b = test::load(strings);
  const std::string text = "the user said: 'hello' to the assistant\n\n  and then some code();";
  EXPECT_EQ(a.encode(text), b.encode(text));
  EXPECT_LT(a.encode(text).size(), text.size());  // merges did apply
}

}  // namespace
}  // namespace lily

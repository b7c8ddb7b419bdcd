// Tests for openai-mode request parsing: every field, range edges, refusals, ignored fields, order.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/strict_json.h"
#include "server/openai_types.h"
#include "text/utf8.h"

namespace lily {
namespace {

const ServerLimits kOpenAi{};  // openai is the default mode

ServerLimits strict_limits() {
  ServerLimits limits;
  limits.mode = ApiMode::strict;
  return limits;
}
const ServerLimits kStrict = strict_limits();

const std::string kHead = R"({"model":"Qwen3.6-35B-A3B","messages":)";
const std::string kHi = R"([{"role":"user","content":"hi"}])";

// A valid body with `extra` spliced in after the messages (extra starts with a comma).
std::string body_with(const std::string& extra) {
  return kHead + kHi + extra + "}";
}

// A body with the given messages array.
std::string with_messages(const std::string& messages, const std::string& extra = "") {
  return kHead + messages + extra + "}";
}

ChatRequest parse(const std::string& body, const ServerLimits& limits = kOpenAi) {
  return parse_chat_request(body, limits);
}

// The ApiError parse_chat_request throws for `body`; a test failure if it accepts it.
ApiError error_of(const std::string& body, const ServerLimits& limits = kOpenAi) {
  try {
    parse_chat_request(body, limits);
  } catch (const ApiError& error) {
    const Json parsed = Json::parse(error_response_json(error));
    EXPECT_EQ(parsed["error"]["message"], Json(error.message));
    EXPECT_EQ(utf8::find_invalid(error.message), std::string::npos);
    return error;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "");
}

// A 400 with exactly this message and param.
void expect_error(const std::string& body, const std::string& param, const std::string& message) {
  SCOPED_TRACE(body);
  const ApiError error = error_of(body);
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_EQ(error.param, param);
  EXPECT_EQ(error.message, message);
  EXPECT_FALSE(error.code.has_value());
}

constexpr const char* kParse = "parsing chat request: ";

// How openai-mode messages quote a JSON literal: describe_json's form ("number 5",
// "string \"x\""), and a null as plain "null".
std::string found(const char* literal) {
  return std::string_view(literal) == "null" ? "null" : describe_json(Json::parse(literal));
}

// ---- shared with strict mode ----------------------------------------------------------

TEST(OpenAiRequest, MinimalBodyGetsDefaults) {
  const ChatRequest r = parse(body_with(""));
  EXPECT_EQ(r.model, "Qwen3.6-35B-A3B");
  ASSERT_EQ(r.messages.size(), 1U);
  EXPECT_EQ(r.messages[0].content, "hi");
  EXPECT_EQ(r.max_tokens, 128U);
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.prompt_cache_key.has_value());
  EXPECT_FALSE(r.sampling.any());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  EXPECT_TRUE(r.ignored_fields.empty());
}

// Whatever strict mode accepts, openai mode accepts with the same result.
TEST(OpenAiRequest, StrictBodiesParseTheSame) {
  for (const std::string& body : std::vector<std::string>{
           body_with(""),
           R"({"prompt_cache_key":"conv-1","stream":false,"max_tokens":7,)"
           R"("messages":[{"content":"be brief","role":"system"},{"role":"user","content":"a"},)"
           R"({"role":"assistant","content":"b"},{"role":"user","content":"c\u00e9"}],)"
           R"("model":"Qwen3.6-35B-A3B"})",
           body_with(R"(,"prompt_cache_key":null)"), body_with(R"(,"prompt_cache_key":"")"),
           body_with(R"(,"max_tokens":18446744073709551615)"), body_with(R"(,"max_tokens":1)"),
           " \n{ \"model\" : \"Qwen3.6-35B-A3B\",\t\"messages\" : [ { \"role\" : \"user\" , "
           "\"content\" : \"line\\nnext \\ud83d\\ude00\" } ] }\r\n"}) {
    SCOPED_TRACE(body);
    const ChatRequest s = parse(body, kStrict);
    const ChatRequest o = parse(body, kOpenAi);
    EXPECT_EQ(o.model, s.model);
    ASSERT_EQ(o.messages.size(), s.messages.size());
    for (size_t i = 0; i < s.messages.size(); ++i) {
      EXPECT_EQ(o.messages[i].role, s.messages[i].role);
      EXPECT_EQ(o.messages[i].content, s.messages[i].content);
    }
    EXPECT_EQ(o.max_tokens, s.max_tokens);
    EXPECT_EQ(o.max_tokens_given, s.max_tokens_given);
    EXPECT_EQ(o.stream, s.stream);
    EXPECT_EQ(o.prompt_cache_key, s.prompt_cache_key);
    EXPECT_EQ(render_request_prompt(o), render_request_prompt(s));
    EXPECT_TRUE(o.ignored_fields.empty());
  }
}

// The nesting cap: Lily's 16 levels in strict mode; 64 in openai mode, where tool schemas and
// call arguments nest deeper.
TEST(OpenAiRequest, NestingCapIsDeeperThanStrictModes) {
  const std::string deep17 = std::string(17, '[') + std::string(17, ']');
  EXPECT_EQ(error_of(body_with(",\"max_tokens\":" + deep17), kStrict).message,
            std::string(kParse) + "request body: JSON nesting deeper than 16 levels");
  EXPECT_EQ(error_of(body_with(",\"max_tokens\":" + deep17)).message,
            std::string(kParse) + "max_tokens must be a non-negative integer (at most "
                                  "18446744073709551615), found " +
                describe_json(Json::parse(deep17)));
  EXPECT_EQ(error_of(body_with(",\"max_tokens\":" + std::string(100, '['))).message,
            std::string(kParse) + "request body: JSON nesting deeper than 64 levels");
}

// Errors of the steps both modes share are identical (status, message, param, code).
TEST(OpenAiRequest, SharedStepsFailTheSameWayAsStrict) {
  const std::string deep(100, '[');
  for (const std::string& body : std::vector<std::string>{
           "",
           "{",
           body_with("") + "x",
           "{'model':1}",
           body_with(R"(,"max_tokens":1e400)"),
           std::string("{\"model\":\"a\0b\"}", 15),
           "[]",
           "null",
           "42",
           R"({"model":"Qwen3.6-35B-A3B","model":"x","messages":[]})",
           body_with(",\"prompt_cache_key\":\"\xFF\""),
           "\xEF\xBB\xBF" + body_with(""),
           R"({"model":5,"messages":[]})",
           R"({"messages":[{"role":"user","content":"x"}]})",
           R"({"model":"Qwen3.6-35B-A3B"})",
           "{}",
           with_messages(R"(["hi"])"),
           with_messages(R"({})"),
           with_messages(R"("hi")"),
           with_messages("null"),
           body_with(R"(,"max_tokens":-1)"),
           body_with(R"(,"max_tokens":1.5)"),
           body_with(R"(,"max_tokens":128.0)"),
           body_with(R"(,"max_tokens":18446744073709551616)"),
           body_with(R"(,"max_tokens":"10")"),
           body_with(R"(,"stream":"true")"),
           body_with(R"(,"prompt_cache_key":5)"),
           R"({"model":"gpt-4o","messages":[{"role":"user","content":"x"}]})",
           R"({"model":"Qwen3.6-35B-A3B","messages":[]})",
           with_messages(R"([{"role":"user","content":"x"},{"role":"assistant","content":"y"}])"),
           with_messages(R"([{"role":"system","content":"x"}])"),
           body_with(R"(,"max_tokens":0)"),
           body_with(R"(,"max_tokens":-0)")}) {
    SCOPED_TRACE(body);
    const ApiError s = error_of(body, kStrict);
    const ApiError o = error_of(body, kOpenAi);
    EXPECT_EQ(o.status, s.status);
    EXPECT_EQ(o.message, s.message);
    EXPECT_EQ(o.code, s.code);
    // Inside messages, openai mode names the exact place; elsewhere the same field.
    if (s.param == "messages" && o.param != "messages") {
      EXPECT_EQ(o.param->rfind("messages[", 0), 0U) << *o.param;
    } else {
      EXPECT_EQ(o.param, s.param);
    }
  }
  ServerLimits small;
  small.max_body_bytes = 10;
  EXPECT_EQ(error_of(body_with(""), small).status, 413);
}

// ---- max_tokens and max_completion_tokens ---------------------------------------------

TEST(OpenAiRequest, MaxCompletionTokensIsAnAlias) {
  ChatRequest r = parse(body_with(R"(,"max_completion_tokens":7)"));
  EXPECT_EQ(r.max_tokens, 7U);
  EXPECT_TRUE(r.max_tokens_given);
  r = parse(body_with(R"(,"max_completion_tokens":7,"max_tokens":7)"));
  EXPECT_EQ(r.max_tokens, 7U);
  r = parse(body_with(R"(,"max_completion_tokens":18446744073709551615)"));
  EXPECT_EQ(r.max_tokens, std::numeric_limits<uint64_t>::max());
  // null means absent.
  r = parse(body_with(R"(,"max_completion_tokens":null,"max_tokens":null)"));
  EXPECT_EQ(r.max_tokens, 128U);
  EXPECT_FALSE(r.max_tokens_given);
  r = parse(body_with(R"(,"max_completion_tokens":null,"max_tokens":9)"));
  EXPECT_EQ(r.max_tokens, 9U);
  r = parse(body_with(R"(,"max_completion_tokens":5,"max_tokens":null)"));
  EXPECT_EQ(r.max_tokens, 5U);
}

TEST(OpenAiRequest, MaxCompletionTokensErrors) {
  expect_error(body_with(R"(,"max_completion_tokens":8,"max_tokens":7)"), "max_completion_tokens",
               "max_tokens (7) and max_completion_tokens (8) differ; send one of them");
  expect_error(body_with(R"(,"max_completion_tokens":0)"), "max_completion_tokens",
               "max_completion_tokens must be greater than zero");
  expect_error(body_with(R"(,"max_completion_tokens":0,"max_tokens":0)"), "max_tokens",
               "max_tokens must be greater than zero");
  expect_error(body_with(R"(,"max_tokens":0,"max_completion_tokens":5)"), "max_completion_tokens",
               "max_tokens (0) and max_completion_tokens (5) differ; send one of them");
  for (const char* value :
       {"-1", "1.5", "128.0", "1e3", "18446744073709551616", "\"10\"", "true", "[]", "{}"}) {
    expect_error(body_with(std::string(",\"max_completion_tokens\":") + value),
                 "max_completion_tokens",
                 std::string(kParse) +
                     "max_completion_tokens must be a non-negative integer (at most "
                     "18446744073709551615), found " +
                     found(value));
  }
}

// ---- stream, stream_options, n -------------------------------------------------------

TEST(OpenAiRequest, StreamAndStreamOptions) {
  ChatRequest r = parse(body_with(R"(,"stream":true)"));
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.include_usage);
  r = parse(body_with(R"(,"stream":true,"stream_options":{"include_usage":true})"));
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignored_fields.empty());
  r = parse(body_with(R"(,"stream":true,"stream_options":{"include_usage":false})"));
  EXPECT_FALSE(r.include_usage);
  r = parse(body_with(R"(,"stream":true,"stream_options":{"include_usage":null})"));
  EXPECT_FALSE(r.include_usage);
  // Without streaming, stream_options is accepted and does nothing.
  r = parse(body_with(R"(,"stream":false,"stream_options":{"include_usage":true})"));
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  r = parse(body_with(R"(,"stream_options":{"include_usage":true})"));
  EXPECT_FALSE(r.include_usage);
  // Other keys are ignored and reported.
  r = parse(body_with(
      R"(,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true})"));
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.ignored_fields, std::vector<std::string>{"stream_options.continuous_usage_stats"});
  r = parse(body_with(R"(,"stream":null,"stream_options":null)"));
  EXPECT_FALSE(r.stream);
}

TEST(OpenAiRequest, StreamErrors) {
  expect_error(body_with(R"(,"stream":"yes")"), "stream",
               std::string(kParse) + "stream must be true or false, found string \"yes\"");
  expect_error(
      body_with(R"(,"stream":true,"stream_options":true)"), "stream_options",
      std::string(kParse) + "stream_options must be an object or null, found boolean true");
  expect_error(body_with(R"(,"stream":true,"stream_options":{"include_usage":1})"),
               "stream_options.include_usage",
               std::string(kParse) +
                   "stream_options.include_usage must be true, false or null, found number 1");
}

TEST(OpenAiRequest, N) {
  EXPECT_NO_THROW(parse(body_with(R"(,"n":1)")));
  EXPECT_NO_THROW(parse(body_with(R"(,"n":null)")));
  expect_error(body_with(R"(,"n":2)"), "n", "n > 1 is not supported");
  expect_error(body_with(R"(,"n":9223372036854775807)"), "n", "n > 1 is not supported");
  for (const char* value :
       {"0", "-1", "1.5", "1.0", "\"1\"", "true", "[1]", "9223372036854775808"}) {
    expect_error(body_with(std::string(",\"n\":") + value), "n",
                 std::string(kParse) + "n must be a positive integer, found " + found(value));
  }
}

// ---- sampling fields -------------------------------------------------------------------

struct NumberCase {
  const char* field;
  const char* range;
  std::vector<std::pair<const char*, double>> accepted;  // JSON literal, stored value
  std::vector<const char*> refused;
  std::optional<double> SamplingFields::*member;
};

TEST(OpenAiRequest, NumberFieldsAtTheirEdges) {
  const std::vector<NumberCase> cases = {
      {"temperature",
       "[0, 2]",
       {{"0", 0.0}, {"2", 2.0}, {"0.7", 0.7}, {"-0.0", 0.0}, {"1e-300", 1e-300}, {"2.0", 2.0}},
       {"-0.01", "2.0001", "3", "-1"},
       &SamplingFields::temperature},
      {"top_p",
       "(0, 1]",
       {{"1", 1.0}, {"0.0001", 0.0001}, {"1e-300", 1e-300}},
       {"0", "-0.0", "-0.1", "1.01"},
       &SamplingFields::top_p},
      {"min_p",
       "[0, 1]",
       {{"0", 0.0}, {"1", 1.0}, {"0.05", 0.05}},
       {"-0.001", "1.001"},
       &SamplingFields::min_p},
      {"presence_penalty",
       "[-2, 2]",
       {{"-2", -2.0}, {"2", 2.0}, {"0", 0.0}, {"1.5", 1.5}},
       {"-2.001", "2.001"},
       &SamplingFields::presence_penalty},
      {"frequency_penalty",
       "[-2, 2]",
       {{"-2", -2.0}, {"2", 2.0}, {"-0.5", -0.5}},
       {"-2.001", "2.001", "100"},
       &SamplingFields::frequency_penalty},
      {"repetition_penalty",
       "(0, 2]",
       {{"2", 2.0}, {"0.0001", 0.0001}, {"1", 1.0}},
       {"0", "-1", "2.01"},
       &SamplingFields::repetition_penalty},
  };
  for (const NumberCase& c : cases) {
    SCOPED_TRACE(c.field);
    for (const auto& [literal, value] : c.accepted) {
      const ChatRequest r = parse(body_with(std::string(",\"") + c.field + "\":" + literal));
      ASSERT_TRUE((r.sampling.*c.member).has_value()) << literal;
      EXPECT_EQ(*(r.sampling.*c.member), value) << literal;
      EXPECT_TRUE(r.sampling.any());
    }
    std::vector<const char*> refused = c.refused;
    for (const char* type_error : {"\"1\"", "true", "[]", "{}"}) refused.push_back(type_error);
    for (const char* literal : refused) {
      expect_error(body_with(std::string(",\"") + c.field + "\":" + literal), c.field,
                   std::string(kParse) + c.field + " must be a number in " + c.range + ", found " +
                       found(literal));
    }
    const ChatRequest none = parse(body_with(std::string(",\"") + c.field + "\":null"));
    EXPECT_FALSE((none.sampling.*c.member).has_value());
    EXPECT_FALSE(none.sampling.any());
  }
  expect_error(body_with(R"(,"temperature":3)"), "temperature",
               "parsing chat request: temperature must be a number in [0, 2], found number 3");
}

TEST(OpenAiRequest, TopK) {
  const std::vector<std::pair<const char*, int64_t>> accepted = {
      {"0", 0}, {"1", 1}, {"20", 20}, {"-1", 0}, {"9223372036854775807", INT64_MAX}};
  for (const auto& [literal, value] : accepted) {
    const ChatRequest r = parse(body_with(std::string(",\"top_k\":") + literal));
    EXPECT_EQ(r.sampling.top_k, value) << literal;
    EXPECT_TRUE(r.sampling.any());
  }
  for (const char* literal : {"-2", "1.5", "20.0", "1e1", "\"20\"", "true", "9223372036854775808",
                              "-9223372036854775808"}) {
    expect_error(body_with(std::string(",\"top_k\":") + literal), "top_k",
                 std::string(kParse) + "top_k must be an integer >= 0, or -1 for no limit, found " +
                     found(literal));
  }
  EXPECT_FALSE(parse(body_with(R"(,"top_k":null)")).sampling.top_k.has_value());
}

TEST(OpenAiRequest, Seed) {
  const std::vector<std::pair<const char*, uint64_t>> accepted = {
      {"0", 0},
      {"42", 42},
      {"-1", UINT64_MAX},
      {"-9223372036854775808", uint64_t{1} << 63},
      {"9223372036854775807", uint64_t{INT64_MAX}},
      {"18446744073709551615", UINT64_MAX}};
  for (const auto& [literal, value] : accepted) {
    const ChatRequest r = parse(body_with(std::string(",\"seed\":") + literal));
    EXPECT_EQ(r.sampling.seed, value) << literal;
    EXPECT_TRUE(r.sampling.any());
  }
  for (const char* literal : {"1.5", "1.0", "1e3", "\"1\"", "true", "18446744073709551616",
                              "-9223372036854775809", "[]"}) {
    expect_error(body_with(std::string(",\"seed\":") + literal), "seed",
                 std::string(kParse) +
                     "seed must be an integer (at least -9223372036854775808, at most "
                     "18446744073709551615), found " +
                     found(literal));
  }
  EXPECT_FALSE(parse(body_with(R"(,"seed":null)")).sampling.any());
}

TEST(OpenAiRequest, LogitBias) {
  ChatRequest r = parse(body_with(R"(,"logit_bias":{"151643":-100,"0":100,"10":0.5,"9":-0.25})"));
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<std::pair<uint32_t, float>>{
                                       {0, 100.0f}, {9, -0.25f}, {10, 0.5f}, {151643, -100.0f}}));
  EXPECT_TRUE(r.sampling.any());
  r = parse(body_with(R"(,"logit_bias":{})"));
  EXPECT_TRUE(r.sampling.logit_bias.empty());
  EXPECT_FALSE(r.sampling.any());
  EXPECT_FALSE(parse(body_with(R"(,"logit_bias":null)")).sampling.any());
  // Without a known id count, ids up to 2^31 - 1.
  EXPECT_EQ(parse(body_with(R"(,"logit_bias":{"2147483647":1})")).sampling.logit_bias[0].first,
            2147483647U);
  const std::string unknown_bound =
      " is not a token id (a decimal integer without sign or "
      "leading zeros, below 2147483648)";
  expect_error(body_with(R"(,"logit_bias":{"2147483648":1})"), "logit_bias",
               std::string(kParse) + "logit_bias key \"2147483648\"" + unknown_bound);
  for (const char* key : {"01", "00", "-1", "+1", " 1", "1 ", "1.0", "", "abc", "1e3",
                          "99999999999", "0x10", "\xD9\xA1"}) {
    expect_error(body_with(std::string(",\"logit_bias\":{\"") + key + "\":1}"), "logit_bias",
                 std::string(kParse) + "logit_bias key \"" + key + "\"" + unknown_bound);
  }
  // With the tokenizer's id count, ids below it.
  ServerLimits limits;
  limits.token_id_count = 1000;
  EXPECT_EQ(parse(body_with(R"(,"logit_bias":{"999":1})"), limits).sampling.logit_bias.size(), 1U);
  const ApiError over = error_of(body_with(R"(,"logit_bias":{"1000":1})"), limits);
  EXPECT_EQ(over.message, std::string(kParse) +
                              "logit_bias key \"1000\" is not a token id (a decimal integer "
                              "without sign or leading zeros, below 1000)");
  EXPECT_EQ(over.param, "logit_bias");
  // Values.
  EXPECT_EQ(parse(body_with(R"(,"logit_bias":{"5":-100.0})")).sampling.logit_bias[0].second,
            -100.0f);
  for (const char* value : {"100.5", "-101", "\"1\"", "null", "true", "[]"}) {
    expect_error(body_with(std::string(",\"logit_bias\":{\"5\":") + value + "}"), "logit_bias",
                 std::string(kParse) + "logit_bias[\"5\"] must be a number in [-100, 100], found " +
                     found(value));
  }
  expect_error(body_with(R"(,"logit_bias":[1])"), "logit_bias",
               std::string(kParse) +
                   "logit_bias must be an object mapping token ids to numbers in [-100, 100], "
                   "found array [1]");
  // At most kMaxLogitBias (1024) entries.
  const auto bias_body = [](int entries) {
    std::string map;
    for (int i = 0; i < entries; ++i) {
      if (i > 0) map += ',';
      map += '"';
      map += std::to_string(i);
      map += "\":1";
    }
    return body_with(",\"logit_bias\":{" + map + "}");
  };
  EXPECT_EQ(parse(bias_body(1024)).sampling.logit_bias.size(), 1024U);
  expect_error(bias_body(1025), "logit_bias",
               std::string(kParse) + "logit_bias has 1025 entries, at most 1024 allowed");
}

TEST(OpenAiRequest, Stop) {
  EXPECT_EQ(parse(body_with(R"(,"stop":"\n\n")")).stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(parse(body_with(R"(,"stop":["a","b","a"])")).stop,
            (std::vector<std::string>{"a", "b", "a"}));
  EXPECT_TRUE(parse(body_with(R"(,"stop":[])")).stop.empty());
  EXPECT_TRUE(parse(body_with(R"(,"stop":null)")).stop.empty());
  std::string sixteen;
  for (int i = 0; i < 16; ++i) sixteen += (i ? ",\"s" : "\"s") + std::to_string(i) + "\"";
  EXPECT_EQ(parse(body_with(",\"stop\":[" + sixteen + "]")).stop.size(), 16U);
  expect_error(body_with(",\"stop\":[" + sixteen + ",\"x\"]"), "stop",
               std::string(kParse) + "stop has 17 strings, at most 16 allowed");
  expect_error(body_with(R"(,"stop":"")"), "stop",
               std::string(kParse) + "stop must be a non-empty string, found string \"\"");
  expect_error(body_with(R"(,"stop":["a",""])"), "stop",
               std::string(kParse) + "stop[1] must be a non-empty string, found string \"\"");
  expect_error(body_with(R"(,"stop":["a",1])"), "stop",
               std::string(kParse) + "stop[1] must be a non-empty string, found number 1");
  expect_error(
      body_with(R"(,"stop":5)"), "stop",
      std::string(kParse) +
          "stop must be a string, an array of at most 16 strings, or null, found number 5");
}

TEST(OpenAiRequest, LogprobsAndTopLogprobs) {
  ChatRequest r = parse(body_with(R"(,"logprobs":true)"));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  for (int k : {0, 1, 20}) {
    r = parse(body_with(",\"logprobs\":true,\"top_logprobs\":" + std::to_string(k)));
    EXPECT_TRUE(r.logprobs);
    EXPECT_EQ(r.top_logprobs, k);
  }
  EXPECT_FALSE(parse(body_with(R"(,"logprobs":false)")).logprobs);
  EXPECT_FALSE(parse(body_with(R"(,"logprobs":null,"top_logprobs":null)")).logprobs);
  for (const char* value : {"21", "-1", "1.5", "5.0", "\"5\"", "true"}) {
    expect_error(
        body_with(std::string(",\"logprobs\":true,\"top_logprobs\":") + value), "top_logprobs",
        std::string(kParse) + "top_logprobs must be an integer in [0, 20], found " + found(value));
  }
  for (const char* extra : {R"(,"top_logprobs":3)", R"(,"logprobs":false,"top_logprobs":0)",
                            R"(,"logprobs":null,"top_logprobs":2)"}) {
    expect_error(body_with(extra), "top_logprobs", "top_logprobs requires logprobs: true");
  }
  for (const char* value : {"1", "\"true\"", "[]"}) {
    expect_error(
        body_with(std::string(",\"logprobs\":") + value), "logprobs",
        std::string(kParse) + "logprobs must be true, false or null, found " + found(value));
  }
}

// ---- features that would change the output ---------------------------------------------

TEST(OpenAiRequest, HarmlessValuesOfUnsupportedFeaturesAreAccepted) {
  for (const char* extra :
       {R"(,"tools":[])",
        R"(,"tool_choice":"none")",
        R"(,"tool_choice":"auto")",
        R"(,"tools":[],"tool_choice":"auto")",
        R"(,"functions":[])",
        R"(,"function_call":"none")",
        R"(,"function_call":"auto")",
        R"(,"response_format":{"type":"text"})",
        R"(,"modalities":["text"])",
        R"(,"modalities":[])",
        R"(,"reasoning_effort":"none")",
        R"(,"reasoning_effort":"minimal")",
        R"(,"chat_template_kwargs":{"enable_thinking":false})",
        R"(,"chat_template_kwargs":{})",
        R"(,"chat_template_kwargs":{"enable_thinking":null})",
        R"(,"best_of":1)",
        R"(,"tools":null,"tool_choice":null,"functions":null)",
        R"(,"function_call":null,"response_format":null,"audio":null,"modalities":null)",
        R"(,"prediction":null,"web_search_options":null,"reasoning_effort":null)",
        R"(,"chat_template_kwargs":null,"best_of":null)"}) {
    SCOPED_TRACE(extra);
    const ChatRequest r = parse(body_with(extra));
    EXPECT_EQ(render_request_prompt(r), render_request_prompt(parse(body_with(""))));
    EXPECT_TRUE(r.ignored_fields.empty());
  }
}

TEST(OpenAiRequest, UnsupportedFeaturesAreRefusedByName) {
  const std::vector<std::tuple<const char*, const char*, const char*>> cases = {
      {R"(,"functions":[{"name":"f"}])", "functions", "\"functions\" is not supported yet"},
      {R"(,"function_call":{"name":"f"})", "function_call",
       "\"function_call\" naming a function is not supported yet"},
      {R"(,"response_format":{"type":"json_object"})", "response_format",
       "\"response_format\" of type \"json_object\" is not supported yet"},
      {R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}})",
       "response_format", "\"response_format\" of type \"json_schema\" is not supported yet"},
      {R"(,"audio":{"voice":"alloy","format":"wav"})", "audio", "\"audio\" is not supported yet"},
      {R"(,"modalities":["text","audio"])", "modalities",
       "\"modalities\" with \"audio\" is not supported yet"},
      {R"(,"prediction":{"type":"content","content":"x"})", "prediction",
       "\"prediction\" is not supported yet"},
      {R"(,"web_search_options":{})", "web_search_options",
       "\"web_search_options\" is not supported yet"},
      {R"(,"best_of":2)", "best_of", "best_of > 1 is not supported"},
  };
  for (const auto& [extra, param, message] : cases) expect_error(body_with(extra), param, message);
}

TEST(OpenAiRequest, WrongTypesOfFeatureFields) {
  const std::vector<std::tuple<const char*, const char*, const char*>> cases = {
      {R"(,"tools":{})", "tools", "tools must be an array, found object {}"},
      {R"(,"tool_choice":"always")", "tool_choice",
       "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
       "\"function\": {\"name\": ...}}, found string \"always\""},
      {R"(,"tool_choice":1)", "tool_choice",
       "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
       "\"function\": {\"name\": ...}}, found number 1"},
      {R"(,"tool_choice":{"type":"function"})", "tool_choice",
       "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
       "\"function\": {\"name\": ...}}, found object {\"type\":\"function\"}"},
      {R"(,"tools":[{"type":"function"}])", "tools[0].function",
       "tools[0].function must be an object {\"name\", \"description\", \"parameters\"}, found "
       "nothing"},
      {R"(,"tools":[{"type":"retrieval","function":{"name":"f"}}])", "tools[0].type",
       "tools[0].type must be \"function\" (the only tool type served), found string "
       "\"retrieval\""},
      {R"(,"tools":[{"type":"function","function":{"name":""}}])", "tools[0].function.name",
       "tools[0].function.name must be a non-empty string, found string \"\""},
      {R"(,"tools":[{"type":"function","function":{"name":"a b"}}])", "tools[0].function.name",
       "tools[0].function.name must not contain whitespace, '<' or '>' (the model writes it "
       "inside <function=...>), found string \"a b\""},
      {R"(,"tools":[{"type":"function","function":{"name":"f"}},)"
       R"({"type":"function","function":{"name":"f"}}])",
       "tools[1].function.name", "tools[1].function.name string \"f\" is declared twice"},
      {R"(,"tools":[{"type":"function","function":{"name":"f","parameters":[]}}])",
       "tools[0].function.parameters",
       "tools[0].function.parameters must be a JSON schema object, found array []"},
      {R"(,"parallel_tool_calls":"no")", "parallel_tool_calls",
       "parallel_tool_calls must be true, false or null, found string \"no\""},
      {R"(,"reasoning_budget":-1)", "reasoning_budget",
       "reasoning_budget must be a non-negative integer, found number -1"},
      {R"(,"chat_template_kwargs":{"preserve_thinking":1})",
       "chat_template_kwargs.preserve_thinking",
       "chat_template_kwargs.preserve_thinking must be true, false or null, found number 1"},
      {R"(,"functions":"f")", "functions", "functions must be an array, found string \"f\""},
      {R"(,"function_call":"required")", "function_call",
       "function_call must be \"none\", \"auto\" or an object, found string \"required\""},
      {R"(,"response_format":{"type":"xml"})", "response_format",
       "response_format must be an object {\"type\": \"text\" | \"json_object\" | "
       "\"json_schema\", ...}, found object {\"type\":\"xml\"}"},
      {R"(,"response_format":"json")", "response_format",
       "response_format must be an object {\"type\": \"text\" | \"json_object\" | "
       "\"json_schema\", ...}, found string \"json\""},
      {R"(,"response_format":{})", "response_format",
       "response_format must be an object {\"type\": \"text\" | \"json_object\" | "
       "\"json_schema\", ...}, found object {}"},
      {R"(,"modalities":["video"])", "modalities",
       "modalities must be an array of \"text\" and \"audio\", found array [\"video\"]"},
      {R"(,"modalities":"text")", "modalities",
       "modalities must be an array of \"text\" and \"audio\", found string \"text\""},
      {R"(,"reasoning_effort":"max")", "reasoning_effort",
       "reasoning_effort must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or "
       "\"xhigh\", found string \"max\""},
      {R"(,"reasoning_effort":1)", "reasoning_effort",
       "reasoning_effort must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or "
       "\"xhigh\", found number 1"},
      {R"(,"chat_template_kwargs":[])", "chat_template_kwargs",
       "chat_template_kwargs must be an object, found array []"},
      {R"(,"chat_template_kwargs":{"enable_thinking":"no"})",
       "chat_template_kwargs.enable_thinking",
       "chat_template_kwargs.enable_thinking must be true, false or null, found string \"no\""},
      {R"(,"best_of":0)", "best_of", "best_of must be a positive integer, found number 0"},
      {R"(,"best_of":1.0)", "best_of", "best_of must be a positive integer, found number 1.0"},
  };
  for (const auto& [extra, param, message] : cases) {
    expect_error(body_with(extra), param, std::string(kParse) + message);
  }
}

// ---- accepted and ignored ------------------------------------------------------------------

TEST(OpenAiRequest, IgnoredFieldsAreListedInByteOrderAndChangeNothing) {
  const ChatRequest r = parse(body_with(
      R"(,"user":"u-1","metadata":{"a":"b"},"store":false,"service_tier":"auto",)"
      R"("parallel_tool_calls":false,"zeta":1,"min_tokens":3,"Temperature":9,"top_a":null,)"
      R"("chat_template_kwargs":{"enable_thinking":false,"clear_thinking":true,"x":null},)"
      R"("stream_options":{"continuous_usage_stats":true})"));
  EXPECT_EQ(
      r.ignored_fields,
      (std::vector<std::string>{"Temperature", "chat_template_kwargs.clear_thinking", "metadata",
                                "min_tokens", "service_tier", "store",
                                "stream_options.continuous_usage_stats", "user", "zeta"}));
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_FALSE(r.sampling.any());
  EXPECT_EQ(render_request_prompt(r), render_request_prompt(parse(body_with(""))));
  // user may be an object (Open WebUI); nulls are absent.
  EXPECT_EQ(parse(body_with(R"(,"user":{"id":"1","name":"x"})")).ignored_fields,
            std::vector<std::string>{"user"});
  EXPECT_TRUE(parse(body_with(R"(,"user":null,"metadata":null,"store":null,"service_tier":null)"))
                  .ignored_fields.empty());
}

TEST(OpenAiRequest, IgnoredFieldsWithTheWrongType) {
  const std::vector<std::tuple<const char*, const char*, const char*>> cases = {
      {R"(,"user":5)", "user", "user must be a string or an object, found number 5"},
      {R"(,"metadata":"x")", "metadata", "metadata must be an object, found string \"x\""},
      {R"(,"store":"yes")", "store", "store must be true, false or null, found string \"yes\""},
      {R"(,"service_tier":1)", "service_tier", "service_tier must be a string, found number 1"},
  };
  for (const auto& [extra, param, message] : cases) {
    expect_error(body_with(extra), param, std::string(kParse) + message);
  }
}

// ---- messages ------------------------------------------------------------------------------

TEST(OpenAiRequest, AcceptedMessageFields) {
  const std::string plain = R"([{"role":"system","content":"s"},{"role":"user","content":"a"},)"
                            R"({"role":"assistant","content":"b"},{"role":"user","content":"c"}])";
  const std::string extras =
      R"([{"role":"system","content":"s","name":"sys"},{"role":"user","content":"a","name":"bob"},)"
      R"({"role":"assistant","content":"b","name":"bot","reasoning_content":"because",)"
      R"("reasoning":"because","refusal":null,"annotations":[],"tool_calls":null,)"
      R"("tool_call_id":null,"function_call":null,"audio":null},)"
      R"({"role":"user","content":"c","tool_calls":[]}])";
  const ChatRequest a = parse(with_messages(plain));
  const ChatRequest b = parse(with_messages(extras));
  EXPECT_EQ(render_request_prompt(b), render_request_prompt(a));
  EXPECT_EQ(b.ignored_fields,
            (std::vector<std::string>{"messages[].annotations", "messages[].name"}));
  EXPECT_EQ(b.messages[2].reasoning_content, "because");
}

TEST(OpenAiRequest, AssistantContentNullOrAbsentRendersEmpty) {
  // The template renders none/undefined content as "" (T36-37).
  const std::string empty = R"([{"role":"user","content":"a"},{"role":"assistant","content":""},)"
                            R"({"role":"user","content":"b"}])";
  const ChatRequest base = parse(with_messages(empty));
  for (const char* assistant : {R"({"role":"assistant","content":null})", R"({"role":"assistant"})",
                                R"({"role":"assistant","content":[]})"}) {
    const ChatRequest r = parse(with_messages(std::string(R"([{"role":"user","content":"a"},)") +
                                              assistant + R"(,{"role":"user","content":"b"}])"));
    EXPECT_EQ(r.messages[1].content, "");
    EXPECT_EQ(render_request_prompt(r), render_request_prompt(base)) << assistant;
  }
  // Other roles need content.
  expect_error(with_messages(R"([{"role":"user","content":null}])"), "messages[0].content",
               std::string(kParse) +
                   "messages[0].content must be a string or an array of content parts, found null");
  expect_error(with_messages(R"([{"role":"user"}])"), "messages[0].content",
               std::string(kParse) + "messages[0]: missing field \"content\"");
  expect_error(with_messages(R"([{"role":"system","content":5},{"role":"user","content":"x"}])"),
               "messages[0].content",
               std::string(kParse) +
                   "messages[0].content must be a string or an array of content parts, found "
                   "number 5");
  expect_error(
      with_messages(R"([{"role":"assistant","content":{}},{"role":"user","content":"x"}])"),
      "messages[0].content",
      std::string(kParse) +
          "messages[0].content must be a string or an array of content parts (or null), "
          "found object {}");
}

TEST(OpenAiRequest, MessageFieldTypes) {
  expect_error(with_messages(R"([{"role":"user","content":"x","name":5}])"), "messages[0].name",
               std::string(kParse) + "messages[0].name must be a string, found number 5");
  expect_error(with_messages(R"([{"role":"assistant","content":"x","reasoning_content":[]},)"
                             R"({"role":"user","content":"y"}])"),
               "messages[0].reasoning_content",
               std::string(kParse) +
                   "messages[0].reasoning_content must be a string or null, found array []");
  expect_error(
      with_messages(R"([{"role":"assistant","content":"x","reasoning":1},)"
                    R"({"role":"user","content":"y"}])"),
      "messages[0].reasoning",
      std::string(kParse) + "messages[0].reasoning must be a string or null, found number 1");
  expect_error(with_messages(R"([{"role":"User","content":"x"}])"), "messages[0].role",
               std::string(kParse) +
                   "messages[0].role must be \"system\", \"developer\", \"user\", \"assistant\" "
                   "or \"tool\", found string \"User\"");
  expect_error(with_messages(R"([{"content":"x"}])"), "messages[0].role",
               std::string(kParse) + "messages[0]: missing field \"role\"");
  expect_error(with_messages(R"(["x"])"), "messages[0]",
               std::string(kParse) +
                   "messages[0] must be an object {\"role\", \"content\"}, found string \"x\"");
  expect_error(
      with_messages("5"), "messages",
      std::string(kParse) +
          "messages must be a JSON array of {\"role\", \"content\"} objects, found number 5");
}

TEST(OpenAiRequest, ToolHistoryIsParsed) {
  const ChatRequest r = parse(with_messages(
      R"([{"role":"developer","content":"be brief"},{"role":"user","content":"x"},)"
      R"({"role":"assistant","content":null,"reasoning":"think","tool_calls":[)"
      R"({"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"b\":1,\"a\":[2,3]}"}},)"
      R"({"id":"call_2","type":"function","function":{"name":"g","arguments":""}}]},)"
      R"({"role":"tool","tool_call_id":"call_1","content":[{"type":"text","text":"r1"}]},)"
      R"({"role":"tool","tool_call_id":"call_2","content":"r2"}])"));
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, ChatRole::system);
  EXPECT_EQ(r.messages[0].content, "be brief");
  const ChatMessage& a = r.messages[2];
  EXPECT_EQ(a.role, ChatRole::assistant);
  EXPECT_EQ(a.content, "");
  EXPECT_EQ(a.reasoning_content, "think");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].id, "call_1");
  EXPECT_EQ(a.tool_calls[0].name, "f");
  EXPECT_EQ(a.tool_calls[0].arguments.dump(), R"({"b":1,"a":[2,3]})") << "the client's key order";
  EXPECT_EQ(a.tool_calls[1].arguments.dump(), "{}") << "empty arguments: no parameters";
  EXPECT_EQ(r.messages[3].role, ChatRole::tool);
  EXPECT_EQ(r.messages[3].tool_call_id, "call_1");
  EXPECT_EQ(r.messages[3].content, "r1");
  EXPECT_EQ(r.messages[4].content, "r2");
  // reasoning_content wins over reasoning when both are given.
  const ChatRequest both = parse(with_messages(
      R"([{"role":"user","content":"x"},{"role":"assistant","content":"y","reasoning":"r",)"
      R"("reasoning_content":"rc"},{"role":"user","content":"z"}])"));
  EXPECT_EQ(both.messages[1].reasoning_content, "rc");
}

TEST(OpenAiRequest, ToolHistoryErrorsNameTheField) {
  const std::string user = R"({"role":"user","content":"x"},)";
  auto call = [](const std::string& arguments) {
    return R"({"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",)"
           R"("function":{"name":"f","arguments":)" + arguments + "}}]}";
  };
  const std::vector<std::tuple<std::string, const char*, const char*>> cases = {
      {"[" + user + call(R"("[1]")") + "]", "messages[1].tool_calls[0].function.arguments",
       "messages[1].tool_calls[0].function.arguments must encode a JSON object, found array [1]"},
      {"[" + user + call("5") + "]", "messages[1].tool_calls[0].function.arguments",
       "messages[1].tool_calls[0].function.arguments must be a string (a JSON object), found "
       "number 5"},
      {"[" + user + R"({"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}])",
       "messages[1].tool_calls[0].function.name",
       "messages[1].tool_calls[0].function.name must be a non-empty string, found nothing"},
      {"[" + user + R"({"role":"assistant","tool_calls":{}}])", "messages[1].tool_calls",
       "messages[1].tool_calls must be an array, found object {}"},
      {"[" + user + R"({"role":"tool","content":"r","tool_call_id":5}])",
       "messages[1].tool_call_id", "messages[1].tool_call_id must be a string, found number 5"},
  };
  for (const auto& [messages, param, message] : cases) {
    expect_error(with_messages(messages), param, std::string(kParse) + message);
  }
  // Not JSON at all: the JSON parser's own words follow.
  const ApiError bad = error_of(with_messages("[" + user + call(R"("{\"a\":")") + "]"));
  EXPECT_EQ(bad.param, "messages[1].tool_calls[0].function.arguments");
  EXPECT_EQ(bad.message.rfind(std::string(kParse) +
                                  "messages[1].tool_calls[0].function.arguments must be a JSON "
                                  "object encoded as a string: ",
                              0),
            0u)
      << bad.message;
  // Step 3 refusals: calls on a user message, the deprecated function role and function_call.
  const std::vector<std::tuple<std::string, const char*, const char*>> refused = {
      {R"([{"role":"user","content":"x","tool_calls":[{"id":"c","type":"function",)"
       R"("function":{"name":"f","arguments":"{}"}}]}])",
       "messages[0].tool_calls", "messages[0].tool_calls: only assistant messages carry tool calls"},
      {R"([{"role":"function","name":"f","content":"1"},{"role":"user","content":"y"}])",
       "messages[0].role",
       "messages[0].role \"function\" (send role \"tool\") is not supported yet"},
      {R"([{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"{}"}},)"
       R"({"role":"user","content":"y"}])",
       "messages[0].function_call", "messages[0].function_call (send tool_calls) is not supported yet"},
  };
  for (const auto& [messages, param, message] : refused) {
    expect_error(with_messages(messages), param, message);
  }
}

TEST(OpenAiRequest, ToolsAndToolChoice) {
  const std::string tools =
      R"(,"tools":[{"type":"function","function":{"name":"get_weather","description":"d",)"
      R"("parameters":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}},)"
      R"({"type":"function","function":{"name":"ping"}}])";
  const ChatRequest r = parse(body_with(tools));
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.tools[0].dump(),
            R"({"type":"function","function":{"name":"get_weather","description":"d",)"
            R"("parameters":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}})")
      << "kept as sent, key order included";
  EXPECT_EQ(r.tool_choice, ToolChoice::automatic) << "auto is the default with tools";
  EXPECT_TRUE(r.parallel_tool_calls);
  EXPECT_EQ(parse(body_with("")).tool_choice, ToolChoice::none);
  EXPECT_EQ(parse(body_with(R"(,"tool_choice":"auto")")).tool_choice, ToolChoice::none)
      << "auto without tools: nothing to call";
  EXPECT_EQ(parse(body_with(tools + R"(,"tool_choice":"none")")).tool_choice, ToolChoice::none);
  EXPECT_EQ(parse(body_with(tools + R"(,"tool_choice":"required")")).tool_choice,
            ToolChoice::required);
  const ChatRequest named =
      parse(body_with(tools + R"(,"tool_choice":{"type":"function","function":{"name":"ping"}})"));
  EXPECT_EQ(named.tool_choice, ToolChoice::named);
  EXPECT_EQ(named.tool_choice_name, "ping");
  EXPECT_FALSE(parse(body_with(tools + R"(,"parallel_tool_calls":false)")).parallel_tool_calls);
  expect_error(body_with(tools + R"(,"tool_choice":{"type":"function","function":{"name":"x"}})"),
               "tool_choice",
               "tool_choice names the function \"x\", which is not among the tools");
  expect_error(body_with(R"(,"tool_choice":"required")"), "tool_choice",
               "tool_choice \"required\" needs tools");
  // Tools reach the prompt (their schema, in the tools system block).
  const std::string prompt = render_request_prompt(r);
  EXPECT_NE(prompt.find(R"({"type": "function", "function": {"name": "get_weather")"),
            std::string::npos)
      << prompt;
}

TEST(OpenAiRequest, ThinkingFields) {
  EXPECT_EQ(parse(body_with("")).thinking, std::nullopt);
  EXPECT_EQ(parse(body_with(R"(,"chat_template_kwargs":{"enable_thinking":true})")).thinking, true);
  EXPECT_EQ(parse(body_with(R"(,"chat_template_kwargs":{"enable_thinking":false})")).thinking,
            false);
  EXPECT_EQ(parse(body_with(R"(,"enable_thinking":true)")).thinking, true);
  for (const char* effort : {"low", "medium", "high", "xhigh"}) {
    EXPECT_EQ(parse(body_with(std::string(R"(,"reasoning_effort":")") + effort + "\"")).thinking,
              true)
        << effort;
  }
  for (const char* effort : {"none", "minimal"}) {
    EXPECT_EQ(parse(body_with(std::string(R"(,"reasoning_effort":")") + effort + "\"")).thinking,
              false)
        << effort;
  }
  EXPECT_EQ(parse(body_with(R"(,"reasoning_effort":"high","chat_template_kwargs":)"
                            R"({"enable_thinking":false})"))
                .thinking,
            false)
      << "enable_thinking wins";
  EXPECT_TRUE(
      parse(body_with(R"(,"chat_template_kwargs":{"preserve_thinking":true})")).preserve_thinking);
  EXPECT_EQ(parse(body_with(R"(,"reasoning_budget":100)")).reasoning_budget, 100);
  EXPECT_EQ(parse(body_with(R"(,"thinking_budget":0)")).reasoning_budget, 0);
  EXPECT_EQ(parse(body_with("")).reasoning_budget, std::nullopt);
  // Thinking on renders the template's open think block; off, the closed one.
  const ChatRequest r = parse(body_with(""));
  EXPECT_TRUE(render_request_prompt(r, true).ends_with("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(render_request_prompt(r, false).ends_with("<think>\n\n</think>\n\n"));
}

// ---- content parts -----------------------------------------------------------------------

TEST(OpenAiRequest, TextPartsRenderAsTheirConcatenation) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // (messages with parts, the same messages with string contents)
      {R"([{"role":"user","content":[{"type":"text","text":"Hello, "},{"type":"text","text":"world"}]}])",
       R"([{"role":"user","content":"Hello, world"}])"},
      {R"([{"role":"system","content":[{"type":"text","text":" be "},{"type":"text","text":"brief\n"}]},)"
       R"({"role":"user","content":[{"type":"text","text":"a"}]},)"
       R"({"role":"assistant","content":[{"type":"text","text":"b1"},{"type":"text","text":"b2"}]},)"
       R"({"role":"user","content":[{"text":"c","type":"text"},{"type":"text","text":""}]}])",
       R"([{"role":"system","content":" be brief\n"},{"role":"user","content":"a"},)"
       R"({"role":"assistant","content":"b1b2"},{"role":"user","content":"c"}])"},
      // Whitespace is trimmed after concatenation, as the template trims render_content's result.
      {R"([{"role":"user","content":[{"type":"text","text":"  "},{"type":"text","text":"x"},)"
       R"({"type":"text","text":" \n"}]}])",
       R"([{"role":"user","content":"  x \n"}])"},
      // A user message of tool-response parts is not a query (T67-77), exactly as a string.
      {R"([{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"user",)"
       R"("content":[{"type":"text","text":"<tool_response>"},{"type":"text","text":"r</tool_response>"}]}])",
       R"([{"role":"user","content":"q"},{"role":"assistant","content":"a"},)"
       R"({"role":"user","content":"<tool_response>r</tool_response>"}])"},
      {R"([{"role":"user","content":[]}])", R"([{"role":"user","content":""}])"},
  };
  for (const auto& [parts, strings] : cases) {
    SCOPED_TRACE(parts);
    const ChatRequest p = parse(with_messages(parts));
    const ChatRequest s = parse(with_messages(strings));
    ASSERT_EQ(p.messages.size(), s.messages.size());
    for (size_t i = 0; i < p.messages.size(); ++i) {
      EXPECT_EQ(p.messages[i].content, s.messages[i].content);
    }
    EXPECT_EQ(render_request_prompt(p), render_request_prompt(s));
  }
  EXPECT_EQ(
      render_request_prompt(parse(with_messages(
          R"([{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"!"}]}])"))),
      std::string("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n") +
          std::string(kEmptyThinkBlock));
  // Extra keys of a text part are ignored (the template reads only "text") and reported.
  const ChatRequest cached = parse(with_messages(
      R"([{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}])"));
  EXPECT_EQ(cached.messages[0].content, "x");
  EXPECT_EQ(cached.ignored_fields, std::vector<std::string>{"messages[].content[].cache_control"});
}

TEST(OpenAiRequest, NonTextPartsAreRefused) {
  const std::string text = R"({"type":"text","text":"look"})";
  const std::vector<std::tuple<std::string, const char*>> cases = {
      {R"({"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}})", "image"},
      {R"({"type":"image","image":"x.png"})", "image"},
      {R"({"type":"input_image","image_url":"x"})", "image"},
      {R"({"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}})", "audio"},
      {R"({"type":"audio","audio":"x"})", "audio"},
      {R"({"type":"video_url","video_url":{"url":"x"}})", "video"},
      {R"({"type":"video","video":"x"})", "video"},
      {R"({"type":"file","file":{"file_id":"f"}})", "file"},
      // A text part that also carries an image or video key is an image/video to the template.
      {R"({"type":"text","text":"x","image_url":{"url":"u"}})", "image"},
      {R"({"type":"text","text":"x","video":"v"})", "video"},
  };
  for (const auto& [part, kind] : cases) {
    expect_error(with_messages("[{\"role\":\"user\",\"content\":[" + text + "," + part + "]}]"),
                 "messages[0].content[1]",
                 std::string("messages[0].content[1]: ") + kind + " inputs are not supported");
  }
  expect_error(
      with_messages(R"([{"role":"user","content":"q"},{"role":"assistant","content":)"
                    R"([{"type":"refusal","refusal":"no"}]},{"role":"user","content":"y"}])"),
      "messages[1].content[0]",
      "messages[1].content[0]: content parts of type \"refusal\" are not supported (the "
      "chat template renders text parts only)");
  // Malformed parts are parse errors.
  const std::vector<std::tuple<std::string, const char*, const char*>> malformed = {
      {R"("hi")", "messages[0].content[0]",
       "messages[0].content[0] must be a content part object {\"type\", ...}, found string \"hi\""},
      {R"({"text":"x"})", "messages[0].content[0].type",
       "messages[0].content[0]: missing field \"type\""},
      {R"({"type":"text"})", "messages[0].content[0].text",
       "messages[0].content[0]: missing field \"text\""},
      {R"({"type":"text","text":5})", "messages[0].content[0].text",
       "messages[0].content[0].text must be a string, found number 5"},
      {R"({"type":"text","text":null})", "messages[0].content[0].text",
       "messages[0].content[0].text must be a string, found null"},
      {R"({"type":"html","text":"x"})", "messages[0].content[0].type",
       "messages[0].content[0].type must be \"text\", \"image_url\", \"input_audio\", \"file\" or "
       "\"refusal\", found string \"html\""},
      {R"({"type":5})", "messages[0].content[0].type",
       "messages[0].content[0].type must be \"text\", \"image_url\", \"input_audio\", \"file\" or "
       "\"refusal\", found number 5"},
  };
  for (const auto& [part, param, message] : malformed) {
    expect_error(with_messages("[{\"role\":\"user\",\"content\":[" + part + "]}]"), param,
                 std::string(kParse) + message);
  }
}

// ---- validation order in openai mode --------------------------------------------------------

TEST(OpenAiValidationOrder, FirstFailureWins) {
  const std::string gpt = R"({"model":"gpt-4o","messages":)";
  // 1f (a field's type or range) before 2 (model), whichever field it is.
  EXPECT_EQ(error_of(gpt + kHi + R"(,"temperature":3})").param, "temperature");
  EXPECT_EQ(error_of(gpt + kHi + R"(,"user":5})").param, "user");
  // Fields in declaration order: model, messages, max_tokens, ..., then feature fields.
  EXPECT_EQ(error_of(R"({"model":5,"messages":5})").param, "model");
  EXPECT_EQ(error_of(kHead + R"(5,"temperature":3})").param, "messages");
  EXPECT_EQ(error_of(body_with(R"(,"temperature":3,"top_p":0,"seed":1.5)")).param, "temperature");
  EXPECT_EQ(error_of(body_with(R"(,"tools":{},"seed":1.5)")).param, "seed");
  // 1f before 1g (missing fields).
  EXPECT_EQ(error_of(R"({"messages":[],"temperature":3})").param, "temperature");
  EXPECT_EQ(error_of(R"({"temperature":1})").message,
            "parsing chat request: missing field \"model\"");
  // Unknown fields never fail: the wrong model is reported.
  EXPECT_EQ(error_of(gpt + kHi + R"(,"foo":1})").param, "model");
  // 2 (model) before 3 (unsupported features), including unsupported roles and parts.
  EXPECT_EQ(error_of(gpt + kHi + R"(,"functions":[{"name":"f"}]})").param, "model");
  EXPECT_EQ(error_of(gpt + R"([{"role":"function","content":"x"}]})").param, "model");
  // A malformed tool is a type error (1f), before the model.
  EXPECT_EQ(error_of(gpt + kHi + R"(,"tools":[{}]})").param, "tools[0].type");
  EXPECT_EQ(
      error_of(gpt + R"([{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})").param,
      "model");
  // A malformed message (1f) before an unsupported top-level feature (3).
  EXPECT_EQ(error_of(with_messages(R"([{"role":"user","content":5}])",
                                   R"(,"functions":[{"name":"f"}])"))
                .param,
            "messages[0].content");
  // A type error anywhere (1f) before an image part (3).
  EXPECT_EQ(error_of(with_messages(R"([{"role":"user","content":[{"type":"image_url"}]}])",
                                   R"(,"temperature":"x")"))
                .param,
            "temperature");
  // Within 3: messages first, then n, best_of, tools, ... in declaration order.
  EXPECT_EQ(error_of(with_messages(R"([{"role":"function","content":"x"}])",
                                   R"(,"n":2,"functions":[{"name":"f"}])"))
                .param,
            "messages[0].role");
  EXPECT_EQ(error_of(body_with(R"(,"functions":[{"name":"f"}],"n":2)")).param, "n");
  EXPECT_EQ(error_of(body_with(R"(,"functions":[{"name":"f"}],"audio":{})")).param, "functions");
  // tool_choice against the tools comes after the other step-3 refusals.
  EXPECT_EQ(error_of(body_with(R"(,"tool_choice":"required","audio":{})")).param, "audio");
  // 3 before 4 (empty messages) and 5 (final role).
  EXPECT_EQ(error_of(with_messages("[]", R"(,"n":2)")).param, "n");
  EXPECT_EQ(error_of(with_messages(R"([{"role":"assistant","content":"x"}])",
                                   R"(,"functions":[{"name":"f"}])"))
                .param,
            "functions");
  // 4 and 5 before 6 (max_tokens alias conflict and zero, then the logprobs rule).
  EXPECT_EQ(error_of(with_messages("[]", R"(,"max_tokens":1,"max_completion_tokens":2)")).message,
            "messages must not be empty");
  EXPECT_EQ(error_of(with_messages(R"([{"role":"assistant","content":"x"}])",
                                   R"(,"max_tokens":0,"top_logprobs":1)"))
                .message.rfind("the final message must have role=user", 0),
            0U);
  EXPECT_EQ(error_of(body_with(R"(,"max_tokens":0,"top_logprobs":1)")).param, "max_tokens");
  EXPECT_EQ(
      error_of(body_with(R"(,"max_tokens":1,"max_completion_tokens":2,"top_logprobs":1)")).param,
      "max_completion_tokens");
  // The stream type (1f) before the model (2), as in strict mode.
  EXPECT_EQ(error_of(gpt + R"([],"stream":"yes"})").param, "stream");
}

}  // namespace
}  // namespace lily

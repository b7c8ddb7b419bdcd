// Tests for the OpenAI-compatible JSON: strict-mode request validation, budget, responses, chunks.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/strict_json.h"
#include "server/openai_types.h"
#include "text/utf8.h"

namespace lily {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// Every request test in this file runs Lily's contract (`--strict`); chat_request_test.cpp
// covers openai mode.
ServerLimits strict_limits() {
  ServerLimits limits;
  limits.mode = ApiMode::strict;
  return limits;
}
const ServerLimits kLimits = strict_limits();

// A valid body with `extra` spliced in after the messages (extra starts with a comma).
std::string body_with(const std::string& extra) {
  return R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"user","content":"hi"}])" + extra +
         "}";
}

// The ApiError parse_chat_request throws for `body`; a test failure if it accepts it.
ApiError error_of(const std::string& body, const ServerLimits& limits = kLimits) {
  try {
    parse_chat_request(body, limits);
  } catch (const ApiError& error) {
    // Every error must serialize to a well-formed envelope.
    const Json parsed = Json::parse(error_response_json(error));
    EXPECT_EQ(parsed["error"]["message"], Json(error.message));
    return error;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "");
}

void expect_400(const std::string& body, const std::optional<std::string>& param,
                const std::string& message_part) {
  SCOPED_TRACE(body);
  const ApiError error = error_of(body);
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_EQ(error.param, param);
  EXPECT_NE(error.message.find(message_part), std::string::npos) << error.message;
}

// A step-1 (parse) failure: message starts with Lily's prefix.
void expect_parse_error(const std::string& body, const std::optional<std::string>& param,
                        const std::string& message_part = "") {
  SCOPED_TRACE(body);
  expect_400(body, param, message_part);
  EXPECT_EQ(error_of(body).message.rfind("parsing chat request: ", 0), 0U);
}

// ---- accepted bodies ----

TEST(ParseChatRequest, MinimalBodyGetsDefaults) {
  const ChatRequest r = parse_chat_request(body_with(""), kLimits);
  EXPECT_EQ(r.model, "Qwen3.6-35B-A3B");
  ASSERT_EQ(r.messages.size(), 1U);
  EXPECT_EQ(r.messages[0].role, ChatRole::user);
  EXPECT_EQ(r.messages[0].content, "hi");
  EXPECT_EQ(r.max_tokens, 128U);
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.prompt_cache_key.has_value());
}

TEST(ParseChatRequest, EveryAcceptedField) {
  const ChatRequest r = parse_chat_request(
      R"({"prompt_cache_key":"conv-1","stream":false,"max_tokens":7,)"
      R"("messages":[{"content":"be brief","role":"system"},{"role":"user","content":"a"},)"
      R"({"role":"assistant","content":"b"},{"role":"user","content":"c\u00e9"}],)"
      R"("model":"Qwen3.6-35B-A3B"})",
      kLimits);
  ASSERT_EQ(r.messages.size(), 4U);
  EXPECT_EQ(r.messages[0].role, ChatRole::system);
  EXPECT_EQ(r.messages[1].role, ChatRole::user);
  EXPECT_EQ(r.messages[2].role, ChatRole::assistant);
  EXPECT_EQ(r.messages[3].content, "c\xC3\xA9");
  EXPECT_EQ(r.max_tokens, 7U);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.prompt_cache_key, "conv-1");
}

TEST(ParseChatRequest, NullPromptCacheKeyIsNone) {
  EXPECT_FALSE(parse_chat_request(body_with(R"(,"prompt_cache_key":null)"), kLimits)
                   .prompt_cache_key.has_value());
  EXPECT_EQ(parse_chat_request(body_with(R"(,"prompt_cache_key":"")"), kLimits).prompt_cache_key,
            "");
}

TEST(ParseChatRequest, LargeIntegersParseAndAreLeftToTheBudget) {
  EXPECT_EQ(parse_chat_request(body_with(R"(,"max_tokens":18446744073709551615)"), kLimits)
                .max_tokens,
            kU64Max);
  EXPECT_EQ(parse_chat_request(body_with(R"(,"max_tokens":1)"), kLimits).max_tokens, 1U);
}

TEST(ParseChatRequest, LimitsAreConfigurable) {
  ServerLimits limits = strict_limits();
  limits.model_id = "tiny";
  limits.default_max_tokens = 9;
  const ChatRequest r =
      parse_chat_request(R"({"model":"tiny","messages":[{"role":"user","content":""}]})", limits);
  EXPECT_EQ(r.max_tokens, 9U);
  EXPECT_EQ(error_of(body_with(""), limits).param, "model");
}

TEST(ParseChatRequest, WhitespaceAndEscapesAreFine) {
  const ChatRequest r = parse_chat_request(
      " \n{ \"model\" : \"Qwen3.6-35B-A3B\",\t\"messages\" : [ { \"role\" : \"user\" , "
      "\"content\" : \"line\\nnext \\ud83d\\ude00\" } ] }\r\n",
      kLimits);
  EXPECT_EQ(r.messages[0].content, "line\nnext \xF0\x9F\x98\x80");
}

// ---- step 1: body and JSON ----

TEST(ParseChatRequest, RejectsMalformedJson) {
  expect_parse_error("", std::nullopt, "not valid JSON");
  expect_parse_error("{", std::nullopt, "not valid JSON");
  expect_parse_error(body_with("") + "x", std::nullopt, "not valid JSON");
  expect_parse_error(body_with(",") , std::nullopt, "not valid JSON");
  expect_parse_error("{'model':1}", std::nullopt, "not valid JSON");
  expect_parse_error(body_with(R"(,"max_tokens":1e400)"), std::nullopt, "not valid JSON");
  expect_parse_error(std::string("{\"model\":\"a\0b\"}", 15), std::nullopt, "NUL byte");
}

TEST(ParseChatRequest, RejectsNonObjectBodies) {
  for (const char* body : {"[]", "null", "\"hi\"", "42", "true"}) {
    expect_parse_error(body, std::nullopt, "must be a JSON object");
  }
}

TEST(ParseChatRequest, RejectsDuplicateKeys) {
  expect_parse_error(
      R"({"model":"Qwen3.6-35B-A3B","model":"Qwen3.6-35B-A3B","messages":[{"role":"user","content":"x"}]})",
      std::nullopt, "duplicate key \"model\"");
  expect_parse_error(
      R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"user","role":"user","content":"x"}]})",
      std::nullopt, "duplicate key \"role\"");
}

TEST(ParseChatRequest, RejectsDeepNestingWithoutRecursing) {
  const std::string deep(100000, '[');
  expect_parse_error(body_with(",\"max_tokens\":" + deep), std::nullopt, "nesting deeper");
  // Within the cap, a nested value is refused for its type, not its depth.
  expect_parse_error(body_with(R"(,"max_tokens":[[[1]]])"), "max_tokens", "non-negative integer");
}

TEST(ParseChatRequest, RejectsInvalidUtf8) {
  expect_parse_error(body_with(",\"prompt_cache_key\":\"\xFF\""), std::nullopt,
                     "not valid UTF-8 (first bad byte at offset");
  expect_parse_error(body_with(",\"prompt_cache_key\":\"\xC0\xAF\""), std::nullopt,
                     "not valid UTF-8");  // overlong
  expect_parse_error(body_with(",\"prompt_cache_key\":\"\xED\xA0\x80\""), std::nullopt,
                     "not valid UTF-8");  // surrogate
  expect_parse_error(body_with("") + "\xE2\x82", std::nullopt, "not valid UTF-8");  // cut off
  expect_parse_error("\xEF\xBB\xBF" + body_with(""), std::nullopt, "byte order mark");
}

TEST(ParseChatRequest, OversizedBodyIs413) {
  ServerLimits limits = strict_limits();
  limits.max_body_bytes = 64;
  const std::string body = body_with(R"(,"prompt_cache_key":"0123456789012345678901234567"})");
  ASSERT_GT(body.size(), 64U);
  const ApiError error = error_of(body, limits);
  EXPECT_EQ(error.status, 413);
  EXPECT_EQ(error.message, "request body exceeds 64 bytes");
  // Exactly at the limit is accepted.
  const std::string fits = body_with("");
  limits.max_body_bytes = fits.size();
  EXPECT_NO_THROW(parse_chat_request(fits, limits));
  EXPECT_EQ(ServerLimits{}.max_body_bytes, 1048576U);
}

// ---- step 1: fields ----

TEST(ParseChatRequest, RejectsEveryUnknownTopLevelField) {
  for (const char* field :
       {"temperature", "top_p", "n", "stop", "tools", "tool_choice", "response_format", "seed",
        "logprobs", "max_completion_tokens", "stream_options", "user", "chat_template_kwargs",
        "frequency_penalty", "Model", ""}) {
    expect_parse_error(body_with(std::string(",\"") + field + "\":1"), field,
                       std::string("unknown field \"") + field + "\", expected one of \"model\"");
  }
  // Even with a value Lily would otherwise like, and even null.
  expect_parse_error(body_with(R"(,"max_completion_tokens":16)"), "max_completion_tokens",
                     "unknown field");
  expect_parse_error(body_with(R"(,"temperature":null)"), "temperature", "unknown field");
}

TEST(ParseChatRequest, RejectsBadMessages) {
  const std::string head = R"({"model":"Qwen3.6-35B-A3B","messages":)";
  for (const std::string& messages : std::vector<std::string>{
           R"([{"role":"user","content":"x","name":"bob"}])",
           R"([{"role":"assistant","content":"x","tool_calls":[]},{"role":"user","content":"y"}])",
           R"([{"role":"assistant","content":"x","reasoning_content":""},{"role":"user","content":"y"}])",
           R"([{"role":"tool","content":"x"}])", R"([{"role":"developer","content":"x"}])",
           R"([{"role":"User","content":"x"}])", R"([{"role":null,"content":"x"}])",
           R"([{"role":"user","content":[{"type":"text","text":"x"}]}])",
           R"([{"role":"user","content":null}])", R"([{"role":"user","content":5}])",
           R"([{"role":"user"}])", R"([{"content":"x"}])", R"(["hi"])", R"({})", R"("hi")",
           R"(null)"}) {
    expect_parse_error(head + messages + "}", "messages", "messages");
  }
}

TEST(ParseChatRequest, RejectsBadModelField) {
  expect_parse_error(R"({"model":5,"messages":[{"role":"user","content":"x"}]})", "model",
                     "model must be a string, found number 5");
  expect_parse_error(R"({"model":null,"messages":[{"role":"user","content":"x"}]})", "model",
                     "model must be a string");
  expect_parse_error(R"({"messages":[{"role":"user","content":"x"}]})", "model",
                     "missing field \"model\"");
  expect_parse_error(R"({"model":"Qwen3.6-35B-A3B"})", "messages", "missing field \"messages\"");
  expect_parse_error("{}", "model", "missing field \"model\"");
}

TEST(ParseChatRequest, RejectsBadMaxTokens) {
  for (const char* value : {"-1", "-9223372036854775808", "1.5", "128.0", "1e3", "0.0",
                            "18446744073709551616", "1e30", "\"10\"", "null", "true", "[]", "{}"}) {
    expect_parse_error(body_with(std::string(",\"max_tokens\":") + value), "max_tokens",
                       "max_tokens must be a non-negative integer");
  }
}

TEST(ParseChatRequest, RejectsBadStreamAndCacheKey) {
  for (const char* value : {"\"true\"", "1", "null", "[]"}) {
    expect_parse_error(body_with(std::string(",\"stream\":") + value), "stream",
                       "stream must be true or false");
  }
  for (const char* value : {"5", "true", "[\"a\"]", "{}"}) {
    expect_parse_error(body_with(std::string(",\"prompt_cache_key\":") + value),
                       "prompt_cache_key", "prompt_cache_key must be a string or null");
  }
}

// ---- steps 2-6 ----

TEST(ParseChatRequest, WrongModel) {
  for (const char* model : {"gpt-4o", "qwen3.6-35b-a3b", "", "Qwen3.6-35B-A3B "}) {
    const ApiError error = error_of(std::string(R"({"model":")") + model +
                                    R"(","messages":[{"role":"user","content":"x"}]})");
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.param, "model");
    EXPECT_EQ(error.code, "model_not_found");
    EXPECT_EQ(error.message, std::string("unknown model \"") + model +
                                 "\"; this server exposes only Qwen3.6-35B-A3B");
  }
}

TEST(ParseChatRequest, StreamingRejected) {
  const ApiError error = error_of(body_with(R"(,"stream":true)"));
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.message, "streaming is not supported");
  EXPECT_EQ(error.param, "stream");
  EXPECT_FALSE(error.code.has_value());
}

TEST(ParseChatRequest, EmptyMessagesAndFinalRole) {
  expect_400(R"({"model":"Qwen3.6-35B-A3B","messages":[]})", "messages",
             "messages must not be empty");
  expect_400(
      R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]})",
      "messages", "the final message must have role=user");
  expect_400(R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"system","content":"x"}]})",
             "messages", "the final message must have role=user");
}

TEST(ParseChatRequest, ZeroMaxTokens) {
  for (const char* zero : {"0", "-0"}) {
    const ApiError error = error_of(body_with(std::string(",\"max_tokens\":") + zero));
    EXPECT_EQ(error.message, "max_tokens must be greater than zero");
    EXPECT_EQ(error.param, "max_tokens");
  }
}

// ---- validation order: with two problems, the one Lily checks first is reported ----

TEST(ValidationOrder, FirstFailureWins) {
  const std::string wrong_model_head = R"({"model":"gpt-4o","messages":)";
  // 1 (unknown field) before 2 (model).
  EXPECT_EQ(error_of(wrong_model_head + R"([{"role":"user","content":"x"}],"seed":1})").param,
            "seed");
  // 1 (bad role / bad max_tokens / bad stream type) before 2.
  EXPECT_EQ(error_of(wrong_model_head + R"([{"role":"tool","content":"x"}]})").param,
            "messages");
  EXPECT_EQ(error_of(wrong_model_head + R"([{"role":"user","content":"x"}],"max_tokens":-5})")
                .param,
            "max_tokens");
  EXPECT_EQ(error_of(wrong_model_head + R"([],"stream":"yes"})").param, "stream");
  // 1 (missing messages) before 2 and 3.
  EXPECT_EQ(error_of(R"({"model":"gpt-4o","stream":true})").message,
            "parsing chat request: missing field \"messages\"");
  // Type errors before missing fields.
  EXPECT_EQ(error_of(R"({"messages":5})").param, "messages");
  // 2 (model) before 3 (stream) before 4 (empty) before 6 (max_tokens 0).
  EXPECT_EQ(error_of(wrong_model_head + R"([],"stream":true,"max_tokens":0})").param, "model");
  EXPECT_EQ(error_of(R"({"model":"Qwen3.6-35B-A3B","messages":[],"stream":true,"max_tokens":0})")
                .param,
            "stream");
  EXPECT_EQ(error_of(R"({"model":"Qwen3.6-35B-A3B","messages":[],"max_tokens":0})").message,
            "messages must not be empty");
  // 5 (final role) before 6.
  EXPECT_EQ(
      error_of(
          R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"assistant","content":"x"}],"max_tokens":0})")
          .message.rfind("the final message must have role=user", 0),
      0U);
  // Size (413) before everything; UTF-8 before JSON syntax.
  ServerLimits small = strict_limits();
  small.max_body_bytes = 3;
  EXPECT_EQ(error_of("{{{{", small).status, 413);
  EXPECT_NE(error_of("{\xFF").message.find("UTF-8"), std::string::npos);
}

// ---- step 7: rendering ----

TEST(RenderRequestPrompt, RendersAndMapsTemplateErrors) {
  const ChatRequest ok = parse_chat_request(body_with(""), kLimits);
  const std::string prompt = render_request_prompt(ok);
  EXPECT_EQ(prompt, std::string("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") +
                        std::string(kEmptyThinkBlock));
  const ChatRequest late_system = parse_chat_request(
      R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"user","content":"a"},{"role":"system","content":"s"},{"role":"user","content":"b"}]})",
      kLimits);
  try {
    render_request_prompt(late_system);
    ADD_FAILURE() << "rendered";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, "messages");
    EXPECT_EQ(error.message.rfind("rendering chat template: ", 0), 0U) << error.message;
    EXPECT_NE(error.message.find("System message must be at the beginning."), std::string::npos);
  }
}

// ---- steps 8-9: budget ----

ApiError budget_error(uint64_t prompt, uint64_t max_tokens, uint64_t max_seq) {
  try {
    checked_max_tokens(prompt, max_tokens, max_seq);
  } catch (const ApiError& error) {
    return error;
  }
  ADD_FAILURE() << prompt << " + " << max_tokens << " fits in " << max_seq;
  return ApiError(0, "", "");
}

TEST(Budget, ExactlyFitsAndOneOver) {
  EXPECT_EQ(checked_max_tokens(10, 5, 16), 5U);  // 10 + 5 + 1 == 16
  const ApiError over = budget_error(10, 5, 15);
  EXPECT_EQ(over.status, 400);
  EXPECT_EQ(over.message, "request needs 16 tokens but server max_seq is 15");
  EXPECT_EQ(over.param, "messages");
  EXPECT_EQ(over.code, "context_length_exceeded");
  EXPECT_EQ(checked_max_tokens(1, 1, 3), 1U);
  EXPECT_EQ(budget_error(1, 1, 2).message, "request needs 3 tokens but server max_seq is 2");
  EXPECT_EQ(checked_max_tokens(3968, 128, 4097), 128U);
  EXPECT_EQ(budget_error(3968, 128, 4096).message,
            "request needs 4097 tokens but server max_seq is 4096");
}

TEST(Budget, EmptyPrompt) {
  const ApiError error = budget_error(0, 5, 4096);
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.message, "chat template produced an empty prompt");
}

TEST(Budget, OverflowIsCheckedNotWrapped) {
  EXPECT_EQ(budget_error(1, kU64Max - 1, kU64Max).message, "request token count overflow");
  EXPECT_EQ(budget_error(1, kU64Max, kU64Max).message, "request token count overflow");
  EXPECT_EQ(budget_error(kU64Max, 1, kU64Max).message, "request token count overflow");
  EXPECT_EQ(budget_error(1, kU64Max - 1, kU64Max).param, "max_tokens");
  // One below the overflow edge: the sum is exactly 2^64 - 1, which fits in 64 bits.
  EXPECT_EQ(checked_max_tokens(1, kU64Max - 2, kU64Max), kU64Max - 2);
  EXPECT_EQ(budget_error(1, kU64Max - 2, 262144).message,
            "request needs 18446744073709551615 tokens but server max_seq is 262144");
}

TEST(Budget, ClampMaxSeq) {
  EXPECT_EQ(clamp_max_seq(4096, 262144), 4096U);
  EXPECT_EQ(clamp_max_seq(1000000, 262144), 262144U);
  EXPECT_EQ(clamp_max_seq(4096, 0), 4096U);
  EXPECT_EQ(clamp_max_seq(2, 0), 2U);
  EXPECT_THROW(clamp_max_seq(1, 0), InputError);
  EXPECT_THROW(clamp_max_seq(0, 262144), InputError);
  EXPECT_THROW(clamp_max_seq(4096, 1), InputError);
}

// ---- ids ----

TEST(CompletionId, FormatAndCounter) {
  EXPECT_EQ(completion_id(1700000000, 1), "chatcmpl-1700000000-1");
  CompletionIdGenerator ids;
  EXPECT_EQ(ids.next(5), "chatcmpl-5-1");
  EXPECT_EQ(ids.next(5), "chatcmpl-5-2");
  EXPECT_EQ(ids.next(6), "chatcmpl-6-3");
  CompletionIdGenerator seeded(42);
  EXPECT_EQ(seeded.next(0), "chatcmpl-0-42");
}

// ---- responses ----

TEST(CompletionResponse, ShapeFieldByField) {
  CompletionResult result;
  result.mode = ApiMode::strict;
  result.id = "chatcmpl-1700000000-3";
  result.created = 1700000000;
  result.content = "Black and white. \xC3\xA9";
  result.finish_reason = FinishReason::stop;
  result.prompt_tokens = 27;
  result.completion_tokens = 160;
  result.cached_tokens = 5;
  const std::string text = completion_response_json(result);
  const OrderedJson j = OrderedJson::parse(text);
  std::vector<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"id", "object", "created", "model", "choices",
                                            "usage"}));
  EXPECT_EQ(j["id"], "chatcmpl-1700000000-3");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "Qwen3.6-35B-A3B");
  ASSERT_EQ(j["choices"].size(), 1U);
  const OrderedJson& choice = j["choices"][0];
  EXPECT_EQ(choice.size(), 3U);
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"].size(), 2U);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Black and white. \xC3\xA9");
  EXPECT_EQ(choice["finish_reason"], "stop");
  const OrderedJson& usage = j["usage"];
  EXPECT_EQ(usage.size(), 4U);
  EXPECT_EQ(usage["prompt_tokens"], 27);
  EXPECT_EQ(usage["completion_tokens"], 160);
  EXPECT_EQ(usage["total_tokens"], 187);
  EXPECT_EQ(usage["prompt_tokens_details"], OrderedJson::parse(R"({"cached_tokens":5})"));
  EXPECT_EQ(text.find("logprobs"), std::string::npos);
  EXPECT_EQ(text.find("system_fingerprint"), std::string::npos);
  EXPECT_NE(text.find("\xC3\xA9"), std::string::npos);  // UTF-8 written raw, not \u-escaped
  EXPECT_EQ(text.find('\n'), std::string::npos);        // compact
}

TEST(CompletionResponse, StrictModeIsLilysExactBytes) {
  CompletionResult result;
  result.mode = ApiMode::strict;
  result.id = "chatcmpl-1700000000-3";
  result.created = 1700000000;
  result.content = "hi";
  result.prompt_tokens = 27;
  result.completion_tokens = 160;
  result.cached_tokens = 5;
  result.logprobs = std::vector<TokenLogprob>{{"hi", -0.5f, {}}};  // strict: never written
  EXPECT_EQ(completion_response_json(result),
            R"({"id":"chatcmpl-1700000000-3","object":"chat.completion","created":1700000000,)"
            R"("model":"Qwen3.6-35B-A3B","choices":[{"index":0,"message":{"role":"assistant",)"
            R"("content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":27,)"
            R"("completion_tokens":160,"total_tokens":187,"prompt_tokens_details":)"
            R"({"cached_tokens":5}}})");
}

TEST(CompletionResponse, LengthFinishReason) {
  CompletionResult result;
  result.mode = ApiMode::strict;
  result.finish_reason = FinishReason::length;
  const Json j = Json::parse(completion_response_json(result));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "");
  EXPECT_EQ(j["usage"]["total_tokens"], 0);
}

TEST(CompletionResponse, InvalidUtf8ContentIsReplaced) {
  CompletionResult result;
  result.mode = ApiMode::strict;
  result.content = std::string("ok \xE2\x82") + " then \xFF and \xF0\x9F\x98";  // cut-off chars
  const std::string text = completion_response_json(result);
  const Json j = parse_strict_json(text, "response", 8);  // strict: valid UTF-8 JSON
  const std::string content = j["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_EQ(content.rfind("ok ", 0), 0U);
  EXPECT_NE(content.find("\xEF\xBF\xBD"), std::string::npos);
  EXPECT_NE(content.find(" then "), std::string::npos);
  EXPECT_NE(content.find(" and "), std::string::npos);
}

// ---- openai mode: chat.completion and chat.completion.chunk (hand-written from OpenAI's
// documented shapes: choice = index, message, logprobs, finish_reason; chunk = id, object,
// created, model, choices, usage) ----

TEST(OpenAiCompletionResponse, NullLogprobsInTheChoice) {
  CompletionResult result{.id = "chatcmpl-1-1",
                          .created = 1,
                          .content = "Hi",
                          .reasoning_content = std::nullopt,
                          .tool_calls = {},
                          .reasoning_tokens = std::nullopt,
                          .finish_reason = FinishReason::length,
                          .prompt_tokens = 3,
                          .completion_tokens = 2,
                          .cached_tokens = 0,
                          .mode = ApiMode::openai,
                          .logprobs = std::nullopt};
  EXPECT_EQ(CompletionResult{}.mode, ApiMode::openai);  // the default
  EXPECT_EQ(completion_response_json(result),
            R"({"id":"chatcmpl-1-1","object":"chat.completion","created":1,)"
            R"("model":"Qwen3.6-35B-A3B","choices":[{"index":0,"message":{"role":"assistant",)"
            R"("content":"Hi"},"logprobs":null,"finish_reason":"length"}],"usage":)"
            R"({"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,)"
            R"("prompt_tokens_details":{"cached_tokens":0}}})");
}

TEST(OpenAiCompletionResponse, Logprobs) {
  CompletionResult result;
  result.id = "chatcmpl-1-2";
  result.created = 1;
  result.content = "Hi";
  result.prompt_tokens = 3;
  result.completion_tokens = 1;
  result.cached_tokens = 2;
  result.logprobs = std::vector<TokenLogprob>{
      {"Hi", -0.5f, {{"Hi", -0.5f}, {"Hello", -1.25f}}}};
  EXPECT_EQ(completion_response_json(result),
            R"({"id":"chatcmpl-1-2","object":"chat.completion","created":1,)"
            R"("model":"Qwen3.6-35B-A3B","choices":[{"index":0,"message":{"role":"assistant",)"
            R"("content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.5,)"
            R"("bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.5,"bytes":[72,105]},)"
            R"({"token":"Hello","logprob":-1.25,"bytes":[72,101,108,108,111]}]}],)"
            R"("refusal":null},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,)"
            R"("completion_tokens":1,"total_tokens":4,"prompt_tokens_details":)"
            R"({"cached_tokens":2}}})");
  // Set but empty (no tokens): an empty content list, not null.
  result.logprobs = std::vector<TokenLogprob>{};
  const OrderedJson j = OrderedJson::parse(completion_response_json(result));
  EXPECT_EQ(j["choices"][0]["logprobs"], OrderedJson::parse(R"({"content":[],"refusal":null})"));
}

TEST(OpenAiCompletionResponse, LogprobTokensCutInsideACharacterAndOddValues) {
  CompletionResult result;
  // "é" split over two tokens; a 3-byte "€" whole; -0.1f written as its shortest decimal;
  // -inf as -9999.0.
  result.logprobs = std::vector<TokenLogprob>{
      {"\xC3", -0.1f, {{"\xC3", -0.1f}, {"\xE2\x82\xAC", -std::numeric_limits<float>::infinity()}}},
      {"\xA9", 0.0f, {}}};
  const std::string text = completion_response_json(result);
  const std::string fffd = "\xEF\xBF\xBD";
  const std::string expected =
      R"({"content":[{"token":")" + fffd + R"(","logprob":-0.1,"bytes":[195],)"
      R"("top_logprobs":[{"token":")" + fffd + R"(","logprob":-0.1,"bytes":[195]},)"
      R"({"token":")" "\xE2\x82\xAC" R"(","logprob":-9999.0,"bytes":[226,130,172]}]},)"
      R"({"token":")" + fffd + R"(","logprob":0.0,"bytes":[169],"top_logprobs":[]}],)"
      R"("refusal":null})";
  EXPECT_NE(text.find(expected), std::string::npos) << text;
  EXPECT_NO_THROW(parse_strict_json(text, "response", 16));
}

ChunkContext chunk_context(bool include_usage) {
  ChunkContext context;
  context.id = "chatcmpl-7-1";
  context.created = 7;
  context.include_usage = include_usage;
  return context;
}

constexpr const char* kChunkHead =
    R"({"id":"chatcmpl-7-1","object":"chat.completion.chunk","created":7,)"
    R"("model":"Qwen3.6-35B-A3B",)";

TEST(StreamChunks, RoleChunk) {
  EXPECT_EQ(chunk_role_json(chunk_context(false)),
            std::string(kChunkHead) +
                R"("choices":[{"index":0,"delta":{"role":"assistant","content":""},)"
                R"("logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(chunk_role_json(chunk_context(true)),
            std::string(kChunkHead) +
                R"("choices":[{"index":0,"delta":{"role":"assistant","content":""},)"
                R"("logprobs":null,"finish_reason":null}],"usage":null})");
}

TEST(StreamChunks, ContentChunk) {
  EXPECT_EQ(chunk_content_json(chunk_context(false), "Hel\"lo\n", nullptr),
            std::string(kChunkHead) +
                R"("choices":[{"index":0,"delta":{"content":"Hel\"lo\n"},"logprobs":null,)"
                R"("finish_reason":null}]})");
  const std::vector<TokenLogprob> logprobs = {{"Hel", -0.25f, {{"Hel", -0.25f}}}};
  EXPECT_EQ(chunk_content_json(chunk_context(true), "Hel", &logprobs),
            std::string(kChunkHead) +
                R"("choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":{"content":)"
                R"([{"token":"Hel","logprob":-0.25,"bytes":[72,101,108],"top_logprobs":)"
                R"([{"token":"Hel","logprob":-0.25,"bytes":[72,101,108]}]}],"refusal":null},)"
                R"("finish_reason":null}],"usage":null})");
  // Invalid UTF-8 in the text becomes U+FFFD; valid non-ASCII stays raw.
  const std::string text = chunk_content_json(chunk_context(false), "\xC3\xA9 \xE2\x82", nullptr);
  EXPECT_NE(text.find("\"delta\":{\"content\":\"\xC3\xA9 \xEF\xBF\xBD\"}"), std::string::npos)
      << text;
  EXPECT_NO_THROW(parse_strict_json(text, "chunk", 8));
}

TEST(StreamChunks, FinishAndUsageChunks) {
  EXPECT_EQ(chunk_finish_json(chunk_context(false), FinishReason::stop),
            std::string(kChunkHead) +
                R"("choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]})");
  EXPECT_EQ(chunk_finish_json(chunk_context(true), FinishReason::length),
            std::string(kChunkHead) +
                R"("choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}],)"
                R"("usage":null})");
  EXPECT_EQ(chunk_usage_json(chunk_context(true), 27, 160, 5),
            std::string(kChunkHead) +
                R"("choices":[],"usage":{"prompt_tokens":27,"completion_tokens":160,)"
                R"("total_tokens":187,"prompt_tokens_details":{"cached_tokens":5}}})");
  // The usage object is the non-streamed response's.
  CompletionResult result;
  result.prompt_tokens = 27;
  result.completion_tokens = 160;
  result.cached_tokens = 5;
  EXPECT_EQ(OrderedJson::parse(completion_response_json(result))["usage"],
            OrderedJson::parse(chunk_usage_json(chunk_context(true), 27, 160, 5))["usage"]);
}

TEST(StreamChunks, EveryChunkParsesWithTheSameIdCreatedAndModel) {
  ChunkContext context = chunk_context(true);
  context.model = "tiny";
  for (const std::string& text :
       {chunk_role_json(context), chunk_content_json(context, "x", nullptr),
        chunk_finish_json(context, FinishReason::stop), chunk_usage_json(context, 1, 2, 0)}) {
    const OrderedJson j = OrderedJson::parse(text);
    std::vector<std::string> keys;
    for (const auto& [key, value] : j.items()) keys.push_back(key);
    EXPECT_EQ(keys, (std::vector<std::string>{"id", "object", "created", "model", "choices",
                                              "usage"}));
    EXPECT_EQ(j["id"], "chatcmpl-7-1");
    EXPECT_EQ(j["created"], 7);
    EXPECT_EQ(j["model"], "tiny");
  }
}

TEST(StreamChunks, SseFraming) {
  EXPECT_EQ(sse_frame(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_error_frame(internal_error()),
            R"(data: {"error":{"message":"internal server error","type":"server_error",)"
            R"("param":null,"code":null}})"
            "\n\n");
}

TEST(ModelsResponse, ExactLilyShape) {
  EXPECT_EQ(models_response_json("Qwen3.6-35B-A3B", 0),
            R"({"object":"list","data":[{"id":"Qwen3.6-35B-A3B","object":"model","created":0,)"
            R"("owned_by":"lily"}]})");
  const Json j = Json::parse(models_response_json("x", 1700000000));
  EXPECT_EQ(j["data"][0]["created"], 1700000000);
  EXPECT_EQ(j["data"][0]["id"], "x");
}

TEST(ErrorResponse, EnvelopeWithNullsAndValues) {
  EXPECT_EQ(error_response_json(ApiError(400, "streaming is not supported",
                                         "invalid_request_error")),
            R"({"error":{"message":"streaming is not supported","type":"invalid_request_error",)"
            R"("param":null,"code":null}})");
  const Json j = Json::parse(error_response_json(
      ApiError(400, "m", "invalid_request_error", "model", "model_not_found")));
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  EXPECT_EQ(j["error"].size(), 4U);
}

TEST(ErrorResponse, InvalidUtf8MessageIsReplaced) {
  const std::string text =
      error_response_json(ApiError(400, "bad \xC3", "invalid_request_error", "\xFF"));
  const Json j = parse_strict_json(text, "error", 8);
  EXPECT_EQ(j["error"]["message"], "bad \xEF\xBF\xBD");
  EXPECT_EQ(j["error"]["param"], "\xEF\xBF\xBD");
}

TEST(ErrorResponse, UnknownFieldNamesWithMultibyteCharsStayValid) {
  // describe_json cuts long values; the envelope must stay valid UTF-8 whatever is cut.
  const std::string key(70, 'k');
  std::string value(31, 'a');
  for (int i = 0; i < 20; ++i) value += "\xC3\xA9";  // the 57-byte cut lands inside an é
  const ApiError error = error_of(body_with(",\"max_tokens\":\"" + value + "\""));
  EXPECT_EQ(error.param, "max_tokens");
  EXPECT_EQ(utf8::find_invalid(error.message), std::string::npos) << error.message;
  EXPECT_NE(error.message.find("\xEF\xBF\xBD..."), std::string::npos) << error.message;
  EXPECT_NO_THROW(parse_strict_json(error_response_json(error), "error", 8));
  const ApiError unknown = error_of(body_with(",\"" + key + "\":1"));
  EXPECT_EQ(unknown.param, key);
}

TEST(TransportErrors, StatusesAndTypes) {
  EXPECT_EQ(not_found_error().status, 404);
  EXPECT_EQ(not_found_error().message, "not found");
  EXPECT_EQ(method_not_allowed_error().status, 405);
  EXPECT_EQ(body_too_large_error(1048576).status, 413);
  EXPECT_EQ(body_too_large_error(1048576).message, "request body exceeds 1048576 bytes");
  EXPECT_EQ(unsupported_media_type_error().status, 415);
  EXPECT_EQ(unauthorized_error().status, 401);
  EXPECT_EQ(unauthorized_error().code, "invalid_api_key");
  EXPECT_EQ(queue_full_error().status, 429);
  EXPECT_EQ(shutting_down_error().status, 503);
  EXPECT_EQ(internal_error().status, 500);
  EXPECT_EQ(internal_error().type, "server_error");
  EXPECT_EQ(internal_error().message, "internal server error");
  for (const ApiError& e : {not_found_error(), method_not_allowed_error(), body_too_large_error(1),
                            unsupported_media_type_error(), unauthorized_error()}) {
    EXPECT_EQ(e.type, "invalid_request_error");
  }
}

}  // namespace
}  // namespace lily

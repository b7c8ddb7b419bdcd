// Server parts without sockets: log line format, Rust-style quoting, auth, content types, routing, progress bar.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "core/error.h"
#include "server/api_handler.h"
#include "server/auth.h"
#include "core/load_progress.h"
#include "server/request_log.h"

namespace lily {
namespace {

// Expected strings follow Rust's documented `{:?}` for str (char::escape_debug): \" \\ \n \r
// \t \0 and \u{hex} for other control characters; printable non-ASCII stays as is.
TEST(RequestLog, RustDebugQuoteEscapesLikeRust) {
  EXPECT_EQ(rust_debug_quote("plain"), "\"plain\"");
  EXPECT_EQ(rust_debug_quote("say \"hi\" \\ now"), R"("say \"hi\" \\ now")");
  EXPECT_EQ(rust_debug_quote("a\nb\rc\td"), R"("a\nb\rc\td")");
  EXPECT_EQ(rust_debug_quote(std::string("nul\0x", 5)), R"("nul\0x")");
  EXPECT_EQ(rust_debug_quote("bell\x07 esc\x1b del\x7f"), R"("bell\u{7} esc\u{1b} del\u{7f}")");
  EXPECT_EQ(rust_debug_quote("it's"), "\"it's\"");  // single quotes are not escaped in a str
  EXPECT_EQ(rust_debug_quote("caf\xC3\xA9 \xE6\x9D\xB1"), "\"caf\xC3\xA9 \xE6\x9D\xB1\"");
  EXPECT_EQ(rust_debug_quote("c1\xC2\x85"), R"("c1\u{85}")");  // NEL is a control character
  // Invalid UTF-8 cannot reach a Rust String; lossy conversion makes each bad byte U+FFFD.
  EXPECT_EQ(rust_debug_quote("bad\xFF\xC3"), "\"bad\xEF\xBF\xBD\xEF\xBF\xBD\"");
}

TEST(RequestLog, CompletionDetailMatchesLilysPinnedExample) {
  // Lily's pinned example (docs/server.md, *One request*): `POST /v1/chat/completions 200
  // 5560ms prompt=27 cached=5 completion=160 tok/s=28.8` (160 / 5.56 s = 28.78).
  EXPECT_EQ(completion_log_detail(27, 5, 160, 5.560), " prompt=27 cached=5 completion=160 tok/s=28.8");
  EXPECT_EQ(completion_log_detail(3, 0, 0, 0.0), " prompt=3 cached=0 completion=0 tok/s=0.0");
  EXPECT_EQ(error_log_detail("unknown model \"x\""), R"( error="unknown model \"x\"")");
}

TEST(Auth, ConstantTimeEqualsComparesWholeStrings) {
  EXPECT_TRUE(constant_time_equals("secret", "secret"));
  EXPECT_TRUE(constant_time_equals("", ""));
  EXPECT_FALSE(constant_time_equals("secret", "secreT"));
  EXPECT_FALSE(constant_time_equals("secret", "secret2"));
  EXPECT_FALSE(constant_time_equals("secret2", "secret"));
  EXPECT_FALSE(constant_time_equals("", "x"));
  EXPECT_FALSE(constant_time_equals(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(Auth, BearerTokenMatches) {
  EXPECT_TRUE(bearer_token_matches(std::string("Bearer k1"), "k1"));
  EXPECT_TRUE(bearer_token_matches(std::string("bearer k1"), "k1"));
  EXPECT_TRUE(bearer_token_matches(std::string("BEARER   k1 "), "k1"));
  EXPECT_FALSE(bearer_token_matches(std::nullopt, "k1"));
  EXPECT_FALSE(bearer_token_matches(std::string("Bearer"), "k1"));
  EXPECT_FALSE(bearer_token_matches(std::string("Bearer "), "k1"));
  EXPECT_FALSE(bearer_token_matches(std::string("Basic k1"), "k1"));
  EXPECT_FALSE(bearer_token_matches(std::string("Bearerk1"), "k1"));
  EXPECT_FALSE(bearer_token_matches(std::string("Bearer k2"), "k1"));
  EXPECT_FALSE(bearer_token_matches(std::string("Bearer k1k1"), "k1"));
  EXPECT_FALSE(bearer_token_matches(std::string("Bearer "), ""));  // an empty key never matches
}

TEST(Auth, NonLoopbackBindNeedsAKeyOrNoAuth) {
  EXPECT_NO_THROW(check_auth_configuration(true, std::nullopt, false, "127.0.0.1:8000"));
  EXPECT_NO_THROW(check_auth_configuration(false, std::string("k"), false, "0.0.0.0:8000"));
  EXPECT_NO_THROW(check_auth_configuration(false, std::nullopt, true, "0.0.0.0:8000"));
  EXPECT_THROW(check_auth_configuration(false, std::nullopt, false, "0.0.0.0:8000"), InputError);
  EXPECT_THROW(check_auth_configuration(true, std::string("k"), true, "127.0.0.1:8000"), InputError);
  EXPECT_THROW(check_auth_configuration(true, std::string(""), false, "127.0.0.1:8000"), InputError);
  try {
    check_auth_configuration(false, std::nullopt, false, "10.0.0.5:80");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("10.0.0.5:80"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--api-key"), std::string::npos) << e.what();
  }
}

TEST(ContentType, OnlyJsonMediaTypeIsAccepted) {
  EXPECT_TRUE(is_json_content_type(""));
  EXPECT_TRUE(is_json_content_type("application/json"));
  EXPECT_TRUE(is_json_content_type("Application/JSON; charset=utf-8"));
  EXPECT_TRUE(is_json_content_type("  application/json ;charset=UTF-8"));
  EXPECT_FALSE(is_json_content_type("application/x-www-form-urlencoded"));
  EXPECT_FALSE(is_json_content_type("text/plain"));
  EXPECT_FALSE(is_json_content_type("application/jsonx"));
  EXPECT_FALSE(is_json_content_type("application/json-patch+json"));
  EXPECT_FALSE(is_json_content_type("multipart/form-data; boundary=x"));
}

HttpRequestHead head(std::string method, std::string path, std::string content_type = "") {
  HttpRequestHead h;
  h.method = std::move(method);
  h.target = path;
  h.path = std::move(path);
  h.content_type = std::move(content_type);
  return h;
}

TEST(ApiRouting, UnknownPathsWrongMethodsAndContentTypes) {
  ApiHandler handler(ApiConfig{});
  auto status = [&](const HttpRequestHead& h) {
    const std::optional<HttpResponse> r = handler.screen(h);
    return r ? r->status : 0;  // 0: accepted for handle()
  };
  EXPECT_EQ(status(head("GET", "/health")), 0);
  EXPECT_EQ(status(head("GET", "/v1/models")), 0);
  EXPECT_EQ(status(head("GET", "/nope")), 404);
  EXPECT_EQ(status(head("GET", "/v1/models/Qwen3.6-35B-A3B")), 404);
  EXPECT_EQ(status(head("GET", "/v1/completions")), 404);
  EXPECT_EQ(status(head("POST", "/health")), 405);
  EXPECT_EQ(status(head("GET", "/v1/chat/completions")), 405);
  EXPECT_EQ(status(head("post", "/v1/chat/completions")), 405);  // methods are case-sensitive
  const std::optional<HttpResponse> wrong = handler.screen(head("PUT", "/v1/models"));
  ASSERT_TRUE(wrong);
  ASSERT_EQ(wrong->headers.size(), 1u);
  EXPECT_EQ(wrong->headers[0].first, "Allow");
  EXPECT_EQ(wrong->headers[0].second, "GET");
  EXPECT_EQ(status(head("POST", "/v1/chat/completions", "text/plain")), 415);
  // Still loading: completions are refused with 503, health and models answer.
  EXPECT_EQ(status(head("POST", "/v1/chat/completions", "application/json")), 503);
  handler.set_stopping();
  const std::optional<HttpResponse> stopping =
      handler.screen(head("POST", "/v1/chat/completions", "application/json"));
  ASSERT_TRUE(stopping);
  EXPECT_EQ(stopping->status, 503);
  EXPECT_NE(stopping->body.find("\"code\":\"shutting_down\""), std::string::npos) << stopping->body;
}

TEST(ApiRouting, ApiKeyGuardsEverythingButHealth) {
  ApiConfig config;
  config.api_key = "s3cret";
  ApiHandler handler(config);
  HttpRequestHead models = head("GET", "/v1/models");
  const std::optional<HttpResponse> refused = handler.screen(models);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_NE(refused->body.find("invalid_api_key"), std::string::npos) << refused->body;
  models.authorization = "Bearer s3cret";
  EXPECT_FALSE(handler.screen(models));
  models.authorization = "Bearer s3cre";
  EXPECT_TRUE(handler.screen(models));
  EXPECT_FALSE(handler.screen(head("GET", "/health")));
}

TEST(LoadProgress, BarLineShowsBytesRateAndEta) {
  EXPECT_EQ(LoadProgress::bar_line(5'000'000'000, 20'000'000'000, 2.0, 20),
            "[#####...............]   5.00/20.00 GB  2.50 GB/s  ETA 6s");
  EXPECT_EQ(LoadProgress::bar_line(20'000'000'000, 20'000'000'000, 8.0, 10),
            "[##########]  20.00/20.00 GB  2.50 GB/s");
  EXPECT_EQ(LoadProgress::bar_line(0, 0, 0.0, 4), "[####]   0.00/0.00 GB  0.00 GB/s");
}

}  // namespace
}  // namespace lily

// POST /v1/chat/completions request parsing and validation in the two API modes (openai, strict).
#include "server/chat_request.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>

#include "backend/sampling.h"
#include "core/error.h"
#include "core/strict_json.h"
#include "server/openai_types.h"
#include "text/utf8.h"

namespace lily {

namespace {

constexpr std::string_view kInvalidRequest = "invalid_request_error";
constexpr std::string_view kParsePrefix = "parsing chat request: ";

ApiError bad_request(std::string message, std::optional<std::string> param = std::nullopt,
                     std::optional<std::string> code = std::nullopt) {
  return ApiError(400, std::move(message), std::string(kInvalidRequest), std::move(param),
                  std::move(code));
}

// A step-1 failure (Lily: serde could not deserialize the body into ChatRequest). The detail
// may quote a value cut in the middle of a character; lossy repair keeps messages valid UTF-8.
ApiError parse_error(const std::string& detail, std::optional<std::string> param = std::nullopt) {
  return bad_request(std::string(kParsePrefix) + utf8::lossy(detail), std::move(param));
}

std::string in_quotes(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

// A user-supplied string for a message: quoted, cut like describe_json cuts values.
std::string quoted_cut(std::string_view s) {
  constexpr size_t kMax = 57;
  if (s.size() <= kMax + 3) return in_quotes(s);
  return in_quotes(std::string(s.substr(0, kMax)) + "...");
}

// Steps 0 and 1a-1d, shared by both modes: size, byte order mark, UTF-8, strict JSON, object.
Json parse_body_object(std::string_view body, const ServerLimits& limits) {
  if (body.size() > limits.max_body_bytes) throw body_too_large_error(limits.max_body_bytes);
  if (body.substr(0, 3) == "\xEF\xBB\xBF") {
    throw parse_error("the body starts with a UTF-8 byte order mark; send plain JSON");
  }
  if (const size_t bad = utf8::find_invalid(body); bad != std::string_view::npos) {
    throw parse_error("the body is not valid UTF-8 (first bad byte at offset " +
                      std::to_string(bad) + ")");
  }
  Json root;
  try {
    root = parse_strict_json(body, "request body",
                             limits.mode == ApiMode::strict ? limits.max_json_depth
                                                            : limits.max_json_depth_openai);
  } catch (const InputError& error) {
    throw parse_error(error.what());
  }
  if (!root.is_object()) {
    throw parse_error("the body must be a JSON object, found " + describe_json(root));
  }
  return root;
}

// max_tokens (or its alias): a JSON integer in [0, 2^64). Fractions (including 128.0 and
// 1e3), negatives and integers too large for 64 bits (which nlohmann parses as floating point)
// are refused before any conversion.
uint64_t parse_max_tokens(const Json& value, const std::string& name) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  throw parse_error(name +
                        " must be a non-negative integer (at most 18446744073709551615), "
                        "found " +
                        describe_json(value),
                    name);
}

// Steps 2 and 4-5, the same in both modes.
void check_model(const ChatRequest& request, const ServerLimits& limits) {
  if (request.model != limits.model_id) {
    throw bad_request("unknown model " + in_quotes(request.model) + "; this server exposes only " +
                          limits.model_id,
                      "model", "model_not_found");
  }
}

void check_messages(const ChatRequest& request) {
  try {
    check_chat_request_messages(request.messages);
  } catch (const InputError& error) {
    throw bad_request(error.what(), "messages");
  }
}

// ---- strict mode: Lily's contract -------------------------------------------------------

// The fields Lily's ChatRequest accepts, in its declaration order.
constexpr std::array<std::string_view, 5> kStrictFields = {"model", "messages", "max_tokens",
                                                           "stream", "prompt_cache_key"};

bool is_strict_field(std::string_view key) {
  return std::find(kStrictFields.begin(), kStrictFields.end(), key) != kStrictFields.end();
}

std::string strict_fields_list() {
  std::string out;
  for (std::string_view field : kStrictFields) {
    if (!out.empty()) out += ", ";
    out += in_quotes(field);
  }
  return out;
}

ChatRequest parse_strict(const Json& root, const ServerLimits& limits) {
  // Unknown fields first (nlohmann keeps keys sorted, so the first in byte order is named).
  for (const auto& [key, value] : root.items()) {
    if (!is_strict_field(key)) {
      throw parse_error(
          "unknown field " + in_quotes(key) + ", expected one of " + strict_fields_list(), key);
    }
  }
  // Then the type of every present field, in declaration order; then missing fields.
  ChatRequest request;
  request.max_tokens = limits.default_max_tokens;
  if (auto it = root.find("model"); it != root.end()) {
    if (!it->is_string()) {
      throw parse_error("model must be a string, found " + describe_json(*it), "model");
    }
    request.model = it->get<std::string>();
  }
  if (auto it = root.find("messages"); it != root.end()) {
    try {
      request.messages = parse_chat_messages(*it, "messages");
    } catch (const InputError& error) {
      throw parse_error(error.what(), "messages");
    }
  }
  if (auto it = root.find("max_tokens"); it != root.end()) {
    request.max_tokens = parse_max_tokens(*it, "max_tokens");
    request.max_tokens_given = true;
  }
  if (auto it = root.find("stream"); it != root.end()) {
    if (!it->is_boolean()) {
      throw parse_error("stream must be true or false, found " + describe_json(*it), "stream");
    }
    request.stream = it->get<bool>();
  }
  if (auto it = root.find("prompt_cache_key"); it != root.end() && !it->is_null()) {
    if (!it->is_string()) {
      throw parse_error("prompt_cache_key must be a string or null, found " + describe_json(*it),
                        "prompt_cache_key");
    }
    request.prompt_cache_key = it->get<std::string>();
  }
  if (!root.contains("model")) throw parse_error("missing field \"model\"", "model");
  if (!root.contains("messages")) throw parse_error("missing field \"messages\"", "messages");

  check_model(request, limits);                                                   // step 2
  if (request.stream) throw bad_request("streaming is not supported", "stream");  // step 3
  check_messages(request);                                                        // steps 4-5
  if (request.max_tokens == 0) {                                                  // step 6
    throw bad_request("max_tokens must be greater than zero", "max_tokens");
  }
  return request;
}

// ---- openai mode ------------------------------------------------------------------------

// describe_json, but null as plain "null" (describe_json writes "null null").
std::string describe(const Json& value) {
  return value.is_null() ? std::string("null") : describe_json(value);
}

// Every top-level field openai mode knows; any other is accepted, ignored and reported.
constexpr std::array<std::string_view, 41> kOpenAiFields = {
    // used
    "model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
    "prompt_cache_key", "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "seed", "logit_bias", "stop", "logprobs",
    "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "reasoning_effort",
    "chat_template_kwargs", "enable_thinking", "reasoning_budget", "thinking_budget",
    // accepted only with values that change nothing (otherwise "not supported yet")
    "best_of", "functions", "function_call", "response_format", "audio", "modalities",
    "prediction", "web_search_options",
    // accepted and ignored
    "user", "metadata", "store", "service_tier"};

bool is_openai_field(std::string_view key) {
  return std::find(kOpenAiFields.begin(), kOpenAiFields.end(), key) != kOpenAiFields.end();
}

// The value of `key` in `object`, or nullptr when it is absent or null (null means absent).
const Json* given(const Json& object, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// A JSON integer that fits int64 (fractions, floats such as 1.0 and integers >= 2^63: false).
bool to_int64(const Json& value, int64_t& out) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (value.is_number_integer()) {
    out = value.get<int64_t>();
    return true;
  }
  return false;
}

// A number field in a closed or half-open range, e.g. "[0, 2]" or "(0, 1]".
struct Range {
  double lo;
  double hi;
  bool lo_open;
  const char* text;
};

std::optional<double> number_field(const Json& root, const std::string& name, Range range) {
  const Json* value = given(root, name);
  if (!value) return std::nullopt;
  if (value->is_number()) {
    const double v = value->get<double>();
    if ((range.lo_open ? v > range.lo : v >= range.lo) && v <= range.hi) return v;
  }
  throw parse_error(name + " must be a number in " + range.text + ", found " + describe(*value),
                    name);
}

// A JSON integer in [lo, hi] (int64); `expected` completes "<name> must be ...".
std::optional<int64_t> integer_field(const Json& root, const std::string& name, int64_t lo,
                                     int64_t hi, const std::string& expected) {
  const Json* value = given(root, name);
  if (!value) return std::nullopt;
  int64_t v = 0;
  if (to_int64(*value, v) && v >= lo && v <= hi) return v;
  throw parse_error(name + " must be " + expected + ", found " + describe(*value), name);
}

std::optional<bool> bool_field(const Json& object, const std::string& key,
                               const std::string& path) {
  const Json* value = given(object, key);
  if (!value) return std::nullopt;
  if (!value->is_boolean()) {
    throw parse_error(path + " must be true, false or null, found " + describe(*value), path);
  }
  return value->get<bool>();
}

// A field that must be one of the given strings; returns it.
std::optional<std::string> choice_field(const Json& root, const std::string& name,
                                        std::initializer_list<std::string_view> choices) {
  const Json* value = given(root, name);
  if (!value) return std::nullopt;
  if (value->is_string()) {
    const std::string& s = value->get_ref<const std::string&>();
    for (std::string_view c : choices) {
      if (s == c) return s;
    }
  }
  std::string list;
  size_t i = 0;
  for (std::string_view c : choices) {
    list += i == 0 ? "" : (i + 1 == choices.size() ? " or " : ", ");
    list += in_quotes(c);
    ++i;
  }
  throw parse_error(name + " must be " + list + ", found " + describe(*value), name);
}

// A "not supported yet" refusal (step 3).
ApiError unsupported(const std::string& what, const std::string& param) {
  return bad_request(what + " is not supported yet", param);
}

// One message of openai mode after step 1f: the message, plus the first step-3 refusal that
// applies to it (an unsupported role, field or content part).
struct OpenAiMessage {
  ChatMessage message;
  std::optional<ApiError> refusal;
};

void refuse_once(std::optional<ApiError>& slot, ApiError error) {
  if (!slot) slot = std::move(error);
}

// A `content` array: the concatenation of its text parts (the template's render_content,
// T3-41); other parts are recorded as step-3 refusals.
std::string parse_content_parts(const Json& parts, const std::string& at,
                                std::optional<ApiError>& refusal, std::set<std::string>& ignored) {
  std::string text;
  for (size_t j = 0; j < parts.size(); ++j) {
    const Json& part = parts[j];
    const std::string pat = at + "[" + std::to_string(j) + "]";
    if (!part.is_object()) {
      throw parse_error(
          pat + " must be a content part object {\"type\", ...}, found " + describe(part), pat);
    }
    const auto type_it = part.find("type");
    if (type_it == part.end()) throw parse_error(pat + ": missing field \"type\"", pat + ".type");
    const std::string type = type_it->is_string() ? type_it->get<std::string>() : std::string();
    const auto refuse = [&](const std::string& kind) {
      refuse_once(refusal, bad_request(pat + ": " + kind + " inputs are not supported", pat));
    };
    if (type == "text") {
      const auto text_it = part.find("text");
      if (text_it == part.end()) throw parse_error(pat + ": missing field \"text\"", pat + ".text");
      if (!text_it->is_string()) {
        throw parse_error(pat + ".text must be a string, found " + describe(*text_it),
                          pat + ".text");
      }
      for (const auto& [key, value] : part.items()) {
        if (key != "type" && key != "text" && !value.is_null()) {
          ignored.insert("messages[].content[]." + key);
        }
      }
      // A text part that also carries an image or video key renders as that (T8, T19).
      switch (template_content_part_kind(part)) {
        case ContentPartKind::image:
          refuse("image");
          break;
        case ContentPartKind::video:
          refuse("video");
          break;
        case ContentPartKind::text:
        case ContentPartKind::unexpected:
          text += text_it->get_ref<const std::string&>();  // T30-31
          break;
      }
    } else if (const std::string_view media = media_part_kind(type); !media.empty()) {
      refuse(std::string(media));
    } else if (type == "refusal") {
      // An assistant refusal part has no "text": the template raises "Unexpected item type".
      refuse_once(refusal,
                  bad_request(pat + ": content parts of type \"refusal\" are not "
                                    "supported (the chat template renders text parts only)",
                              pat));
    } else {
      throw parse_error(pat +
                            ".type must be \"text\", \"image_url\", \"input_audio\", \"file\" "
                            "or \"refusal\", found " +
                            describe(*type_it),
                        pat + ".type");
    }
  }
  return text;
}

// `<at>.function.name`: a non-empty string (of a history call or a declared tool).
const Json& require_function_name(const Json& function, const std::string& at) {
  const Json* name = given(function, "name");
  if (!name || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    throw parse_error(at + ".function.name must be a non-empty string, found " +
                          (name ? describe(*name) : std::string("nothing")),
                      at + ".function.name");
  }
  return *name;
}

// One assistant tool call {"id", "type": "function", "function": {"name", "arguments"}}: the
// arguments, a JSON string on the wire (an object is accepted too), become the object they
// encode, keys in the client's order (`ordered` is the same call read with OrderedJson).
ChatToolCall parse_history_tool_call(const Json& call, const OrderedJson* ordered,
                                     const std::string& at) {
  if (!call.is_object()) {
    throw parse_error(at + " must be an object {\"id\", \"type\", \"function\"}, found " +
                          describe(call),
                      at);
  }
  ChatToolCall out;
  if (const Json* id = given(call, "id")) {
    if (!id->is_string()) {
      throw parse_error(at + ".id must be a string, found " + describe(*id), at + ".id");
    }
    out.id = id->get<std::string>();
  }
  if (const Json* type = given(call, "type"); type && *type != "function") {
    throw parse_error(at + ".type must be \"function\", found " + describe(*type), at + ".type");
  }
  const Json* function = given(call, "function");
  if (!function || !function->is_object()) {
    throw parse_error(at + ".function must be an object {\"name\", \"arguments\"}, found " +
                          (function ? describe(*function) : std::string("nothing")),
                      at + ".function");
  }
  out.name = require_function_name(*function, at).get<std::string>();
  const std::string aat = at + ".function.arguments";
  // Without the ordered form (not expected: the caller reads it whenever calls are present),
  // the sorted one still gives the right object, in byte order.
  const OrderedJson fallback = OrderedJson::parse(function->dump());
  const OrderedJson& ordered_function = ordered ? ordered->at("function") : fallback;
  const auto args = ordered_function.find("arguments");
  if (args == ordered_function.end() || args->is_null()) {
    out.arguments = OrderedJson::object();
  } else if (args->is_object()) {
    out.arguments = *args;
  } else if (args->is_string()) {
    const std::string& text = args->get_ref<const std::string&>();
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
      out.arguments = OrderedJson::object();  // "" for a call without arguments
    } else {
      try {
        out.arguments = parse_strict_ordered_json(text, aat, 64);
      } catch (const InputError& error) {
        throw parse_error(aat + " must be a JSON object encoded as a string: " + error.what(), aat);
      }
      if (!out.arguments.is_object()) {
        throw parse_error(aat + " must encode a JSON object, found " +
                              describe_json(out.arguments),
                          aat);
      }
    }
  } else {
    throw parse_error(aat + " must be a string (a JSON object), found " + describe_json(*args),
                      aat);
  }
  return out;
}

OpenAiMessage parse_openai_message(const Json& item, const OrderedJson* ordered, size_t i,
                                   std::set<std::string>& ignored) {
  const std::string at = "messages[" + std::to_string(i) + "]";
  if (!item.is_object()) {
    throw parse_error(at + " must be an object {\"role\", \"content\"}, found " + describe(item),
                      at);
  }
  OpenAiMessage out;
  // role: developer is rendered as system (it is the newer name); function is the deprecated
  // predecessor of tool.
  const auto role_it = item.find("role");
  if (role_it == item.end()) throw parse_error(at + ": missing field \"role\"", at + ".role");
  const Json& role = *role_it;
  if (role == "system" || role == "developer") {
    out.message.role = ChatRole::system;
  } else if (role == "user") {
    out.message.role = ChatRole::user;
  } else if (role == "assistant") {
    out.message.role = ChatRole::assistant;
  } else if (role == "tool") {
    out.message.role = ChatRole::tool;
  } else if (role == "function") {
    refuse_once(out.refusal, unsupported(at + ".role \"function\" (send role \"tool\")",
                                         at + ".role"));
  } else {
    throw parse_error(at + ".role must be \"system\", \"developer\", \"user\", \"assistant\" "
                           "or \"tool\", found " + describe_json(role),
                      at + ".role");
  }
  const bool assistant = out.message.role == ChatRole::assistant && !out.refusal;
  const bool tool = out.message.role == ChatRole::tool && !out.refusal;
  if (const Json* calls = given(item, "tool_calls")) {
    if (!calls->is_array()) {
      throw parse_error(at + ".tool_calls must be an array, found " + describe(*calls),
                        at + ".tool_calls");
    }
    if (!calls->empty() && !assistant && !out.refusal) {
      throw bad_request(at + ".tool_calls: only assistant messages carry tool calls",
                        at + ".tool_calls");
    }
    for (size_t j = 0; j < calls->size() && assistant; ++j) {
      const std::string cat = at + ".tool_calls[" + std::to_string(j) + "]";
      const OrderedJson* ordered_call = ordered ? &ordered->at("tool_calls").at(j) : nullptr;
      out.message.tool_calls.push_back(parse_history_tool_call((*calls)[j], ordered_call, cat));
    }
  }
  if (const Json* id = given(item, "tool_call_id")) {
    if (!id->is_string()) {
      throw parse_error(at + ".tool_call_id must be a string, found " + describe(*id),
                        at + ".tool_call_id");
    }
    out.message.tool_call_id = id->get<std::string>();
  }
  if (given(item, "function_call")) {
    refuse_once(out.refusal, unsupported(at + ".function_call (send tool_calls)",
                                         at + ".function_call"));
  }
  if (const Json* name = given(item, "name")) {
    if (!name->is_string()) {
      throw parse_error(at + ".name must be a string, found " + describe(*name), at + ".name");
    }
  }
  // Earlier turns' reasoning: `reasoning_content` (most clients) or `reasoning` (vLLM >= 0.20,
  // Open WebUI); the template renders it after the last user query (T86-104).
  for (const char* key : {"reasoning", "reasoning_content"}) {
    if (const Json* value = given(item, key)) {
      if (!value->is_string()) {
        throw parse_error(at + "." + key + " must be a string or null, found " + describe(*value),
                          at + "." + key);
      }
      if (assistant) out.message.reasoning_content = value->get<std::string>();
    }
  }
  for (const auto& [key, value] : item.items()) {
    if (key != "role" && key != "content" && key != "tool_calls" && key != "tool_call_id" &&
        key != "function_call" && key != "reasoning_content" && key != "reasoning" &&
        !value.is_null()) {
      ignored.insert("messages[]." + key);
    }
  }
  // content: a string, an array of parts, or (assistant and tool) null/absent, which the
  // template renders as "" (T36-37).
  const auto content_it = item.find("content");
  const std::string cat = at + ".content";
  const bool may_be_null = assistant || tool;
  if (content_it == item.end() || content_it->is_null()) {
    if (!may_be_null && !out.refusal) {
      if (content_it == item.end()) throw parse_error(at + ": missing field \"content\"", cat);
      throw parse_error(cat + " must be a string or an array of content parts, found null", cat);
    }
  } else if (content_it->is_string()) {
    out.message.content = content_it->get<std::string>();
  } else if (content_it->is_array()) {
    out.message.content = parse_content_parts(*content_it, cat, out.refusal, ignored);
  } else {
    throw parse_error(cat + " must be a string or an array of content parts" +
                          (may_be_null ? std::string(" (or null)") : std::string()) + ", found " +
                          describe(*content_it),
                      cat);
  }
  return out;
}

// `ordered`: the same array read with OrderedJson (for tool-call arguments), or null.
std::vector<OpenAiMessage> parse_openai_messages(const Json& messages, const OrderedJson* ordered,
                                                 std::set<std::string>& ignored) {
  if (!messages.is_array()) {
    throw parse_error("messages must be a JSON array of {\"role\", \"content\"} objects, found " +
                          describe_json(messages),  // strict mode's text
                      "messages");
  }
  std::vector<OpenAiMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    out.push_back(parse_openai_message(messages[i], ordered ? &(*ordered)[i] : nullptr, i, ignored));
  }
  return out;
}

// logit_bias: {"<token id>": bias}. Keys are canonical decimal ids (no sign, no leading zero,
// no spaces) below the id count; biases numbers in [-100, 100].
std::vector<std::pair<uint32_t, float>> parse_logit_bias(const Json& value,
                                                         const ServerLimits& limits) {
  if (!value.is_object()) {
    throw parse_error(
        "logit_bias must be an object mapping token ids to numbers in "
        "[-100, 100], found " +
            describe(value),
        "logit_bias");
  }
  if (value.size() > static_cast<size_t>(kMaxLogitBias)) {
    throw parse_error("logit_bias has " + std::to_string(value.size()) + " entries, at most " +
                          std::to_string(kMaxLogitBias) + " allowed",
                      "logit_bias");
  }
  const uint64_t bound = limits.token_id_count > 0 ? limits.token_id_count : (uint64_t{1} << 31);
  std::vector<std::pair<uint32_t, float>> out;
  out.reserve(value.size());
  for (const auto& [key, bias] : value.items()) {
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    uint64_t id = 0;
    if (digits) {
      for (char c : key) id = id * 10 + static_cast<uint64_t>(c - '0');
    }
    if (!digits || (key.size() > 1 && key[0] == '0') || id >= bound) {
      throw parse_error("logit_bias key " + quoted_cut(key) +
                            " is not a token id (a decimal integer without sign or leading "
                            "zeros, below " +
                            std::to_string(bound) + ")",
                        "logit_bias");
    }
    if (!bias.is_number() || !(bias.get<double>() >= -100.0 && bias.get<double>() <= 100.0)) {
      throw parse_error("logit_bias[" + in_quotes(key) +
                            "] must be a number in [-100, 100], "
                            "found " +
                            describe(bias),
                        "logit_bias");
    }
    out.emplace_back(static_cast<uint32_t>(id), static_cast<float>(bias.get<double>()));
  }
  std::sort(out.begin(), out.end());  // canonical keys are distinct, so ids are too
  return out;
}

// stop: a string, or an array of at most kMaxStopStrings strings; every string non-empty.
std::vector<std::string> parse_stop(const Json& value) {
  const auto non_empty = [](const Json& s, const std::string& where) {
    if (!s.is_string() || s.get_ref<const std::string&>().empty()) {
      throw parse_error(where + " must be a non-empty string, found " + describe(s), "stop");
    }
    return s.get<std::string>();
  };
  if (value.is_string()) return {non_empty(value, "stop")};
  if (!value.is_array()) {
    throw parse_error("stop must be a string, an array of at most " +
                          std::to_string(kMaxStopStrings) + " strings, or null, found " +
                          describe(value),
                      "stop");
  }
  if (value.size() > kMaxStopStrings) {
    throw parse_error("stop has " + std::to_string(value.size()) + " strings, at most " +
                          std::to_string(kMaxStopStrings) + " allowed",
                      "stop");
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < value.size(); ++i) {
    out.push_back(non_empty(value[i], "stop[" + std::to_string(i) + "]"));
  }
  return out;
}

// Step 1f for the fields that are accepted only with values that change nothing: their type
// (a wrong type is a parse error). Step 3 (`check_unsupported`) refuses the other values.
void check_feature_field_types(const Json& root) {
  if (const Json* v = given(root, "functions"); v && !v->is_array()) {
    throw parse_error("functions must be an array, found " + describe(*v), "functions");
  }
  if (const Json* v = given(root, "function_call");
      v && !v->is_object() && !(v->is_string() && (*v == "none" || *v == "auto"))) {
    throw parse_error(
        "function_call must be \"none\", \"auto\" or an object, found " + describe(*v),
        "function_call");
  }
  if (const Json* v = given(root, "response_format")) {
    const auto type = v->is_object() ? v->find("type") : v->end();
    if (!v->is_object() || type == v->end() ||
        !(*type == "text" || *type == "json_object" || *type == "json_schema")) {
      throw parse_error(
          "response_format must be an object {\"type\": \"text\" | \"json_object\" | "
          "\"json_schema\", ...}, found " +
              describe(*v),
          "response_format");
    }
  }
  if (const Json* v = given(root, "modalities")) {
    const bool ok = v->is_array() && std::all_of(v->begin(), v->end(), [](const Json& m) {
                      return m == "text" || m == "audio";
                    });
    if (!ok) {
      throw parse_error(
          "modalities must be an array of \"text\" and \"audio\", found " + describe(*v),
          "modalities");
    }
  }
}

// Step 1f for the accepted-and-ignored fields OpenAI defines: their documented types; each
// present one is reported.
void check_ignored_field_types(const Json& root, std::set<std::string>& ignored) {
  for (const char* key : {"user", "metadata", "store", "service_tier"}) {
    if (given(root, key)) ignored.insert(key);
  }
  if (const Json* v = given(root, "user"); v && !v->is_string() && !v->is_object()) {
    throw parse_error("user must be a string or an object, found " + describe(*v), "user");
  }
  if (const Json* v = given(root, "metadata"); v && !v->is_object()) {
    throw parse_error("metadata must be an object, found " + describe(*v), "metadata");
  }
  bool_field(root, "store", "store");
  if (const Json* v = given(root, "service_tier"); v && !v->is_string()) {
    throw parse_error("service_tier must be a string, found " + describe(*v), "service_tier");
  }
}

// tools: function tools {"type": "function", "function": {"name", "description"?,
// "parameters"?, "strict"?}}; kept as sent (OrderedJson) for the template.
std::vector<OrderedJson> parse_tools(const Json& tools, const OrderedJson* ordered) {
  if (!tools.is_array()) throw parse_error("tools must be an array, found " + describe(tools), "tools");
  std::vector<OrderedJson> out;
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const Json& tool = tools[i];
    if (!tool.is_object()) {
      throw parse_error(at + " must be an object {\"type\": \"function\", \"function\"}, found " +
                            describe(tool),
                        at);
    }
    const Json* type = given(tool, "type");
    if (!type || *type != "function") {
      throw parse_error(at + ".type must be \"function\" (the only tool type served), found " +
                            (type ? describe(*type) : std::string("nothing")),
                        at + ".type");
    }
    const Json* function = given(tool, "function");
    if (!function || !function->is_object()) {
      throw parse_error(at + ".function must be an object {\"name\", \"description\", "
                             "\"parameters\"}, found " +
                            (function ? describe(*function) : std::string("nothing")),
                        at + ".function");
    }
    const Json* name = &require_function_name(*function, at);
    const std::string& text = name->get_ref<const std::string&>();
    if (text.find_first_of("<>\n\r\t ") != std::string::npos) {
      throw parse_error(at + ".function.name must not contain whitespace, '<' or '>' (the model "
                             "writes it inside <function=...>), found " + describe(*name),
                        at + ".function.name");
    }
    if (!names.insert(text).second) {
      throw parse_error(at + ".function.name " + describe(*name) + " is declared twice",
                        at + ".function.name");
    }
    if (const Json* d = given(*function, "description"); d && !d->is_string()) {
      throw parse_error(at + ".function.description must be a string, found " + describe(*d),
                        at + ".function.description");
    }
    if (const Json* p = given(*function, "parameters"); p && !p->is_object()) {
      throw parse_error(at + ".function.parameters must be a JSON schema object, found " +
                            describe(*p),
                        at + ".function.parameters");
    }
    bool_field(*function, "strict", at + ".function.strict");
    out.push_back(ordered ? (*ordered)[i] : OrderedJson::parse(tool.dump()));
  }
  return out;
}

// tool_choice: "none", "auto", "required" or {"type": "function", "function": {"name"}}.
void parse_tool_choice(const Json& value, ChatRequest& request) {
  if (value == "none") {
    request.tool_choice = ToolChoice::none;
  } else if (value == "auto") {
    request.tool_choice = ToolChoice::automatic;
  } else if (value == "required") {
    request.tool_choice = ToolChoice::required;
  } else if (value.is_object() && given(value, "function") && value.at("function").is_object() &&
             given(value.at("function"), "name") && value.at("function").at("name").is_string()) {
    if (const Json* type = given(value, "type"); type && *type != "function") {
      throw parse_error("tool_choice.type must be \"function\", found " + describe(*type),
                        "tool_choice.type");
    }
    request.tool_choice = ToolChoice::named;
    request.tool_choice_name = value.at("function").at("name").get<std::string>();
  } else {
    throw parse_error("tool_choice must be \"none\", \"auto\", \"required\" or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}, found " +
                          describe(value),
                      "tool_choice");
  }
}

// Thinking and its budget: enable_thinking (chat_template_kwargs or top level) wins over
// reasoning_effort.
void parse_thinking(const Json& root, ChatRequest& request, std::set<std::string>& ignored) {
  const std::optional<std::string> effort =
      choice_field(root, "reasoning_effort", {"none", "minimal", "low", "medium", "high", "xhigh"});
  if (effort) request.thinking = *effort != "none" && *effort != "minimal";
  if (const std::optional<bool> top = bool_field(root, "enable_thinking", "enable_thinking")) {
    request.thinking = *top;
  }
  if (const Json* v = given(root, "chat_template_kwargs")) {
    if (!v->is_object()) {
      throw parse_error("chat_template_kwargs must be an object, found " + describe(*v),
                        "chat_template_kwargs");
    }
    if (const std::optional<bool> on =
            bool_field(*v, "enable_thinking", "chat_template_kwargs.enable_thinking")) {
      request.thinking = *on;
    }
    request.preserve_thinking =
        bool_field(*v, "preserve_thinking", "chat_template_kwargs.preserve_thinking")
            .value_or(false);
    for (const auto& [key, value] : v->items()) {
      if (key != "enable_thinking" && key != "preserve_thinking" && !value.is_null()) {
        ignored.insert("chat_template_kwargs." + key);
      }
    }
  }
  for (const char* key : {"thinking_budget", "reasoning_budget"}) {
    if (const std::optional<int64_t> budget =
            integer_field(root, key, 0, int64_t{1} << 40, "a non-negative integer")) {
      request.reasoning_budget = *budget;
    }
  }
}

// Step 3 of openai mode: values that would change the output but are not implemented yet.
void check_unsupported(const Json& root, const std::vector<OpenAiMessage>& messages, int64_t n,
                       int64_t best_of) {
  for (const OpenAiMessage& m : messages) {
    if (m.refusal) throw *m.refusal;
  }
  if (n > 1) throw bad_request("n > 1 is not supported", "n");
  if (best_of > 1) throw bad_request("best_of > 1 is not supported", "best_of");
  const Json* functions = given(root, "functions");
  if (functions && !functions->empty()) throw unsupported("\"functions\"", "functions");
  if (const Json* v = given(root, "function_call"); v && v->is_object()) {
    throw unsupported("\"function_call\" naming a function", "function_call");
  }
  if (const Json* v = given(root, "response_format"); v && v->at("type") != "text") {
    throw unsupported("\"response_format\" of type " + v->at("type").dump(), "response_format");
  }
  if (given(root, "audio")) throw unsupported("\"audio\"", "audio");
  if (const Json* v = given(root, "modalities");
      v && std::find(v->begin(), v->end(), Json("audio")) != v->end()) {
    throw unsupported("\"modalities\" with \"audio\"", "modalities");
  }
  if (given(root, "prediction")) throw unsupported("\"prediction\"", "prediction");
  if (given(root, "web_search_options")) {
    throw unsupported("\"web_search_options\"", "web_search_options");
  }
}

// tool_choice against the tools (step 3): a choice that needs a tool needs one, a named
// function must be declared.
void check_tool_choice(const ChatRequest& request) {
  if (request.tool_choice == ToolChoice::required && request.tools.empty()) {
    throw bad_request("tool_choice \"required\" needs tools", "tool_choice");
  }
  if (request.tool_choice == ToolChoice::named) {
    const bool declared = std::any_of(request.tools.begin(), request.tools.end(),
                                      [&](const OrderedJson& tool) {
                                        return tool.at("function").at("name") ==
                                               request.tool_choice_name;
                                      });
    if (!declared) {
      throw bad_request("tool_choice names the function " + quoted_cut(request.tool_choice_name) +
                            ", which is not among the tools",
                        "tool_choice");
    }
  }
}

ChatRequest parse_openai(const Json& root, const OrderedJson* ordered, const ServerLimits& limits) {
  ChatRequest request;
  request.max_tokens = limits.default_max_tokens;
  std::set<std::string> ignored;
  // Step 1e: unknown fields are not refused; they are reported (null counts as absent).
  for (const auto& [key, value] : root.items()) {
    if (!is_openai_field(key) && !value.is_null()) ignored.insert(key);
  }
  // Step 1f: every present field's type and range, in kOpenAiFields order.
  if (auto it = root.find("model"); it != root.end()) {
    if (!it->is_string()) {
      throw parse_error("model must be a string, found " + describe_json(*it), "model");
    }
    request.model = it->get<std::string>();
  }
  std::vector<OpenAiMessage> messages;
  if (auto it = root.find("messages"); it != root.end()) {
    messages = parse_openai_messages(*it, ordered ? &ordered->at("messages") : nullptr, ignored);
  }
  std::optional<uint64_t> max_tokens;
  std::optional<uint64_t> max_completion_tokens;
  if (const Json* v = given(root, "max_tokens")) max_tokens = parse_max_tokens(*v, "max_tokens");
  if (const Json* v = given(root, "max_completion_tokens")) {
    max_completion_tokens = parse_max_tokens(*v, "max_completion_tokens");
  }
  if (const Json* v = given(root, "stream")) {
    if (!v->is_boolean()) {
      throw parse_error("stream must be true or false, found " + describe_json(*v), "stream");
    }
    request.stream = v->get<bool>();
  }
  bool include_usage = false;
  if (const Json* v = given(root, "stream_options")) {
    if (!v->is_object()) {
      throw parse_error("stream_options must be an object or null, found " + describe(*v),
                        "stream_options");
    }
    include_usage = bool_field(*v, "include_usage", "stream_options.include_usage").value_or(false);
    for (const auto& [key, value] : v->items()) {
      if (key != "include_usage" && !value.is_null()) ignored.insert("stream_options." + key);
    }
  }
  if (const Json* v = given(root, "prompt_cache_key")) {
    if (!v->is_string()) {
      throw parse_error("prompt_cache_key must be a string or null, found " + describe_json(*v),
                        "prompt_cache_key");
    }
    request.prompt_cache_key = v->get<std::string>();
  }
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  const int64_t n = integer_field(root, "n", 1, kInt64Max, "a positive integer").value_or(1);
  SamplingFields& s = request.sampling;
  s.temperature = number_field(root, "temperature", {0.0, 2.0, false, "[0, 2]"});
  s.top_p = number_field(root, "top_p", {0.0, 1.0, true, "(0, 1]"});
  s.top_k = integer_field(root, "top_k", -1, kInt64Max, "an integer >= 0, or -1 for no limit");
  if (s.top_k == -1) s.top_k = 0;
  s.min_p = number_field(root, "min_p", {0.0, 1.0, false, "[0, 1]"});
  s.presence_penalty = number_field(root, "presence_penalty", {-2.0, 2.0, false, "[-2, 2]"});
  s.frequency_penalty = number_field(root, "frequency_penalty", {-2.0, 2.0, false, "[-2, 2]"});
  s.repetition_penalty = number_field(root, "repetition_penalty", {0.0, 2.0, true, "(0, 2]"});
  if (const Json* v = given(root, "seed")) {
    if (v->is_number_unsigned()) {
      s.seed = v->get<uint64_t>();
    } else if (v->is_number_integer()) {
      s.seed = static_cast<uint64_t>(v->get<int64_t>());  // two's complement
    } else {
      throw parse_error(
          "seed must be an integer (at least -9223372036854775808, at most "
          "18446744073709551615), found " +
              describe(*v),
          "seed");
    }
  }
  if (const Json* v = given(root, "logit_bias")) s.logit_bias = parse_logit_bias(*v, limits);
  if (const Json* v = given(root, "stop")) request.stop = parse_stop(*v);
  const std::optional<bool> logprobs = bool_field(root, "logprobs", "logprobs");
  request.logprobs = logprobs.value_or(false);
  const std::optional<int64_t> top_logprobs =
      integer_field(root, "top_logprobs", 0, kMaxTopLogprobs,
                    "an integer in [0, " + std::to_string(kMaxTopLogprobs) + "]");
  const int64_t best_of =
      integer_field(root, "best_of", 1, kInt64Max, "a positive integer").value_or(1);
  if (const Json* v = given(root, "tools")) {
    request.tools = parse_tools(*v, ordered ? &ordered->at("tools") : nullptr);
    if (!request.tools.empty()) request.tool_choice = ToolChoice::automatic;
  }
  if (const Json* v = given(root, "tool_choice")) parse_tool_choice(*v, request);
  if (request.tools.empty() && request.tool_choice == ToolChoice::automatic) {
    request.tool_choice = ToolChoice::none;  // "auto" without tools: nothing to call
  }
  request.parallel_tool_calls =
      bool_field(root, "parallel_tool_calls", "parallel_tool_calls").value_or(true);
  parse_thinking(root, request, ignored);
  check_feature_field_types(root);
  check_ignored_field_types(root, ignored);
  // Step 1g: missing fields.
  if (!root.contains("model")) throw parse_error("missing field \"model\"", "model");
  if (!root.contains("messages")) throw parse_error("missing field \"messages\"", "messages");

  check_model(request, limits);                   // step 2
  check_unsupported(root, messages, n, best_of);  // step 3
  check_tool_choice(request);
  request.messages.reserve(messages.size());
  for (OpenAiMessage& m : messages) request.messages.push_back(std::move(m.message));
  check_messages(request);  // steps 4-5
  // Step 6: max_tokens and its alias, then the logprobs rule.
  if (max_tokens && max_completion_tokens && *max_tokens != *max_completion_tokens) {
    throw bad_request("max_tokens (" + std::to_string(*max_tokens) +
                          ") and max_completion_tokens (" + std::to_string(*max_completion_tokens) +
                          ") differ; send one of them",
                      "max_completion_tokens");
  }
  if (max_tokens || max_completion_tokens) {
    request.max_tokens = max_tokens ? *max_tokens : *max_completion_tokens;
    request.max_tokens_given = true;
    if (request.max_tokens == 0) {
      const std::string name = max_tokens ? "max_tokens" : "max_completion_tokens";
      throw bad_request(name + " must be greater than zero", name);
    }
  }
  if (top_logprobs && !request.logprobs) {
    throw bad_request("top_logprobs requires logprobs: true", "top_logprobs");
  }
  request.top_logprobs = static_cast<int>(top_logprobs.value_or(0));
  request.include_usage = request.stream && include_usage;
  request.ignored_fields.assign(ignored.begin(), ignored.end());
  return request;
}

}  // namespace

bool SamplingFields::any() const {
  return temperature || top_p || top_k || min_p || presence_penalty || frequency_penalty ||
         repetition_penalty || seed || !logit_bias.empty();
}

ChatRequest parse_chat_request(std::string_view body, const ServerLimits& limits) {
  const Json root = parse_body_object(body, limits);
  if (limits.mode == ApiMode::strict) return parse_strict(root, limits);
  // Tool schemas and call arguments go back into the prompt in the client's key order, which
  // Json (sorted) loses: read the body once more, keeping it (it already passed every check).
  std::optional<OrderedJson> ordered;
  if (body.find("\"tool") != std::string_view::npos) {
    ordered = parse_strict_ordered_json(body, "request body", limits.max_json_depth_openai);
  }
  return parse_openai(root, ordered ? &*ordered : nullptr, limits);
}

std::string render_request_prompt(const ChatRequest& request, bool thinking) {
  try {
    ChatPromptOptions options;
    options.enable_thinking = thinking;
    options.preserve_thinking = request.preserve_thinking;
    return render_chat(request.messages, request.tools, options);
  } catch (const InputError& error) {
    throw bad_request(std::string("rendering chat template: ") + error.what(), "messages");
  }
}

uint64_t checked_max_tokens(uint64_t prompt_tokens, uint64_t max_tokens, uint64_t max_seq) {
  if (prompt_tokens == 0) {
    throw bad_request("chat template produced an empty prompt", "messages");
  }
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  // prompt + max_tokens + 1, each addition checked.
  if (max_tokens > kMax - prompt_tokens || prompt_tokens + max_tokens == kMax) {
    throw bad_request("request token count overflow", "max_tokens");
  }
  const uint64_t needed = prompt_tokens + max_tokens + 1;
  if (needed > max_seq) {
    throw bad_request("request needs " + std::to_string(needed) + " tokens but server max_seq is " +
                          std::to_string(max_seq),
                      "messages", "context_length_exceeded");
  }
  return max_tokens;
}

uint64_t clamp_max_seq(uint64_t cli_max_seq, uint64_t declared_max_position_embeddings) {
  uint64_t max_seq = cli_max_seq;
  if (declared_max_position_embeddings > 0 && declared_max_position_embeddings < max_seq) {
    max_seq = declared_max_position_embeddings;
  }
  if (max_seq < 2) {
    throw InputError("max_seq must be at least 2 (--max-seq " + std::to_string(cli_max_seq) +
                     ", checkpoint max_position_embeddings " +
                     std::to_string(declared_max_position_embeddings) + ")");
  }
  return max_seq;
}

}  // namespace lily

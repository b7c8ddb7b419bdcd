// Test-only scripted answers (`lily serve --test-script FILE`): a request's output forced to a given text.
//
// Real clients (the openai package, agent CLIs) need real tool calls to exercise a server end
// to end, and a random-weight checkpoint never writes one. A script forces the model's output
// token by token (ForcingPlan::prefix), so everything after the model (output parsing,
// streaming, tool-call ids, the session cache) is the production path.
#include "server/test_script.h"

#include "core/error.h"
#include "core/strict_json.h"

namespace lily {

namespace {

ChatRole parse_role(const Json& value, const std::string& where) {
  if (value == "system") return ChatRole::system;
  if (value == "user") return ChatRole::user;
  if (value == "assistant") return ChatRole::assistant;
  if (value == "tool") return ChatRole::tool;
  throw InputError(where + " must be \"system\", \"user\", \"assistant\" or \"tool\", found " +
                   describe_json(value));
}

}  // namespace

std::vector<TestScriptRule> read_test_script(const std::string& path) {
  const Json root = read_strict_json_file(path, 16u << 20, 16);
  if (!root.is_array()) {
    throw InputError(path + ": a test script is a JSON array of rules, found " +
                     describe_json(root));
  }
  std::vector<TestScriptRule> rules;
  for (size_t i = 0; i < root.size(); ++i) {
    const std::string where = path + ": [" + std::to_string(i) + "]";
    const Json& item = root[i];
    if (!item.is_object()) {
      throw InputError(where + " must be an object {\"last_role\", \"contains\", \"output\"}, found " +
                       describe_json(item));
    }
    TestScriptRule rule;
    for (const auto& [key, value] : item.items()) {
      if (key == "last_role") {
        rule.last_role = parse_role(value, where + ".last_role");
      } else if (key == "contains") {
        if (!value.is_string()) {
          throw InputError(where + ".contains must be a string, found " + describe_json(value));
        }
        rule.contains = value.get<std::string>();
      } else if (key != "output") {
        throw InputError(where + ": unknown field \"" + key +
                         "\", expected last_role, contains or output");
      }
    }
    rule.output = require_string(item, "output", where);
    rules.push_back(std::move(rule));
  }
  return rules;
}

std::optional<std::string> match_test_script(const std::vector<TestScriptRule>& rules,
                                             const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return std::nullopt;
  const ChatMessage& last = messages.back();
  for (const TestScriptRule& rule : rules) {
    if (rule.last_role && *rule.last_role != last.role) continue;
    if (rule.contains && last.content.find(*rule.contains) == std::string::npos) continue;
    return rule.output;
  }
  return std::nullopt;
}

}  // namespace lily

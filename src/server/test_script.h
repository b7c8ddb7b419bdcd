// Test-only scripted answers (`lily serve --test-script FILE`): a request's output forced to a given text.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "text/chat_format.h"

namespace lily {

// One rule of a test script: a chat request whose last message has `last_role` (when given)
// and contains `contains` (when given) is answered with `output`.
struct TestScriptRule {
  std::optional<ChatRole> last_role;
  std::optional<std::string> contains;
  std::string output;  // the raw model text (reasoning, tool-call markup and all)
};

// The rules of a test script file: a JSON array of {"last_role": "user"|"tool"|...,
// "contains": "...", "output": "..."} (last_role and contains optional). Throws InputError
// naming the file and the bad element.
std::vector<TestScriptRule> read_test_script(const std::string& path);

// The output of the first rule matching `messages` (its last message), or nullopt.
std::optional<std::string> match_test_script(const std::vector<TestScriptRule>& rules,
                                             const std::vector<ChatMessage>& messages);

}  // namespace lily

// API-key checks: Bearer parsing, constant-time comparison, and which bind addresses need a key.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace lily {

// Compares two strings in time that depends only on their lengths, not on where they differ.
bool constant_time_equals(std::string_view a, std::string_view b);

// True when `authorization` is "Bearer <token>" (scheme case-insensitive, one or more spaces)
// and <token> equals `api_key`.
bool bearer_token_matches(const std::optional<std::string>& authorization,
                          std::string_view api_key);

// The start-up rule (docs/server.md, *Command line*): loopback addresses may run without a key;
// any other bind address needs --api-key unless --no-auth is given. Throws InputError when it
// is missing, or when both are given. `is_loopback` describes the bound address.
void check_auth_configuration(bool is_loopback, const std::optional<std::string>& api_key,
                              bool no_auth, std::string_view bind_address);

}  // namespace lily

// API-key checks for non-loopback listeners.
#include "server/auth.h"

#include <algorithm>
#include <cctype>
#include <cstddef>

#include "core/error.h"

namespace lily {

bool constant_time_equals(std::string_view a, std::string_view b) {
  // Every byte position of the longer string is visited whatever the contents are.
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const auto x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u;
    const auto y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= x ^ y;
  }
  // Keep the compiler from turning the loop into an early-exit comparison.
  volatile unsigned result = diff;
  return result == 0;
}

bool bearer_token_matches(const std::optional<std::string>& authorization,
                          std::string_view api_key) {
  if (!authorization || api_key.empty()) return false;
  std::string_view value = *authorization;
  constexpr std::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return false;
  }
  value.remove_prefix(kScheme.size());
  if (value.front() != ' ') return false;
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  return constant_time_equals(value, api_key);
}

void check_auth_configuration(bool is_loopback, const std::optional<std::string>& api_key,
                              bool no_auth, std::string_view bind_address) {
  if (api_key && no_auth) {
    throw InputError("give at most one of --api-key and --no-auth");
  }
  if (api_key && api_key->empty()) {
    throw InputError("--api-key is empty; expected a secret clients send as "
                     "\"Authorization: Bearer <key>\"");
  }
  if (!is_loopback && !api_key && !no_auth) {
    throw InputError("--bind " + std::string(bind_address) +
                     " is not a loopback address: give --api-key KEY (or LILY_API_KEY) so that "
                     "clients must authenticate, or --no-auth to serve without a key");
  }
}

}  // namespace lily

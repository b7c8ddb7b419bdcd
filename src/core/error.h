// Error type for everything a user can get wrong: bad files, configs, arguments.
#pragma once

#include <stdexcept>
#include <string>

namespace lily {

// Thrown for bad input (files, configs, arguments, requests). The message says what was
// wrong, where, what was expected and what was found. Callers at the edge (CLI, server)
// turn it into exit code 2 or a 4xx; anything else that escapes is an internal fault.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace lily

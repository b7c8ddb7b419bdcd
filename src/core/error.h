// Error types: InputError for everything a user can get wrong, DeviceFault for a device lost for good.
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

// Thrown when the device is unusable for the rest of the process: a CUDA error that poisons
// the context (an illegal address, a kernel trap, an uncorrectable ECC error), after which
// every later call on it fails too. Unlike other errors it is not the request's fault and not
// recoverable by retrying it: the engine fails everything it holds and the server exits
// non-zero so that a supervisor restarts it (docs/server.md, "Failures").
class DeviceFault : public std::runtime_error {
 public:
  explicit DeviceFault(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace lily

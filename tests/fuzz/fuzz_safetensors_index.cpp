// libFuzzer target: lily::parse_safetensors_index on arbitrary text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "checkpoint/safetensors.h"
#include "core/error.h"

// Only InputError may leave the parser; anything else crashes the fuzzer.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto weight_map = lily::parse_safetensors_index(text, "model.safetensors.index.json");
    // An accepted index never names a file outside the model directory.
    for (const auto& [tensor, file] : weight_map) {
      if (file.empty() || file == "." || file == ".." ||
          file.find_first_of(std::string_view("/\\\0", 3)) != std::string::npos) {
        std::abort();
      }
    }
  } catch (const lily::InputError&) {
  }
  return 0;
}

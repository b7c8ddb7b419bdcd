// Streaming safetensors writer: header first, then tensor bytes produced chunk by chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace lily {

// A tensor to write. `produce` is called with consecutive chunks that together cover
// exactly nbytes() bytes, in order; it fills each chunk. This keeps memory bounded for
// the 20 GB production profile.
struct TensorSource {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<uint64_t> shape;
  std::function<void(std::span<std::byte> chunk)> produce;

  uint64_t nbytes() const;
};

// Writes one safetensors file. Tensors are laid out and listed in name order; the JSON
// header is padded with spaces to a multiple of 8 bytes so the data section is aligned.
// Output is byte-identical for identical input. Throws std::runtime_error on I/O failure.
void write_safetensors(const std::string& path, std::vector<TensorSource> tensors,
                       const std::map<std::string, std::string>& metadata);

// Bytes of the file write_safetensors would produce, without writing it.
uint64_t safetensors_file_size(const std::vector<TensorSource>& tensors,
                               const std::map<std::string, std::string>& metadata);

}  // namespace lily

// libFuzzer target: lily::parse_safetensors_header on arbitrary file bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/error.h"

// Only InputError may leave the parser; anything else (another exception, a sanitizer
// report, a broken invariant below) crashes the fuzzer.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  lily::ShardHeader header;
  try {
    header = lily::parse_safetensors_header(file, "fuzz.safetensors");
  } catch (const lily::InputError&) {
    return 0;
  }
  // What the loader relies on for an accepted header: every tensor's bytes lie inside
  // the file, match shape x dtype, and no two non-empty tensors share a byte.
  for (const lily::TensorEntry& t : header.tensors) {
    if (t.name.empty() || t.shape.size() > lily::kMaxTensorRank) std::abort();
    if (t.file_offset > size || t.nbytes > size - t.file_offset) std::abort();
    uint64_t elements = 1;
    for (uint64_t dim : t.shape) elements *= dim;  // the parser refused any overflow
    if (elements * lily::dtype_size(t.dtype) != t.nbytes) std::abort();
    if (t.nbytes > 0) {  // touch both ends so ASan checks the span
      volatile uint8_t edge =
          static_cast<uint8_t>(data[t.file_offset] ^ data[t.file_offset + t.nbytes - 1]);
      (void)edge;
    }
  }
  std::vector<const lily::TensorEntry*> by_offset;
  for (const lily::TensorEntry& t : header.tensors) {
    if (t.nbytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->file_offset < b->file_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->file_offset < by_offset[i - 1]->file_offset + by_offset[i - 1]->nbytes) {
      std::abort();
    }
  }
  return 0;
}

// The benchmark's synthetic prompt and FNV-1a-64 token digest.
#include "bench/workload.h"

#include <cstdio>

namespace lily {

std::vector<int32_t> synthetic_prompt(int64_t length, uint64_t vocab_size) {
  std::vector<int32_t> ids(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) {
    const uint32_t hash = static_cast<uint32_t>(i) * 2654435761u;  // wraps mod 2^32
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(hash % vocab_size);
  }
  return ids;
}

uint64_t token_digest(std::span<const int32_t> tokens) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (int32_t id : tokens) {
    hash ^= static_cast<uint64_t>(static_cast<uint32_t>(id));
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string digest_hex(uint64_t digest) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(digest));
  return text;
}

}  // namespace lily

// Deterministic pseudo-random numbers for synthetic checkpoints (same bytes on any machine).
#include "synth/prng.h"

namespace lily {

uint64_t stream_seed(uint64_t seed, std::string_view name) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : name) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  SplitMix64 mix(hash ^ (seed * 0x9e3779b97f4a7c15ull));
  return mix.next();
}

}  // namespace lily

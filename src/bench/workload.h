// The benchmark's fixed workload (docs/bench.md): the synthetic prompt and the token digest.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace lily {

inline constexpr const char* kPromptKind = "u32_golden_ratio_hash_mod_vocab";

// Token i = (i * 2654435761 mod 2^32) mod vocab_size (a wrapping u32 multiply). No tokenizer.
std::vector<int32_t> synthetic_prompt(int64_t length, uint64_t vocab_size);

// FNV-1a-64 over the ids as whole u32 values: h = (h ^ id) * 0x100000001b3, starting from
// 0xcbf29ce484222325.
uint64_t token_digest(std::span<const int32_t> tokens);

// 16 lower-case hex digits.
std::string digest_hex(uint64_t digest);

}  // namespace lily

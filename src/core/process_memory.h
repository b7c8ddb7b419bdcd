// How much of the machine's RAM this process holds (resident set), for the start-up report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace lily {

// What /proc/self/statm says: resident pages x page size, and of those the pages shared with
// a file mapping (a checkpoint used in place from the page cache counts here, once it has
// been read). nullopt where /proc is not there or cannot be read.
struct ResidentMemory {
  uint64_t resident_bytes = 0;  // VmRSS
  uint64_t file_bytes = 0;      // resident pages backed by a file (RssFile + RssShmem)
};
std::optional<ResidentMemory> resident_memory();

// "20.18 GiB" (two decimals, binary units).
std::string format_gib(uint64_t bytes);

}  // namespace lily

// Resident memory of this process from /proc/self/statm.
#include "core/process_memory.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace lily {

std::optional<ResidentMemory> resident_memory() {
  // statm: size resident shared text lib data dt, in pages; "shared" is the resident pages
  // backed by files or shared memory (RssFile + RssShmem).
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0, shared = 0;
  if (!(in >> size >> resident >> shared)) return std::nullopt;
  const long page = ::sysconf(_SC_PAGESIZE);
  if (page <= 0) return std::nullopt;
  const auto p = static_cast<uint64_t>(page);
  return ResidentMemory{resident * p, shared * p};
}

std::string format_gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

}  // namespace lily

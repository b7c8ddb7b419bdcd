// resident_memory(): the resident set grows by what the process touches, file pages count as file-backed.
#include "core/process_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/mapped_file.h"

namespace lily {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(ResidentMemory, GrowsByTheAnonymousMemoryTouched) {
  const std::optional<ResidentMemory> before = resident_memory();
  ASSERT_TRUE(before.has_value()) << "/proc/self/statm is readable on Linux";
  EXPECT_GT(before->resident_bytes, 0u);
  EXPECT_LE(before->file_bytes, before->resident_bytes);
  std::vector<char> block(64 * kMiB);
  std::memset(block.data(), 1, block.size());  // every page touched
  const std::optional<ResidentMemory> after = resident_memory();
  ASSERT_TRUE(after.has_value());
  EXPECT_GE(after->resident_bytes, before->resident_bytes + 60 * kMiB);
  EXPECT_EQ(block[12345], 1);
}

TEST(ResidentMemory, AMappedFileReadCountsAsFileBacked) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("lily_process_memory_" + std::to_string(::getpid()));
  {
    std::ofstream out(path, std::ios::binary);
    const std::vector<char> data(32 * kMiB, 7);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  const MappedFile file(path.string());
  const std::optional<ResidentMemory> before = resident_memory();
  ASSERT_TRUE(before.has_value());
  unsigned sum = 0;
  for (uint64_t i = 0; i < file.size(); i += 4096) sum += static_cast<unsigned>(file.data()[i]);
  const std::optional<ResidentMemory> after = resident_memory();
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(sum, 7u * static_cast<unsigned>(32 * kMiB / 4096));
  EXPECT_GE(after->file_bytes, before->file_bytes + 30 * kMiB);
  std::filesystem::remove(path);
}

TEST(ResidentMemory, FormatsBinaryGigabytes) {
  EXPECT_EQ(format_gib(0), "0.00 GiB");
  EXPECT_EQ(format_gib(3ull << 29), "1.50 GiB");
  EXPECT_EQ(format_gib(21'668'000'000ull), "20.18 GiB");
}

}  // namespace
}  // namespace lily

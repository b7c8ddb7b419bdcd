// Read-only memory mapping of a whole file (RAII).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace lily {

// Maps a file read-only for the lifetime of the object. Weights are used in place from
// the mapping (no copy); the kernel pages them in on demand. Movable, not copyable.
class MappedFile {
 public:
  MappedFile() = default;
  // Throws InputError naming the path if the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, static_cast<size_t>(size_)}; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace lily

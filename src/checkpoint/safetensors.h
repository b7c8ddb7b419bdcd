// safetensors shards: header parsing and validation, index resolution, tensor lookup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/mapped_file.h"

namespace lily {

// Every dtype the safetensors format defines. Unknown dtype strings are an error.
enum class DType : uint8_t {
  BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64
};
uint64_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
std::optional<DType> parse_dtype(std::string_view name);
// "[2, 3]": a shape as error messages print it.
std::string shape_string(const std::vector<uint64_t>& shape);

// One tensor as described by a shard header, after validation.
struct TensorEntry {
  std::string name;
  DType dtype = DType::U8;
  std::vector<uint64_t> shape;
  uint64_t file_offset = 0;  // absolute byte offset of the data in the shard file
  uint64_t nbytes = 0;       // == product(shape) * dtype_size(dtype)
  uint32_t shard = 0;        // index into TensorStore::shard_files()
};

struct ShardHeader {
  std::map<std::string, std::string> metadata;  // "__metadata__" (string -> string)
  std::vector<TensorEntry> tensors;             // in header order
};

// Limits that keep a hostile file from making us allocate by its numbers.
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // same cap as the reference library
inline constexpr uint64_t kMaxIndexBytes = 64ull << 20;
inline constexpr size_t kMaxTensorRank = 8;

// Parses and validates the header of a whole safetensors file held in `file`.
// `file_name` is used in messages. Pure function (no I/O), fuzzed.
// Checks: 8-byte length prefix within the file, strict JSON object, entries with exactly
// dtype/shape/data_offsets, known dtype, shape product without overflow, offsets not
// reversed, inside the data section, byte size == product(shape) * dtype size, and no two
// tensors overlapping. Throws InputError.
ShardHeader parse_safetensors_header(std::span<const std::byte> file, std::string_view file_name);

// Parses model.safetensors.index.json text: returns weight_map (tensor -> shard file name).
// Shard names must be plain file names (no directories). Pure function, fuzzed.
std::map<std::string, std::string> parse_safetensors_index(std::string_view text,
                                                           std::string_view file_name);

// All shards of a checkpoint directory, mapped, with every tensor registered by name.
class TensorStore {
 public:
  // Uses model.safetensors.index.json when present, else model.safetensors. Checks that
  // every shard the index names exists, that no tensor is in two shards, and that each
  // tensor lives in the shard the index says. Throws InputError.
  static TensorStore open(const std::string& dir);

  const TensorEntry* find(std::string_view name) const;
  std::span<const std::byte> bytes(const TensorEntry& entry) const;
  const std::vector<TensorEntry>& tensors() const { return tensors_; }  // sorted by name
  const std::vector<std::string>& shard_files() const { return shard_files_; }
  uint64_t file_bytes() const;  // sum of shard file sizes

  // Reads every shard's pages into memory (sequentially, with read-ahead advice), so that the
  // first request does not wait on the disk. Calls progress(bytes done, total) every 64 MiB
  // and at the end; stops early, returning false, when progress returns false.
  bool prefetch(const std::function<bool(uint64_t, uint64_t)>& progress) const;

 private:
  std::vector<std::string> shard_files_;  // file names relative to the directory
  std::vector<MappedFile> shards_;
  std::vector<TensorEntry> tensors_;
  std::unordered_map<std::string_view, size_t> by_name_;  // views into tensors_[i].name
};

}  // namespace lily

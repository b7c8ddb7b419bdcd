// safetensors shards: header parsing and validation, index resolution, tensor lookup.
#include "checkpoint/safetensors.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/strict_json.h"

namespace lily {

namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  uint64_t size;
};

constexpr std::array<DTypeInfo, 15> kDTypes{{
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},        {DType::I8, "I8", 1},
    {DType::F8_E5M2, "F8_E5M2", 1}, {DType::F8_E4M3, "F8_E4M3", 1}, {DType::I16, "I16", 2},
    {DType::U16, "U16", 2},   {DType::F16, "F16", 2},      {DType::BF16, "BF16", 2},
    {DType::I32, "I32", 4},   {DType::U32, "U32", 4},      {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},   {DType::I64, "I64", 8},      {DType::U64, "U64", 8},
}};

const DTypeInfo& info(DType dtype) {
  for (const DTypeInfo& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}


TensorEntry parse_entry(const std::string& name, const Json& value, uint64_t data_size,
                        const std::string& where) {
  if (!value.is_object()) {
    throw InputError(where + " is " + describe_json(value) +
                     ", expected an object with dtype, shape and data_offsets");
  }
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      throw InputError(where + " has unexpected field \"" + key +
                       "\" (expected only dtype, shape, data_offsets)");
    }
  }
  TensorEntry entry;
  entry.name = name;
  const std::string dtype = require_string(value, "dtype", where);
  const std::optional<DType> parsed = parse_dtype(dtype);
  if (!parsed) throw InputError(where + ".dtype \"" + dtype + "\" is not a safetensors dtype");
  entry.dtype = *parsed;

  const Json& shape = require_field(value, "shape", where);
  if (!shape.is_array()) {
    throw InputError(where + ".shape is " + describe_json(shape) + ", expected an array");
  }
  if (shape.size() > kMaxTensorRank) {
    throw InputError(where + ".shape has rank " + std::to_string(shape.size()) +
                     ", expected at most " + std::to_string(kMaxTensorRank));
  }
  uint64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const uint64_t dim = as_uint(shape[i], where + ".shape[" + std::to_string(i) + "]");
    entry.shape.push_back(dim);
    if (__builtin_mul_overflow(elements, dim, &elements)) {
      throw InputError(where + ".shape " + describe_json(shape) + " overflows 64 bits");
    }
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(elements, info(entry.dtype).size, &expected_bytes)) {
    throw InputError(where + ".shape " + describe_json(shape) + " overflows 64 bits in bytes");
  }

  const Json& offsets = require_field(value, "data_offsets", where);
  if (!offsets.is_array() || offsets.size() != 2) {
    throw InputError(where + ".data_offsets is " + describe_json(offsets) +
                     ", expected [begin, end]");
  }
  const uint64_t begin = as_uint(offsets[0], where + ".data_offsets[0]");
  const uint64_t end = as_uint(offsets[1], where + ".data_offsets[1]");
  if (end < begin) {
    throw InputError(where + ".data_offsets [" + std::to_string(begin) + ", " +
                     std::to_string(end) + "] are reversed");
  }
  if (end > data_size) {
    throw InputError(where + ".data_offsets [" + std::to_string(begin) + ", " +
                     std::to_string(end) + "] run past the data section (" +
                     std::to_string(data_size) + " bytes)");
  }
  if (end - begin != expected_bytes) {
    throw InputError(where + " spans " + std::to_string(end - begin) + " bytes, expected " +
                     std::to_string(expected_bytes) + " for " + dtype + " " +
                     shape_string(entry.shape));
  }
  entry.file_offset = begin;  // relative for now; made absolute by the caller
  entry.nbytes = expected_bytes;
  return entry;
}

}  // namespace

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

uint64_t dtype_size(DType dtype) { return info(dtype).size; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const DTypeInfo& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

ShardHeader parse_safetensors_header(std::span<const std::byte> file, std::string_view file_name) {
  const std::string where(file_name);
  if (file.size() < 8) {
    throw InputError(where + ": file is " + std::to_string(file.size()) +
                     " bytes, too short for the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {  // little-endian u64
    header_len = (header_len << 8) | static_cast<uint64_t>(file[static_cast<size_t>(i)]);
  }
  const uint64_t after_prefix = file.size() - 8;
  if (header_len > after_prefix) {
    throw InputError(where + ": header length " + std::to_string(header_len) +
                     " runs past the end of the file (" + std::to_string(after_prefix) +
                     " bytes follow the length prefix)");
  }
  if (header_len > kMaxHeaderBytes) {
    throw InputError(where + ": header length " + std::to_string(header_len) +
                     " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  }
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8),
                              static_cast<size_t>(header_len));
  // Depth: header object (0) > tensor entry (1) > shape/offset arrays (2).
  const Json header = parse_strict_json(text, where + " header", /*max_depth=*/3);
  if (!header.is_object()) {
    throw InputError(where + ": header is " + describe_json(header) + ", expected an object");
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file.size() - data_start;

  ShardHeader result;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        throw InputError(where + ": __metadata__ is " + describe_json(value) +
                         ", expected an object of strings");
      }
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) {
          throw InputError(where + ": __metadata__." + key + " is " + describe_json(item) +
                           ", expected a string");
        }
        result.metadata.emplace(key, item.get<std::string>());
      }
      continue;
    }
    if (name.empty()) throw InputError(where + ": header has a tensor with an empty name");
    TensorEntry entry = parse_entry(name, value, data_size, where + ": tensor " + name);
    entry.file_offset += data_start;
    result.tensors.push_back(std::move(entry));
  }

  // Overlap check over the non-empty byte ranges, in file order.
  std::vector<const TensorEntry*> by_offset;
  for (const TensorEntry& entry : result.tensors) {
    if (entry.nbytes > 0) by_offset.push_back(&entry);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->file_offset < b->file_offset;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorEntry& prev = *by_offset[i - 1];
    const TensorEntry& next = *by_offset[i];
    if (next.file_offset < prev.file_offset + prev.nbytes) {
      throw InputError(where + ": tensors " + prev.name + " and " + next.name +
                       " overlap in the data section");
    }
  }
  return result;
}

std::map<std::string, std::string> parse_safetensors_index(std::string_view text,
                                                           std::string_view file_name) {
  const std::string where(file_name);
  const Json index = parse_strict_json(text, where, /*max_depth=*/4);
  if (!index.is_object()) {
    throw InputError(where + " is " + describe_json(index) + ", expected an object");
  }
  const Json& weight_map = require_field(index, "weight_map", where);
  if (!weight_map.is_object()) {
    throw InputError(where + ".weight_map is " + describe_json(weight_map) +
                     ", expected an object of tensor name -> shard file");
  }
  if (weight_map.empty()) throw InputError(where + ".weight_map names no tensors");
  std::map<std::string, std::string> result;
  for (const auto& [tensor, shard] : weight_map.items()) {
    if (!shard.is_string()) {
      throw InputError(where + ".weight_map[\"" + tensor + "\"] is " + describe_json(shard) +
                       ", expected a shard file name");
    }
    const std::string file = shard.get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos || file.find('\0') != std::string::npos) {
      throw InputError(where + ".weight_map[\"" + tensor + "\"] is " + describe_json(shard) +
                       ", expected a plain file name inside the model directory");
    }
    result.emplace(tensor, file);
  }
  return result;
}

TensorStore TensorStore::open(const std::string& dir) {
  namespace fs = std::filesystem;
  TensorStore store;
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;
  // error_code overloads throughout: a symlink loop or an over-long name must surface as
  // InputError (from the open below), not as a filesystem_error. A dangling or looping
  // link named like the index counts as present, so the open reports it.
  std::error_code ec;
  const bool has_index = fs::exists(fs::symlink_status(index_path, ec));
  if (has_index) {
    std::string text;
    {
      MappedFile index_file(index_path.string());
      if (index_file.size() > kMaxIndexBytes) {
        throw InputError(index_path.string() + ": file is " + std::to_string(index_file.size()) +
                         " bytes, expected at most " + std::to_string(kMaxIndexBytes));
      }
      text.assign(reinterpret_cast<const char*>(index_file.data()),
                  static_cast<size_t>(index_file.size()));
    }
    weight_map = parse_safetensors_index(text, "model.safetensors.index.json");
    std::set<std::string> files;
    for (const auto& [tensor, file] : weight_map) files.insert(file);
    for (const std::string& file : files) {
      if (!fs::is_regular_file(root / file, ec)) {
        throw InputError("model.safetensors.index.json names shard " + file +
                         ", which does not exist in " + dir);
      }
      store.shard_files_.push_back(file);
    }
  } else if (fs::is_regular_file(root / "model.safetensors", ec)) {
    store.shard_files_.push_back("model.safetensors");
  } else {
    throw InputError("no model.safetensors.index.json or model.safetensors in " + dir);
  }

  std::unordered_map<std::string, uint32_t> owner;  // tensor -> shard index
  for (size_t s = 0; s < store.shard_files_.size(); ++s) {
    const std::string& file = store.shard_files_[s];
    MappedFile mapped((root / file).string());
    ShardHeader header = parse_safetensors_header(mapped.bytes(), file);
    for (TensorEntry& entry : header.tensors) {
      entry.shard = static_cast<uint32_t>(s);
      auto [it, inserted] = owner.emplace(entry.name, entry.shard);
      if (!inserted) {
        throw InputError("tensor " + entry.name + " appears in two shards: " +
                         store.shard_files_[it->second] + " and " + file);
      }
      if (has_index) {
        auto listed = weight_map.find(entry.name);
        if (listed == weight_map.end()) {
          throw InputError("shard " + file + " holds tensor " + entry.name +
                           ", which model.safetensors.index.json does not list");
        }
        if (listed->second != file) {
          throw InputError("model.safetensors.index.json puts tensor " + entry.name + " in " +
                           listed->second + ", but it is in " + file);
        }
      }
      store.tensors_.push_back(std::move(entry));
    }
    store.shards_.push_back(std::move(mapped));
  }
  for (const auto& [tensor, file] : weight_map) {
    if (owner.find(tensor) == owner.end()) {
      throw InputError("model.safetensors.index.json puts tensor " + tensor + " in " + file +
                       ", but that shard does not contain it");
    }
  }
  std::sort(store.tensors_.begin(), store.tensors_.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  for (size_t i = 0; i < store.tensors_.size(); ++i) {
    store.by_name_.emplace(store.tensors_[i].name, i);
  }
  return store;
}

const TensorEntry* TensorStore::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> TensorStore::bytes(const TensorEntry& entry) const {
  const MappedFile& shard = shards_.at(entry.shard);
  return {shard.data() + entry.file_offset, static_cast<size_t>(entry.nbytes)};
}

uint64_t TensorStore::file_bytes() const {
  uint64_t total = 0;
  for (const MappedFile& shard : shards_) total += shard.size();
  return total;
}

bool TensorStore::prefetch(const std::function<bool(uint64_t, uint64_t)>& progress) const {
  constexpr uint64_t kStep = 64ull << 20;
  constexpr uint64_t kPage = 4096;
  const uint64_t total = file_bytes();
  uint64_t done = 0;
  for (const MappedFile& shard : shards_) {
    const auto* base = reinterpret_cast<const volatile unsigned char*>(shard.data());
    for (uint64_t offset = 0; offset < shard.size(); offset += kStep) {
      const uint64_t length = std::min(kStep, shard.size() - offset);
      // Advice only: a failure (e.g. an unaligned tail) just loses the read-ahead.
      const uintptr_t start = reinterpret_cast<uintptr_t>(shard.data() + offset) & ~(kPage - 1);
      ::madvise(reinterpret_cast<void*>(start), length, MADV_WILLNEED);
      unsigned char sink = 0;
      for (uint64_t page = 0; page < length; page += kPage) sink ^= base[offset + page];
      static_cast<void>(sink);
      done += length;
      if (progress && !progress(done, total)) return false;
    }
  }
  if (progress && total == 0) return progress(0, 0);
  return true;
}

}  // namespace lily

// Streaming safetensors writer: header first, then tensor bytes produced chunk by chunk.
#include "synth/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "core/strict_json.h"

namespace lily {

namespace {

constexpr size_t kChunkBytes = 8u << 20;

std::string header_json(const std::vector<TensorSource>& sorted,
                        const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSource& t : sorted) {
    const uint64_t end = offset + t.nbytes();
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();  // keys sorted: deterministic
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  return text;
}

std::vector<TensorSource> sorted_by_name(std::vector<TensorSource> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorSource& a, const TensorSource& b) { return a.name < b.name; });
  return tensors;
}

}  // namespace

uint64_t TensorSource::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (uint64_t d : shape) n *= d;
  return n;
}

uint64_t safetensors_file_size(const std::vector<TensorSource>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  const std::vector<TensorSource> sorted = sorted_by_name(tensors);
  uint64_t total = 8 + header_json(sorted, metadata).size();
  for (const TensorSource& t : sorted) total += t.nbytes();
  return total;
}

void write_safetensors(const std::string& path, std::vector<TensorSource> tensors,
                       const std::map<std::string, std::string>& metadata) {
  tensors = sorted_by_name(std::move(tensors));
  const std::string header = header_json(tensors, metadata);
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!file) throw std::runtime_error("cannot create " + path);
  auto write = [&](const void* data, size_t size) {
    if (size > 0 && std::fwrite(data, 1, size, file.get()) != size) {
      throw std::runtime_error("write failed on " + path + " (disk full?)");
    }
  };
  unsigned char prefix[8];
  uint64_t len = header.size();
  for (unsigned char& byte : prefix) {  // little-endian u64
    byte = static_cast<unsigned char>(len & 0xff);
    len >>= 8;
  }
  write(prefix, sizeof prefix);
  write(header.data(), header.size());
  std::vector<std::byte> buffer(kChunkBytes);
  for (const TensorSource& t : tensors) {
    uint64_t left = t.nbytes();
    while (left > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kChunkBytes));
      std::span<std::byte> chunk(buffer.data(), n);
      t.produce(chunk);
      write(chunk.data(), n);
      left -= n;
    }
  }
  if (std::fflush(file.get()) != 0) throw std::runtime_error("write failed on " + path);
}

}  // namespace lily

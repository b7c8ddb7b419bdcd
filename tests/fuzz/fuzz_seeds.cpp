// Writes the fuzz seed corpora, derived from a freshly generated tiny checkpoint.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/mapped_file.h"
#include "synth/make_checkpoint.h"
#include "synth/safetensors_writer.h"

namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out.flush()) throw std::runtime_error("cannot write " + path.string());
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

constexpr uint64_t kSeedDataBytes = 4096;  // keeps inputs small, so the fuzzer stays fast

// A small valid safetensors file holding up to `count` of the smallest tensors of
// `shard`, within kSeedDataBytes of data. False if not even one tensor fits.
bool write_small_shard(const lily::MappedFile& shard, const std::string& file, size_t count,
                       const fs::path& out) {
  lily::ShardHeader header = lily::parse_safetensors_header(shard.bytes(), file);
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const auto& a, const auto& b) { return a.nbytes < b.nbytes; });
  std::vector<lily::TensorSource> sources;
  uint64_t total = 0;
  for (size_t i = 0; i < std::min(count, header.tensors.size()); ++i) {
    const lily::TensorEntry entry = header.tensors[i];
    if (total + entry.nbytes > kSeedDataBytes) break;
    total += entry.nbytes;
    const std::byte* bytes = shard.data() + entry.file_offset;
    sources.push_back({entry.name, entry.dtype, entry.shape,
                       [bytes, offset = uint64_t{0}](std::span<std::byte> chunk) mutable {
                         std::memcpy(chunk.data(), bytes + offset, chunk.size());
                         offset += chunk.size();
                       }});
  }
  if (sources.empty()) return false;
  lily::write_safetensors(out.string(), std::move(sources), header.metadata);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: lily_fuzz_seeds OUT_DIR\n");
    return 2;
  }
  const fs::path out(argv[1]);
  const fs::path ckpt = out / "checkpoint";
  fs::remove_all(ckpt);
  lily::MakeCheckpointOptions options;
  options.profile = lily::Profile::tiny;
  options.seed = 1;
  options.out_dir = ckpt.string();
  lily::make_checkpoint(options);

  for (const char* corpus : {"header", "index", "config"}) fs::create_directories(out / corpus);
  // config.json: the tiny file as written, and the production shape's text.
  write_file(out / "config" / "tiny.json", read_file(ckpt / "config.json"));
  write_file(out / "config" / "production.json",
             lily::synthetic_config_json(lily::Profile::production, 248044, 248046));
  // Index: the real one, and one cut down to its first few entries.
  const std::string index = read_file(ckpt / "model.safetensors.index.json");
  write_file(out / "index" / "full.json", index);
  const auto weight_map = lily::parse_safetensors_index(index, "index");
  std::string small = "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {";
  size_t n = 0;
  for (const auto& [tensor, file] : weight_map) {
    if (n++ == 4) break;
    small += (n > 1 ? ", \"" : "\"") + tensor + "\": \"" + file + "\"";
  }
  write_file(out / "index" / "small.json", small + "}}");
  // Headers: per shard, small valid files with its 1, 3 and 6 smallest tensors, and the
  // full header without its data section (valid JSON, every tensor out of range).
  std::vector<std::string> shards;
  for (const auto& [tensor, file] : weight_map) shards.push_back(file);
  std::sort(shards.begin(), shards.end());
  shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
  for (const std::string& file : shards) {
    const lily::MappedFile shard((ckpt / file).string());
    const std::string stem = fs::path(file).stem().string();
    for (size_t count : {size_t{1}, size_t{3}, size_t{6}}) {
      write_small_shard(shard, file, count,
                        out / "header" / (stem + "-" + std::to_string(count) + ".safetensors"));
    }
    uint64_t header_len = 0;
    std::memcpy(&header_len, shard.data(), sizeof header_len);  // little-endian host
    write_file(out / "header" / (stem + "-no-data.safetensors"),
               std::string(reinterpret_cast<const char*>(shard.data()),
                           static_cast<size_t>(8 + header_len)));
  }
  fs::remove_all(ckpt);
  std::printf("seeds written to %s\n", out.string().c_str());
  return 0;
}

// Test-only helpers: fresh copies of a tiny checkpoint and safetensors rewriting.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lily::test {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

inline constexpr const char* kP = "language_model.model.";  // language-model tensor prefix

// Passes when `text` contains every one of `parts`; the failure message shows the text.
::testing::AssertionResult Contains(const std::string& text,
                                    std::initializer_list<std::string_view> parts);

// Whole-file I/O. write_file removes the file first, so a path that is a link never writes
// through to its target.
std::string read_file(const fs::path& path);
void write_file(const fs::path& path, std::string_view bytes);

// A safetensors file: 8-byte little-endian header length, JSON header, data section.
std::string safetensors_bytes(std::string_view header_text, std::string_view data,
                              std::optional<uint64_t> length_override = std::nullopt);

// A safetensors file split into header JSON and data section, for rewriting.
struct ShardFile {
  OrderedJson header;
  std::string data;

  static ShardFile read(const fs::path& path);
  static ShardFile parse(std::string file);
  // Header dumped compactly and padded with spaces to a multiple of 8 bytes.
  std::string serialize() const;
  void write(const fs::path& path) const;  // replaces the file (see write_file)

  std::vector<std::string> tensor_names() const;  // excluding __metadata__
  bool has(const std::string& name) const;
  OrderedJson& entry(const std::string& name);  // fails the test if absent
  std::string tensor_bytes(const std::string& name) const;
  // Consistent edits (add/replace, remove): data offsets are re-laid out, tightly and in
  // the previous order, with the edited tensor last, so the file stays valid.
  void set_tensor(const std::string& name, const std::string& dtype,
                  const std::vector<uint64_t>& shape, const std::string& bytes);
  void remove_tensor(const std::string& name);

 private:
  // Rebuilds the data section without `name`, then appends `replacement` as `name`.
  void relayout(const std::string& name, const std::string* replacement);
};

// The valid tiny checkpoint (seed 1) every test starts from: generated once with
// lily::make_checkpoint, cached next to the test binary and regenerated whenever the
// binary changes (so a changed generator is always picked up).
const fs::path& template_checkpoint();

// A fresh copy of the template in a unique temp directory, removed afterwards. Shards
// are hard links to the template: change files only through write_file, ShardFile::write
// or put_shard/edit_shard_of/set_config/set_index (they replace, never write in place).
class TinyCheckpoint {
 public:
  TinyCheckpoint();
  ~TinyCheckpoint();
  TinyCheckpoint(const TinyCheckpoint&) = delete;
  TinyCheckpoint& operator=(const TinyCheckpoint&) = delete;

  const fs::path& dir() const { return dir_; }
  fs::path path(const std::string& file) const { return dir_ / file; }

  OrderedJson config() const;
  void set_config(const OrderedJson& config) const;
  OrderedJson index() const;
  void set_index(const OrderedJson& index) const;
  std::vector<std::string> shard_files() const;           // sorted, as the index names them
  std::string shard_of(const std::string& tensor) const;  // from the index

  ShardFile shard(const std::string& file) const { return ShardFile::read(path(file)); }
  void put_shard(const std::string& file, const ShardFile& shard) const { shard.write(path(file)); }
  // Reads the shard that holds `tensor`, applies `edit`, writes it back.
  void edit_shard_of(const std::string& tensor, const std::function<void(ShardFile&)>& edit) const;

  // Runs lily::open_checkpoint and returns the InputError message; records a test
  // failure (and returns "") when the checkpoint is accepted. Other exceptions propagate.
  std::string open_error() const;

 private:
  fs::path dir_;
};

// Fresh unique empty directory under the system temp dir, removed afterwards.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// open_checkpoint on `dir`; the InputError message, or "" plus a test failure if accepted.
std::string open_error(const fs::path& dir);

// Little-endian bytes of raw values, for building tensor data.
std::string zero_bytes(uint64_t count);

// The lily binary run as a process with `args` (already shell-quoted): exit code, stdout, stderr.
struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
RunResult run_lily(const std::string& args);

}  // namespace lily::test

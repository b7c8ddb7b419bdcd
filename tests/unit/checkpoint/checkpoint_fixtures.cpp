// Test-only helpers: fresh copies of a tiny checkpoint and safetensors rewriting.
#include "checkpoint_fixtures.h"

#include <sys/wait.h>

#include <cstdlib>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "synth/make_checkpoint.h"

namespace lily::test {

::testing::AssertionResult Contains(const std::string& text,
                                    std::initializer_list<std::string_view> parts) {
  for (std::string_view part : parts) {
    if (text.find(part) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message lacks \"" << part << "\"\n  message: " << text;
    }
  }
  return ::testing::AssertionSuccess();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("test fixture: cannot read " + path.string());
  std::string bytes(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    throw std::runtime_error("test fixture: cannot read " + path.string());
  }
  return bytes;
}

namespace {

void write_parts(const fs::path& path, std::initializer_list<std::string_view> parts) {
  std::error_code ec;
  fs::remove(path, ec);  // never write through a hard link into the template
  std::ofstream out(path, std::ios::binary);
  for (std::string_view part : parts)
    out.write(part.data(), static_cast<std::streamsize>(part.size()));
  if (!out.flush()) throw std::runtime_error("test fixture: cannot write " + path.string());
}

}  // namespace

void write_file(const fs::path& path, std::string_view bytes) {
  write_parts(path, {bytes});
}

std::string safetensors_bytes(std::string_view header_text, std::string_view data,
                              std::optional<uint64_t> length_override) {
  uint64_t length = length_override.value_or(header_text.size());
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>(length & 0xffu));
    length >>= 8;
  }
  out.append(header_text);
  out.append(data);
  return out;
}

ShardFile ShardFile::read(const fs::path& path) {
  return parse(read_file(path));
}

ShardFile ShardFile::parse(std::string file) {
  if (file.size() < 8) throw std::runtime_error("test fixture: shard shorter than 8 bytes");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) {
    length = (length << 8) | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  }
  if (length > file.size() - 8) throw std::runtime_error("test fixture: bad header length");
  ShardFile shard;
  shard.header = OrderedJson::parse(std::string_view(file).substr(8, static_cast<size_t>(length)));
  file.erase(0, 8 + static_cast<size_t>(length));  // in place: the data section is megabytes
  shard.data = std::move(file);
  return shard;
}

namespace {

std::string padded_header(const OrderedJson& header) {
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  return text;
}

}  // namespace

std::string ShardFile::serialize() const {
  return safetensors_bytes(padded_header(header), data);
}

void ShardFile::write(const fs::path& path) const {
  const std::string prefix_and_header = safetensors_bytes(padded_header(header), "");
  write_parts(path, {prefix_and_header, data});
}

std::vector<std::string> ShardFile::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [key, value] : header.items()) {
    if (key != "__metadata__") names.push_back(key);
  }
  return names;
}

bool ShardFile::has(const std::string& name) const {
  return header.contains(name);
}

OrderedJson& ShardFile::entry(const std::string& name) {
  if (!header.contains(name)) {
    ADD_FAILURE() << "test fixture: shard has no tensor " << name;
    throw std::runtime_error("test fixture: missing tensor " + name);
  }
  return header[name];
}

std::string ShardFile::tensor_bytes(const std::string& name) const {
  const OrderedJson& offsets = header.at(name).at("data_offsets");
  const auto begin = offsets[0].get<uint64_t>();
  const auto end = offsets[1].get<uint64_t>();
  return data.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

void ShardFile::relayout(const std::string& name, const std::string* replacement) {
  struct Span {
    std::string name;
    uint64_t begin = 0;
    uint64_t end = 0;
  };
  std::vector<Span> spans;
  for (const std::string& tensor : tensor_names()) {
    if (tensor == name) continue;
    const OrderedJson& offsets = header.at(tensor).at("data_offsets");
    spans.push_back({tensor, offsets[0].get<uint64_t>(), offsets[1].get<uint64_t>()});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  std::string new_data;
  new_data.reserve(data.size() + (replacement != nullptr ? replacement->size() : 0));
  for (const Span& span : spans) {
    const uint64_t begin = new_data.size();
    new_data.append(data, static_cast<size_t>(span.begin),
                    static_cast<size_t>(span.end - span.begin));
    header[span.name]["data_offsets"] = {begin, static_cast<uint64_t>(new_data.size())};
  }
  if (replacement != nullptr) {  // the edited tensor goes last
    const uint64_t begin = new_data.size();
    new_data += *replacement;
    header[name]["data_offsets"] = {begin, static_cast<uint64_t>(new_data.size())};
  }
  data = std::move(new_data);
}

void ShardFile::set_tensor(const std::string& name, const std::string& dtype,
                           const std::vector<uint64_t>& shape, const std::string& bytes) {
  header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {0, 0}}};
  relayout(name, &bytes);
}

void ShardFile::remove_tensor(const std::string& name) {
  relayout(name, nullptr);
  header.erase(name);
}

namespace {

constexpr const char* kManifest = "fixture.manifest";

// "name size mtime" per template file, recorded when the template is made and checked
// whenever it is used: shards are shared through hard links, so a test that wrote into
// one in place (instead of through write_file) must not go unnoticed.
std::string describe_files(const fs::path& dir) {
  std::vector<std::string> lines;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename() == kManifest) continue;
    lines.push_back(entry.path().filename().string() + " " + std::to_string(entry.file_size()) +
                    " " + std::to_string(entry.last_write_time().time_since_epoch().count()));
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& line : lines) out += line + "\n";
  return out;
}

}  // namespace

const fs::path& template_checkpoint() {
  static const fs::path path = [] {
    const fs::path exe = fs::read_symlink("/proc/self/exe");
    const std::string stamp = "tiny-seed1-" + std::to_string(fs::file_size(exe)) + "-" +
                              std::to_string(fs::last_write_time(exe).time_since_epoch().count());
    const fs::path cache = exe.parent_path() / "checkpoint_fixture_cache";
    const fs::path ready = cache / stamp;
    fs::create_directories(cache);
    if (fs::is_directory(ready)) return ready;
    std::error_code ec;
    for (const fs::directory_entry& stale : fs::directory_iterator(cache)) {
      if (stale.path().filename().string().rfind(stamp, 0) != 0) fs::remove_all(stale.path(), ec);
    }
    // Generated under a private name, then renamed into place: a present `ready`
    // directory is always complete, even with tests running in parallel.
    const fs::path staging = cache / (stamp + ".tmp" + std::to_string(::getpid()));
    fs::remove_all(staging, ec);
    MakeCheckpointOptions options;
    options.profile = Profile::tiny;
    options.seed = 1;
    options.out_dir = staging.string();
    make_checkpoint(options);
    write_file(staging / kManifest, describe_files(staging));
    fs::rename(staging, ready, ec);
    if (ec) {
      fs::remove_all(staging, ec);
      if (!fs::is_directory(ready))
        throw std::runtime_error("test fixture: no template checkpoint");
    }
    return ready;
  }();
  return path;
}

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "lily_checkpoint_test_XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("test fixture: mkdtemp failed");
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

TinyCheckpoint::TinyCheckpoint() {
  const fs::path& source = template_checkpoint();
  if (describe_files(source) != read_file(source / kManifest)) {
    throw std::runtime_error("test fixture: the template checkpoint " + source.string() +
                             " changed since it was made: a test wrote into a hard-linked "
                             "shard in place. Fix that test, then delete the directory.");
  }
  std::string pattern = (fs::temp_directory_path() / "lily_checkpoint_test_XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("test fixture: mkdtemp failed");
  }
  dir_ = pattern;
  // Shards (20 MB) are hard-linked, the small files copied: write_file and
  // ShardFile::write replace a file rather than write into it, so the template is safe.
  for (const fs::directory_entry& entry : fs::directory_iterator(source)) {
    if (entry.path().filename() == kManifest) continue;
    const fs::path target = dir_ / entry.path().filename();
    std::error_code ec;
    if (entry.path().extension() == ".safetensors") fs::create_hard_link(entry.path(), target, ec);
    if (entry.path().extension() != ".safetensors" || ec) fs::copy_file(entry.path(), target);
  }
}

TinyCheckpoint::~TinyCheckpoint() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

OrderedJson TinyCheckpoint::config() const {
  return OrderedJson::parse(read_file(path("config.json")));
}

void TinyCheckpoint::set_config(const OrderedJson& config) const {
  write_file(path("config.json"), config.dump(4) + "\n");
}

OrderedJson TinyCheckpoint::index() const {
  return OrderedJson::parse(read_file(path("model.safetensors.index.json")));
}

void TinyCheckpoint::set_index(const OrderedJson& index) const {
  write_file(path("model.safetensors.index.json"), index.dump(4) + "\n");
}

std::vector<std::string> TinyCheckpoint::shard_files() const {
  const OrderedJson index_json = index();
  std::vector<std::string> files;
  for (const auto& [tensor, file] : index_json.at("weight_map").items()) {
    files.push_back(file.get<std::string>());
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

std::string TinyCheckpoint::shard_of(const std::string& tensor) const {
  const OrderedJson index_json = index();
  const OrderedJson& weight_map = index_json.at("weight_map");
  if (!weight_map.contains(tensor)) {
    ADD_FAILURE() << "test fixture: the index does not list " << tensor;
    throw std::runtime_error("test fixture: unknown tensor " + tensor);
  }
  return weight_map.at(tensor).get<std::string>();
}

void TinyCheckpoint::edit_shard_of(const std::string& tensor,
                                   const std::function<void(ShardFile&)>& edit) const {
  const std::string file = shard_of(tensor);
  ShardFile shard = ShardFile::read(path(file));
  edit(shard);
  shard.write(path(file));
}

std::string TinyCheckpoint::open_error() const {
  return test::open_error(dir_);
}

std::string open_error(const fs::path& dir) {
  try {
    open_checkpoint(dir.string());
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "open_checkpoint accepted " << dir;
  return "";
}

std::string zero_bytes(uint64_t count) {
  return std::string(static_cast<size_t>(count), '\0');
}

RunResult run_lily(const std::string& args) {
  TempDir scratch;
  const fs::path out = scratch.path() / "stdout";
  const fs::path err = scratch.path() / "stderr";
  const std::string command = std::string("'") + LILY_BINARY + "' " + args + " >'" + out.string() +
                              "' 2>'" + err.string() + "'";
  const int status = std::system(command.c_str());
  RunResult result;
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  result.out = read_file(out);
  result.err = read_file(err);
  return result;
}

}  // namespace lily::test

// Writes the fuzz seed corpora: from a freshly generated tiny checkpoint, and request bodies.
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

// Chat-completions bodies for fuzz_chat_request: each mode's accepted shapes and a few
// refusals, so that the fuzzer starts from every branch's neighbourhood.
constexpr const char* kChatSeeds[] = {
    R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"user","content":"hi"}]})",
    R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"system","content":"be brief"},)"
    R"({"role":"user","content":"a"},{"role":"assistant","content":"b"},)"
    R"({"role":"user","content":"c"}],"max_tokens":16,"stream":false,"prompt_cache_key":"k"})",
    R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"user","content":"hi"}],"stream":true,)"
    R"("stream_options":{"include_usage":true,"continuous_usage_stats":false},"n":1,)"
    R"("max_completion_tokens":32,"temperature":0.7,"top_p":0.8,"top_k":20,"min_p":0,)"
    R"("presence_penalty":1.5,"frequency_penalty":0,"repetition_penalty":1.05,"seed":-1,)"
    R"("logit_bias":{"0":-100,"42":5.5},"stop":["

","END"],"logprobs":true,"top_logprobs":5,)"
    R"("user":{"id":"u"},"metadata":{"a":"b"},"store":false,"service_tier":"auto",)"
    R"("parallel_tool_calls":false,"tools":[],"tool_choice":"auto","reasoning_effort":"none",)"
    R"("response_format":{"type":"text"},"modalities":["text"],)"
    R"("chat_template_kwargs":{"enable_thinking":false,"preserve_thinking":true},"x":1})",
    R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"system","content":[{"type":"text",)"
    R"("text":"s"}]},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text",)"
    R"("text":"b","cache_control":{"type":"ephemeral"}}],"name":"bob"},{"role":"assistant",)"
    R"("content":null,"reasoning_content":"r","refusal":null,"tool_calls":[]},{"role":"user",)"
    R"("content":"<tool_response>x</tool_response>"}]})",
    R"({"model":"Qwen3.6-35B-A3B","messages":[{"role":"user","content":[{"type":"image_url",)"
    R"("image_url":{"url":"data:,"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],)"
    R"("tools":[{"type":"function","function":{"name":"f","parameters":{}}}],)"
    R"("tool_choice":"required","response_format":{"type":"json_schema"}})",
    R"({"model":"gpt-4o","messages":[],"max_tokens":0,"max_completion_tokens":1,"top_logprobs":1})",
};

// Generated texts for fuzz_output_parser: the first byte is the configuration (1 thinking,
// 2 tool calls, 4 truncated), the rest the text; every marker and failure case nearby.
constexpr const char* kOutputSeeds[] = {
    ("\x03Let me see.\n</think>\n\nSure.\n\n<tool_call>\n<function=f>\n<parameter=s>\nx\n"
     "</parameter>\n<parameter=i>\n5\n</parameter>\n<parameter=o>\n{\"a\": [1]}\n</parameter>\n"
     "</function>\n</tool_call>\n<tool_call>\n<function=g>\n</function>\n</tool_call>"),
    ("\x02<tool_call>\n<function=f>\n<parameter=t>\nnull\n</parameter>\n</parameter>\n"
     "<parameter=u>\ntrue\n</function>"),
    "\x06text <tool_call>\n<function=f>\n<parameter=n>\n1.5",
    "\x01<think>\nhidden <tool_call>\n<function=g>\n</function>\n</tool_call> more",
    "\x08plain content, no markers </think> <tool_call>",
    "\x02<tool_call>\n<function=bad name>\n</function>\n</tool_call>\n<function=f>",
};

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

  for (const char* corpus : {"header", "index", "config", "chat", "output"}) {
    fs::create_directories(out / corpus);
  }
  for (size_t i = 0; i < std::size(kChatSeeds); ++i) {
    write_file(out / "chat" / ("body-" + std::to_string(i) + ".json"), kChatSeeds[i]);
  }
  for (size_t i = 0; i < std::size(kOutputSeeds); ++i) {
    write_file(out / "output" / ("text-" + std::to_string(i)), kOutputSeeds[i]);
  }
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

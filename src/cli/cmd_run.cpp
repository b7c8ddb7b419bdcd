// `lily run`: offline greedy generation from prompt ids; prints one JSON object.
#include <charconv>
#include <cstdio>
#include <iostream>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "cli/backend_choice.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/strict_json.h"
#include "engine/generator.h"
#include "model/qwen36_model.h"
#include "text/chat_format.h"
#include "text/stop_tokens.h"
#include "text/tokenizer.h"

namespace lily {

namespace {

std::vector<int32_t> parse_ids(const std::string& text, uint64_t vocab) {
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    int64_t id = -1;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || id < 0 ||
        static_cast<uint64_t>(id) >= vocab) {
      throw InputError("--prompt-ids item " + std::to_string(ids.size()) + " is \"" + item +
                       "\", expected a token id in [0, " + std::to_string(vocab) + ")");
    }
    ids.push_back(static_cast<int32_t>(id));
    begin = end + 1;
  }
  return ids;
}

}  // namespace

int cmd_run(const std::vector<std::string>& argv) {
  const std::vector<OptionSpec> spec = {
      {"model", true, "checkpoint directory (required)"},
      {"prompt-ids", true, "comma-separated prompt token ids"},
      {"prompt", true, "a user message, rendered through the chat format (thinking off)"},
      {"max-tokens", true, "tokens to generate (default 16)"},
      {"top-logits", true, "also print the K largest logits of every step (default 0)"},
      {"max-seq", true, "state capacity in tokens, prompt + generated (default 4096)"},
      {"device", true, "auto, cpu or cuda (default auto: CUDA when usable, else the CPU)"},
      {"threads", true, "CPU threads (default: all cores; CPU backend only)"},
      {"kv-cache", true, "KV cache element type, f32, bf16 or int8 (default f32; bf16 halves the KV bytes, int8 a quarter plus a scale per row)"},
      cuda_disable_option(),
      cpu_precision_option(),
      {"ignore-eos", false, "do not stop at the checkpoint's stop tokens"},
  };
  const Args args(argv, spec);
  check_device_option(args);
  check_kv_cache_option(args);
  if (args.has("prompt-ids") == args.has("prompt")) {
    throw InputError("give exactly one of --prompt-ids and --prompt");
  }
  const uint64_t max_tokens = args.uint_or("max-tokens", 16, 0, 1u << 20);
  const uint64_t top = args.uint_or("top-logits", 0, 0, 1024);
  const uint64_t max_seq = args.uint_or("max-seq", 4096, 1, 262144);

  const std::string dir = args.required("model");
  const std::unique_ptr<Checkpoint> checkpoint = open_checkpoint(dir);
  const Tokenizer tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
  std::vector<int32_t> prompt;
  if (args.has("prompt")) {
    const std::string rendered = render_chat({ChatMessage{ChatRole::user, args.required("prompt")}});
    for (uint32_t id : tokenizer.encode(rendered)) prompt.push_back(static_cast<int32_t>(id));
  } else {
    prompt = parse_ids(args.required("prompt-ids"), checkpoint->config.shape.vocab_size);
  }
  if (prompt.size() + max_tokens > max_seq) {
    throw InputError("prompt (" + std::to_string(prompt.size()) + " tokens) + --max-tokens " +
                     std::to_string(max_tokens) + " exceed --max-seq " + std::to_string(max_seq));
  }
  load_weights(*checkpoint);
  BackendChoice choice = choose_backend(args, *checkpoint, max_seq, 1);
  const std::unique_ptr<Backend> backend = std::move(choice.backend);
  Qwen36Model model(*checkpoint, *backend, choice.chunk, upload_progress());
  announce_decode_path(model);
  announce_memory(*backend, checkpoint->store.file_bytes());
  DecodeState state(*backend, checkpoint->config.shape, static_cast<int64_t>(max_seq),
                    choice.kv_cache);
  GenerationOptions options;
  options.max_tokens = static_cast<int64_t>(max_tokens);
  options.top_logits = static_cast<int>(top);
  if (!args.has("ignore-eos")) {
    const std::string config_path = dir + "/tokenizer_config.json";
    const Json tokenizer_config = read_strict_json_file(config_path, 16u << 20, 64);
    for (uint32_t id : stop_token_ids(tokenizer, tokenizer_config,
                                      checkpoint->config.eos_token_ids, config_path)) {
      options.stop_tokens.insert(static_cast<int32_t>(id));
    }
  }
  const GenerationResult result = generate(model, state, prompt, options);

  std::vector<uint32_t> token_ids(result.tokens.begin(), result.tokens.end());
  Json out = {{"prompt_ids", prompt}, {"tokens", result.tokens},
              {"finish_reason", result.finish_reason},
              {"text", tokenizer.decode(token_ids, /*skip_special_tokens=*/true)}};
  if (top > 0) {
    Json steps = Json::array();
    for (const auto& step : result.steps) {
      Json pairs = Json::array();
      for (const auto& [id, logit] : step) pairs.push_back({id, logit});
      steps.push_back(pairs);
    }
    out["steps"] = steps;
  }
  std::cout << out.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  // Rough figures only; measurements are `lily bench`'s job.
  const double decode_steps = static_cast<double>(result.tokens.size()) - 1.0;
  std::fprintf(stderr,
               "prefill %zu tokens in %.3f s (%.1f tok/s); decode %.0f steps in %.3f s "
               "(%.1f tok/s); %s backend, %d threads, KV cache %s\n",
               prompt.size(), result.prefill_seconds,
               static_cast<double>(prompt.size()) / result.prefill_seconds, decode_steps,
               result.decode_seconds,
               decode_steps > 0 ? decode_steps / result.decode_seconds : 0.0,
               backend->name().c_str(), backend->threads(), kv_dtype_name(choice.kv_cache));
  return 0;
}

}  // namespace lily

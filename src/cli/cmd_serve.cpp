// `lily serve`: bind, load (with progress), serve the OpenAI-compatible API, stop gracefully on a signal.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include <boost/asio/signal_set.hpp>

#include "backend/backend.h"
#include "backend/fault_injection.h"
#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "cli/backend_choice.h"
#include "cli/commands.h"
#include "cli/demo_checkpoint.h"
#include "core/error.h"
#include "core/strict_json.h"
#include "engine/engine.h"
#include "engine/session_cache.h"
#include "model/qwen36_model.h"
#include "model/state_snapshot.h"
#include "server/api_handler.h"
#include "server/auth.h"
#include "server/http_server.h"
#include "core/load_progress.h"
#include "server/request_log.h"
#include "server/sampling_config.h"
#include "server/test_script.h"
#include "text/stop_tokens.h"
#include "text/tokenizer.h"

namespace lily {

namespace {

// Exit status of a server whose device failed (a DeviceFault): a supervisor restarts it.
constexpr int kExitDeviceFailed = 3;
// How long a failed server keeps answering (/health 503 "failed", completions 503) before it
// exits, so that load balancers and health checks see why it goes away.
constexpr auto kFailedExitDelay = std::chrono::seconds(2);

// Signals and a device failure arrive on other threads; the main thread waits here for the
// first one.
class StopRequest {
 public:
  void request() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requested_ = true;
    }
    changed_.notify_all();
  }
  void request_for_device_failure() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requested_ = true;
      device_failed_ = true;
    }
    changed_.notify_all();
  }
  bool requested() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return requested_;
  }
  bool device_failed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return device_failed_;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return requested_; });
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool requested_ = false;
  bool device_failed_ = false;
};

}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  const std::vector<OptionSpec> spec = {
      {"model", true, "checkpoint directory (default: the demo checkpoint)"},
      {"bind", true, "HOST:PORT to listen on (default 127.0.0.1:8000; port 0 picks one)"},
      {"max-seq", true, "prompt + completion capacity in tokens (default 4096)"},
      {"device", true, "auto, cpu or cuda (default auto: CUDA when usable, else the CPU)"},
      {"threads", true, "CPU inference threads (default: all cores; CPU backend only)"},
      {"kv-cache", true,
       "KV cache element type, f32, bf16 or int8 (default f32; bf16 halves the state's KV bytes, int8 quarters them plus a scale per row)"},
      cuda_disable_option(),
      cpu_precision_option(),
      {"queue", true, "requests waiting behind the one running before 429 (default 16)"},
      {"http-threads", true, "threads parsing and tokenising requests (default 4)"},
      {"api-key", true, "require Authorization: Bearer KEY (default: none)"},
      {"no-auth", false, "serve a non-loopback address without an API key"},
      {"read-timeout", true, "seconds a client has to send a whole request (default 30)"},
      {"stream-buffer", true,
       "bytes a streamed answer may queue for a slow client before it is cancelled (default "
       "1048576)"},
      {"strict", false, "Lily's contract exactly: no streaming, greedy only, unknown fields refused"},
      {"sampling-defaults", true,
       "greedy (default) or checkpoint: the checkpoint's generation_config.json fills the sampling "
       "fields a request leaves out"},
      {"temperature", true, "default temperature for requests that set none, [0, 2]"},
      {"top-p", true, "default top_p, (0, 1]"},
      {"top-k", true, "default top_k, >= 0 (0: off)"},
      {"min-p", true, "default min_p, [0, 1]"},
      {"presence-penalty", true, "default presence_penalty, [-2, 2]"},
      {"frequency-penalty", true, "default frequency_penalty, [-2, 2]"},
      {"repetition-penalty", true, "default repetition_penalty, (0, 2]"},
      {"cache-snapshots", true,
       "session-cache snapshots kept in all, at message boundaries (default 8, 0 with --strict; "
       "0: strict-prefix reuse only; about 63 MiB each for the full model)"},
      {"thinking", true,
       "off (default) or on: whether a request that does not choose thinks first (openai mode)"},
      {"reasoning-budget", true,
       "reasoning tokens a thinking request may use before </think> is forced (default: no "
       "limit; a request's reasoning_budget overrides it)"},
      {"test-script", true,
       "TEST ONLY: a JSON file of rules forcing scripted answers (docs/server.md)", true},
      {"test-fault", true,
       "TEST ONLY: SITE:KIND[:SKIP] makes one decode op fail (site step, capture or replay; "
       "kind error or device; docs/server.md, \"Failures\")",
       true},
      {"config", true, "a config file of option = value lines, TOML/INI (docs/cli.md)"},
  };
  const auto started = std::chrono::steady_clock::now();  // for /metrics' model load time
  // Every option also from LILY_<NAME> and the config file (precedence in docs/cli.md).
  const Args args(argv, spec, ArgSources{"LILY_", "config"});
  check_device_option(args);
  check_kv_cache_option(args);
  const uint64_t cli_max_seq = args.uint_or("max-seq", 4096, 1, 262144);
  const uint64_t queue = args.uint_or("queue", Engine::kDefaultQueueCapacity, 0, 1u << 20);
  const uint64_t http_threads = args.uint_or("http-threads", 4, 1, 256);
  const uint64_t read_timeout = args.uint_or("read-timeout", 30, 1, 3600);
  const std::string bind_address = args.get("bind").value_or("127.0.0.1:8000");
  const std::optional<std::string> api_key = args.get("api-key");
  const bool no_auth = args.has("no-auth");

  std::optional<std::string> model_dir = args.get("model");
  const bool demo = !model_dir.has_value();

  const bool strict = args.has("strict");
  // --strict passes no snapshot points (Lily's strict-prefix reuse), so it keeps none.
  if (strict && args.has("cache-snapshots") && args.uint_or("cache-snapshots", 0, 0, 64) != 0) {
    throw InputError(args.source("cache-snapshots") +
                     " has no effect with --strict (Lily's strict-prefix cache takes no "
                     "snapshots); leave it out or pass 0");
  }
  const auto cache_snapshots = static_cast<size_t>(args.uint_or(
      "cache-snapshots",
      strict ? 0 : SessionCache::kDefaultEntries * SessionCache::kDefaultSnapshotsPerEntry, 0, 64));
  const std::string defaults_source = args.get("sampling-defaults").value_or("greedy");
  if (defaults_source != "greedy" && defaults_source != "checkpoint") {
    throw InputError(args.source("sampling-defaults") + " must be greedy or checkpoint, found \"" +
                     defaults_source + "\"");
  }
  // Explicit flags; the checkpoint's values (read once the model directory is known) fill
  // only what these leave out.
  SamplingDefaults flag_defaults;
  auto number_flag = [&args](const char* name, double min, double max) -> std::optional<double> {
    const std::optional<std::string> text = args.get(name);
    if (!text) return std::nullopt;
    return parse_sampling_flag(args.source(name), *text, min, max);
  };
  flag_defaults.temperature = number_flag("temperature", 0, 2);
  flag_defaults.top_p = number_flag("top-p", 1e-9, 1);
  flag_defaults.min_p = number_flag("min-p", 0, 1);
  flag_defaults.presence_penalty = number_flag("presence-penalty", -2, 2);
  flag_defaults.frequency_penalty = number_flag("frequency-penalty", -2, 2);
  flag_defaults.repetition_penalty = number_flag("repetition-penalty", 1e-9, 2);
  if (args.has("top-k")) {
    flag_defaults.top_k = static_cast<int64_t>(args.uint_or("top-k", 0, 0, 1u << 30));
  }
  if (strict && (flag_defaults.any() || defaults_source != "greedy")) {
    throw InputError("--strict decodes greedily (Lily's contract); it cannot be combined with "
                     "--sampling-defaults checkpoint or a sampling flag");
  }
  const std::string thinking_flag = args.get("thinking").value_or("off");
  if (thinking_flag != "off" && thinking_flag != "on") {
    throw InputError(args.source("thinking") + " must be off or on, found \"" + thinking_flag +
                     "\"");
  }
  if (strict && (thinking_flag == "on" || args.has("reasoning-budget") ||
                 args.has("test-script"))) {
    throw InputError("--strict is Lily's contract (thinking off); it cannot be combined with "
                     "--thinking on, --reasoning-budget or --test-script");
  }
  const int64_t reasoning_budget =
      args.has("reasoning-budget")
          ? static_cast<int64_t>(args.uint_or("reasoning-budget", 0, 0, uint64_t{1} << 40))
          : -1;
  std::vector<TestScriptRule> test_script;
  if (const std::optional<std::string> path = args.get("test-script")) {
    test_script = read_test_script(*path);
  }
  std::optional<FaultInjection> test_fault;
  if (const std::optional<std::string> fault_spec = args.get("test-fault")) {
    test_fault = parse_fault_injection(*fault_spec);
  }

  ApiConfig config;
  config.api_key = api_key;
  config.limits.mode = strict ? ApiMode::strict : ApiMode::openai;
  ApiHandler handler(config);
  HttpLimits limits;
  limits.read_timeout = std::chrono::seconds(read_timeout);
  limits.max_stream_buffer_bytes =
      static_cast<size_t>(args.uint_or("stream-buffer", 1048576, 1024, uint64_t{1} << 32));
  HttpServer server(handler, limits, write_log_line);
  server.set_observer([&handler](std::string_view path, int status, double seconds) {
    handler.metrics().observe_request(path, status, seconds);
  });
  handler.set_in_flight_source([&server] { return static_cast<uint64_t>(server.in_flight()); });

  // Bind first (a taken port fails before any loading), then load while /health says so.
  try {
    server.bind(bind_address);
  } catch (const InputError& error) {
    // The transport's message says --bind; name the variable or config key that set it.
    if (args.source("bind") == "--bind") throw;
    throw InputError(args.source("bind") + ": " + error.what());
  }
  const auto endpoint = server.local_endpoint();
  check_auth_configuration(endpoint.address().is_loopback(), api_key, no_auth, bind_address);
  // Appended piece by piece: GCC 12 at -O2/-O3 raises a false -Wrestrict on
  // `"literal" + std::string&&` (the inlined insert at position 0).
  const std::string host = endpoint.address().to_string();
  std::string url = "http://";
  url += endpoint.address().is_v6() ? "[" + host + "]" : host;
  url += ':';
  url += std::to_string(endpoint.port());

  std::signal(SIGPIPE, SIG_IGN);
  StopRequest stop;
  boost::asio::signal_set signals(server.io(), SIGINT, SIGTERM);
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& ec, int number) {
        if (ec) return;
        if (stop.requested()) {
          write_log_line("second signal: exiting now");
          std::_Exit(130);
        }
        write_log_line(std::string("received ") + (number == SIGINT ? "SIGINT" : "SIGTERM") +
                       ": finishing the request in flight, refusing new ones");
        stop.request();
        signals.async_wait(on_signal);
      };
  signals.async_wait(on_signal);
  server.start(static_cast<int>(http_threads));
  std::fprintf(stderr, "listening on %s (loading the model; /health answers 503 until ready)\n",
               url.c_str());

  if (demo) {
    model_dir = ensure_demo_checkpoint();
    std::fputs(demo_banner(*model_dir).c_str(), stderr);
  }
  const std::string dir = *model_dir;
  const std::unique_ptr<Checkpoint> checkpoint = open_checkpoint(dir);
  {
    LoadProgress progress(stderr, ::isatty(STDERR_FILENO) != 0, "loading weights");
    const bool loaded = checkpoint->store.prefetch([&](uint64_t done, uint64_t total) {
      progress.update(done, total);
      return !stop.requested();
    });
    if (!loaded) {
      std::fputs("\nstopped while loading\n", stderr);
      server.stop(std::chrono::milliseconds(0));
      server.join();
      return 0;
    }
    progress.finish();
  }
  const uint64_t max_seq = clamp_max_seq(cli_max_seq, checkpoint->config.shape.max_position_embeddings);
  // The session cache holds two states; one more is the headroom of the memory check.
  const uint64_t snapshot_bytes = StateSnapshot::bytes(checkpoint->config.shape);
  BackendChoice choice =
      choose_backend(args, *checkpoint, max_seq, 3, cache_snapshots * snapshot_bytes);
  const std::unique_ptr<Backend> backend = std::move(choice.backend);
  if (test_fault) {
    if (test_fault->site != FaultSite::step && !backend->can_capture()) {
      throw InputError(std::string("--test-fault ") + fault_site_name(test_fault->site) +
                       " needs a backend with graph capture (--device cuda); the " +
                       backend->name() + " backend runs every decode step eagerly (site step)");
    }
    backend->arm_fault(*test_fault);
    std::fprintf(stderr, "TEST FAULT ARMED: a decode op fails at %s (--test-fault)\n",
                 fault_site_name(test_fault->site));
  }
  Qwen36Model model(*checkpoint, *backend, choice.chunk, upload_progress());
  announce_decode_path(model);
  announce_memory(*backend, checkpoint->store.file_bytes());
  const Tokenizer tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
  const std::string tokenizer_config_path = dir + "/tokenizer_config.json";
  const Json tokenizer_config = read_strict_json_file(tokenizer_config_path, 16u << 20, 64);
  SamplingDefaults defaults = flag_defaults;
  if (defaults_source == "checkpoint") {
    const SamplingDefaults file = read_generation_config(dir + "/generation_config.json");
    if (!defaults.temperature) defaults.temperature = file.temperature;
    if (!defaults.top_p) defaults.top_p = file.top_p;
    if (!defaults.top_k) defaults.top_k = file.top_k;
    if (!defaults.min_p) defaults.min_p = file.min_p;
    if (!defaults.repetition_penalty) defaults.repetition_penalty = file.repetition_penalty;
  }
  ServingModel serving;
  serving.sampling_defaults = defaults;
  serving.thinking = thinking_flag == "on";
  serving.reasoning_budget = reasoning_budget;
  const bool serving_test_script_empty = test_script.empty();
  serving.test_script = std::move(test_script);
  // A thinking request that chooses no sampling samples as the checkpoint recommends.
  if (std::filesystem::exists(dir + "/generation_config.json")) {
    serving.thinking_sampling = read_generation_config(dir + "/generation_config.json");
  }
  for (uint32_t id : stop_token_ids(tokenizer, tokenizer_config, checkpoint->config.eos_token_ids,
                                    tokenizer_config_path)) {
    serving.stop_tokens.insert(static_cast<int32_t>(id));
  }
  SessionCache cache(*backend, checkpoint->config.shape, static_cast<int64_t>(max_seq),
                     SessionCache::kDefaultEntries, cache_snapshots, choice.kv_cache);
  constexpr double kMiB = 1024.0 * 1024.0;
  std::fprintf(stderr,
               "session cache: %zu states of %.1f MiB (KV cache %s), %zu snapshots of %.1f MiB "
               "(--cache-snapshots)\n",
               SessionCache::kDefaultEntries,
               static_cast<double>(DecodeState::bytes(checkpoint->config.shape,
                                                      static_cast<int64_t>(max_seq),
                                                      choice.kv_cache)) / kMiB,
               kv_dtype_name(choice.kv_cache),
               cache_snapshots, static_cast<double>(snapshot_bytes) / kMiB);
  // A lost device ends the process: the engine has failed what it held, the handler turns
  // new requests away, and the main thread exits non-zero for a supervisor to restart it.
  Engine engine(model, cache, queue, &tokenizer, [&handler, &stop](const std::string& what) {
    write_log_line("fatal: the device failed (" + what + "); exiting with status " +
                   std::to_string(kExitDeviceFailed) + " for a supervisor to restart the server");
    handler.set_failed();
    stop.request_for_device_failure();
  });
  serving.tokenizer = &tokenizer;
  serving.backend = backend.get();
  serving.engine = &engine;
  serving.max_seq = max_seq;
  handler.metrics().set_model_load_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  handler.set_ready(std::move(serving));
  std::fprintf(stderr,
               "serving %s on %s (%s backend, %d threads, max_seq %llu, queue %llu, %s API, "
               "sampling defaults: %s, thinking %s)\n",
               std::string(kServedModelId).c_str(), url.c_str(), backend->name().c_str(),
               backend->threads(), static_cast<unsigned long long>(max_seq),
               static_cast<unsigned long long>(queue), strict ? "strict" : "openai",
               defaults.describe().c_str(), thinking_flag.c_str());
  if (!serving_test_script_empty) {
    std::fputs("TEST SCRIPT ACTIVE: matching requests get scripted answers (--test-script)\n",
               stderr);
  }
  if (demo) std::fputs(demo_banner(dir).c_str(), stderr);

  stop.wait();
  const bool device_failed = stop.device_failed();
  if (device_failed) std::this_thread::sleep_for(kFailedExitDelay);
  handler.set_stopping();  // a failed server stays failed
  server.mark_stopping();  // the in-flight response closes its connection
  engine.shutdown();  // the request in flight finishes; queued ones get 503
  server.stop(std::chrono::milliseconds(5000));
  server.join();
  if (device_failed) {
    std::fputs("stopped: the device failed\n", stderr);
    return kExitDeviceFailed;
  }
  std::fputs("stopped\n", stderr);
  return 0;
}

}  // namespace lily

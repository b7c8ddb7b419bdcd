// Builds the `lily bench` JSON report: Lily's fields plus bandwidth and compute accounting.
#include "bench/bench_report.h"

#include <cstdio>

#include "bench/workload.h"
#include "core/build_info.h"

namespace lily {

namespace {

Json traffic_json(const DecodeTraffic& t) {
  return Json{{"dense_weights", t.dense_weight_bytes},
              {"routed_experts", t.routed_expert_bytes},
              {"shared_expert", t.shared_expert_bytes},
              {"embedding_row", t.embedding_row_bytes},
              {"kv_read", t.kv_read_bytes},
              {"kv_write", t.kv_write_bytes},
              {"delta_net_state", t.delta_net_state_bytes},
              {"total", t.total()}};
}

// {"pdl": true, "stream_gemv": true, ...} (every path of kCudaPaths), or null for the CPU.
Json cuda_options_json(const std::optional<CudaOptions>& options) {
  if (!options) return nullptr;
  Json out = Json::object();
  for (const CudaPath& path : kCudaPaths) out[std::string(path.json_key)] = (*options).*path.on;
  return out;
}

}  // namespace

Json bench_report(const BenchContext& context, const BenchMeasurement& m,
                  const Checkpoint& checkpoint) {
  const BuildInfo& build = build_info();
  const int64_t prompt_len = context.options.prompt_len;
  const int64_t steps = context.options.decode_steps;

  // The decode timer covers steps 2 .. steps+1 on a synchronous backend (the step that feeds
  // d_i runs at position prompt_len + i, attending over that many earlier tokens); sum the
  // traffic of exactly those steps. On a pipelined device backend the timed steps are one
  // position earlier: a difference of one token of KV per step, negligible.
  double decode_bytes = 0;
  for (int64_t i = 1; i <= steps; ++i) {
    decode_bytes +=
        static_cast<double>(decode_traffic(checkpoint, prompt_len + i, context.kv_cache).total());
  }
  const DecodeTraffic mid =
      decode_traffic(checkpoint, prompt_len + (steps + 1) / 2, context.kv_cache);
  const double achieved = decode_bytes / m.decode_seconds;
  const double copy = context.copy_bytes_per_second;

  const double prompt_flops = prefill_flops(checkpoint, prompt_len);
  const double prefill_rate = prompt_flops / m.prefill_seconds;

  Json step_seconds = Json::array();
  for (double s : m.step_seconds) step_seconds.push_back(s);
  Json report = {
      {"schema_version", 1},
      {"schema", "lily-bench/1"},
      {"meta",
       {{"engine", "lily"},
        {"commit", build.commit},
        {"dirty", build.dirty},
        {"build_type", build.build_type},
        {"compiler", build.compiler},
        {"build_flags", build.flags},
        {"harness", "lily bench"}}},
      {"device", {{"backend", context.backend}, {"name", context.device}, {"threads", context.threads},
                  {"decode_path", context.decode_path},
                  {"backend_bytes", context.backend_bytes}, {"code_path", context.code_path},
                  {"cuda_options", cuda_options_json(context.cuda_options)}}},
      {"workload",
       {{"prompt_len", prompt_len},
        {"prompt_kind", kPromptKind},
        {"decode_steps", steps},
        {"decode_mode", "production_depth2_pipelined"},
        {"kv_cache", kv_dtype_name(context.kv_cache)},
        {"token_choice", context.options.sampling ? "sampled: temperature 1, top_p 0.95, top_k 20, seed 0"
                                                   : "argmax"},
        {"model_dir", context.model_dir},
        {"profile", context.profile},
        {"checkpoint_bytes", context.checkpoint_bytes}}},
      {"results",
       {{"prefill",
         {{"wall_secs", m.prefill_seconds},
          {"tok_s", static_cast<double>(prompt_len) / m.prefill_seconds},
          {"first_token_id", m.first_token}}},
        {"decode",
         {{"wall_secs", m.decode_seconds},
          {"tok_s", static_cast<double>(steps) / m.decode_seconds},
          {"step_wall_secs", step_seconds},
          {"token_digest", digest_hex(m.digest)},
          {"token_ids", m.tokens}}}}},
      {"bandwidth",
       {{"bytes_per_step_at_mid_context", traffic_json(mid)},
        {"decode_bytes_total", decode_bytes},
        {"achieved_bytes_per_s", achieved},
        {"copy_bytes_per_s", copy},
        {"utilisation", copy > 0 ? achieved / copy : 0.0},
        {"floor_tok_s", copy > 0 ? copy / static_cast<double>(mid.total()) : 0.0}}},
      {"compute",
       {{"prefill_flops", prompt_flops},
        {"prefill_flop_s", prefill_rate},
        {"matmul_flop_s", context.matmul_flops_per_second},
        {"utilisation", context.matmul_flops_per_second > 0
                            ? prefill_rate / context.matmul_flops_per_second
                            : 0.0}}},
  };
  return report;
}

std::string bench_summary_line(const Json& r) {
  const Json& prefill = r["results"]["prefill"];
  const Json& decode = r["results"]["decode"];
  const Json& bw = r["bandwidth"];
  char line[512];
  std::snprintf(line, sizeof line,
                "prefill: %lld tok in %.3fs (%.1f tok/s) | decode: %lld steps in %.3fs (%.1f tok/s) | "
                "digest=%s | %.1f GB/s of %.1f GB/s copy (%.0f%%), floor %.1f tok/s | KV cache %s",
                static_cast<long long>(r["workload"]["prompt_len"].get<int64_t>()),
                prefill["wall_secs"].get<double>(), prefill["tok_s"].get<double>(),
                static_cast<long long>(r["workload"]["decode_steps"].get<int64_t>()),
                decode["wall_secs"].get<double>(), decode["tok_s"].get<double>(),
                decode["token_digest"].get<std::string>().c_str(),
                bw["achieved_bytes_per_s"].get<double>() / 1e9,
                bw["copy_bytes_per_s"].get<double>() / 1e9, bw["utilisation"].get<double>() * 100,
                bw["floor_tok_s"].get<double>(),
                r["workload"]["kv_cache"].get<std::string>().c_str());
  return line;
}

}  // namespace lily

// lily bench pieces: synthetic prompt, FNV digest, traffic accounting vs the shape, run determinism.
#include <gtest/gtest.h>

#include <vector>

#include "../model/tiny_model_fixture.h"
#include "bench/bench_report.h"
#include "bench/bench_runner.h"
#include "bench/decode_traffic.h"
#include "bench/workload.h"
#include "engine/generator.h"
#include "model/decode_state.h"

namespace lily {
namespace {

// Expected values computed independently with Python integers:
//   [((i * 2654435761) % 2**32) % V for i in ...]
TEST(BenchWorkload, SyntheticPromptIsTheGoldenRatioHash) {
  EXPECT_EQ(synthetic_prompt(6, 248320), (std::vector<int32_t>{0, 143281, 13666, 156947, 27332, 146037}));
  const std::vector<int32_t> tiny = synthetic_prompt(65538, 4096);
  EXPECT_EQ(tiny[1], 2481);
  EXPECT_EQ(tiny[2], 866);
  EXPECT_EQ(tiny[1000], 2920);
  EXPECT_EQ(tiny[65537], 2481);  // 65537 * 2654435761 wraps mod 2^32
}

// Python: h = 0xcbf29ce484222325; for id: h = ((h ^ id) * 0x100000001b3) % 2**64
TEST(BenchWorkload, DigestIsFnv1a64OverWholeU32Values) {
  EXPECT_EQ(digest_hex(token_digest({})), "cbf29ce484222325");
  EXPECT_EQ(digest_hex(token_digest(std::vector<int32_t>{0})), "af63bd4c8601b7df");
  EXPECT_EQ(digest_hex(token_digest(std::vector<int32_t>{1, 2, 3})), "d0aa6218672cf5ab");
  EXPECT_EQ(digest_hex(token_digest(std::vector<int32_t>{248319, 7, 4065})), "3cb829043c66a17e");
}

// The tiny shape's traffic from first principles (docs/checkpoint.md, *The tiny test profile*):
// Q4 weights cost 0.5 byte + 4 bytes of scale/bias per 64 weights = 0.5625 byte per weight;
// Q8 1.0625.
TEST(DecodeTraffic, TinyProfileMatchesTheShape) {
  const Checkpoint& ck = testing::tiny_checkpoint(5);
  const ModelShape& s = ck.config.shape;
  const double q4 = 0.5 + 4.0 / 64.0;
  const uint64_t layers = s.num_layers;
  const uint64_t attention_layers = layers / 4;
  const DecodeTraffic t = decode_traffic(ck, 100, KvDtype::f32);
  const double routed = static_cast<double>(layers * s.num_experts_per_tok * 3 *
                                            s.moe_intermediate_size * s.hidden_size) * q4;
  EXPECT_EQ(static_cast<double>(t.routed_expert_bytes), routed);
  const double shared = static_cast<double>(layers * 3 * s.shared_expert_intermediate_size *
                                            s.hidden_size) * q4;
  EXPECT_EQ(static_cast<double>(t.shared_expert_bytes), shared);
  EXPECT_EQ(static_cast<double>(t.embedding_row_bytes), static_cast<double>(s.hidden_size) * q4);
  const uint64_t kv_per_token = attention_layers * 2 * s.num_key_value_heads * s.head_dim * 4;
  EXPECT_EQ(t.kv_read_bytes, 100 * kv_per_token);
  EXPECT_EQ(t.kv_write_bytes, kv_per_token);
  const uint64_t state = s.linear_num_value_heads * s.linear_key_head_dim * s.linear_value_head_dim +
                         (s.linear_conv_kernel_dim - 1) * s.gdn_conv_channels();
  EXPECT_EQ(t.delta_net_state_bytes, (layers - attention_layers) * 2 * state * 4);
  // lm_head alone is in the dense part: vocab x hidden at 4 bits.
  EXPECT_GT(static_cast<double>(t.dense_weight_bytes), static_cast<double>(s.vocab_size * s.hidden_size) * q4);
  EXPECT_EQ(decode_traffic(ck, 101, KvDtype::f32).total() - t.total(), kv_per_token);
  // A bf16 KV cache moves half the KV bytes and nothing else changes.
  const DecodeTraffic b = decode_traffic(ck, 100, KvDtype::bf16);
  EXPECT_EQ(b.kv_read_bytes, 100 * kv_per_token / 2);
  EXPECT_EQ(b.kv_write_bytes, kv_per_token / 2);
  EXPECT_EQ(t.total() - b.total(), 101 * kv_per_token / 2);
}

TEST(DecodeTraffic, PrefillFlopsIsTheSumOfTokenFlops) {
  const Checkpoint& ck = testing::tiny_checkpoint(5);
  double sum = 0;
  for (int64_t p = 0; p < 37; ++p) sum += token_flops(ck, p);
  EXPECT_NEAR(prefill_flops(ck, 37), sum, sum * 1e-12);
  EXPECT_GT(token_flops(ck, 1000), token_flops(ck, 0));
}

TEST(BenchRun, DecodeTokensAreTheGreedyContinuationAndRunsRepeat) {
  testing::TinyModel& tiny = testing::tiny_model();
  BenchOptions options;
  options.prompt_len = 40;
  options.decode_steps = 12;
  DecodeState state(*tiny.backend, tiny.checkpoint.config.shape, 40 + 12 + 1);
  const BenchMeasurement a = run_bench(tiny.model, state, options);
  const BenchMeasurement b = run_bench(tiny.model, state, options);
  EXPECT_EQ(a.digest, b.digest);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.tokens.size(), 12u);
  ASSERT_EQ(a.step_seconds.size(), 12u);
  EXPECT_EQ(a.digest, token_digest(a.tokens));
  EXPECT_GT(a.prefill_seconds, 0.0);
  EXPECT_GT(a.decode_seconds, 0.0);

  // The same prompt through the plain generator (no slots): first token, then the 12.
  const std::vector<int32_t> prompt = synthetic_prompt(40, tiny.checkpoint.config.shape.vocab_size);
  DecodeState fresh(*tiny.backend, tiny.checkpoint.config.shape, 64);
  GenerationOptions greedy;
  greedy.max_tokens = 13;
  const GenerationResult expected = generate(tiny.model, fresh, prompt, greedy);
  ASSERT_EQ(expected.tokens.size(), 13u);
  EXPECT_EQ(a.first_token, expected.tokens[0]);
  EXPECT_EQ(a.tokens, std::vector<int32_t>(expected.tokens.begin() + 1, expected.tokens.end()));
}

// A pipelined step feeds the token the submit just before it produced (it stays on the
// backend), so submit_decode must name that submit's slot; anything else, or a decode after
// a plain forward, is refused rather than fed a stale token.
TEST(PipelinedDecode, RefusesASlotThatIsNotTheLastSubmits) {
  testing::TinyModel& tiny = testing::tiny_model();
  const std::vector<int32_t> prompt = synthetic_prompt(8, tiny.checkpoint.config.shape.vocab_size);
  DecodeState state(*tiny.backend, tiny.checkpoint.config.shape, 32);
  tiny.model.submit_prefill(state, prompt, 0);
  EXPECT_THROW(tiny.model.submit_decode(state, 1, 0), std::logic_error);
  tiny.model.submit_decode(state, 0, 1);
  EXPECT_THROW(tiny.model.submit_decode(state, 0, 1), std::logic_error);
  tiny.model.submit_decode(state, 1, 0);
  const int32_t fed = tiny.model.wait_token(0);
  EXPECT_EQ(state.position, 10);  // the refused submits ran nothing
  tiny.model.forward(state, std::span<const int32_t>(&fed, 1));
  EXPECT_THROW(tiny.model.submit_decode(state, 0, 1), std::logic_error);
  EXPECT_EQ(state.position, 11);
}

TEST(BenchRun, RefusesAStateTooSmall) {
  testing::TinyModel& tiny = testing::tiny_model();
  BenchOptions options;
  options.prompt_len = 40;
  options.decode_steps = 12;
  DecodeState state(*tiny.backend, tiny.checkpoint.config.shape, 52);  // needs 53
  EXPECT_THROW(run_bench(tiny.model, state, options), std::invalid_argument);
}

TEST(BenchReport, CarriesEveryFieldAndTheSummaryLine) {
  testing::TinyModel& tiny = testing::tiny_model();
  BenchOptions options;
  options.prompt_len = 24;
  options.decode_steps = 4;
  DecodeState state(*tiny.backend, tiny.checkpoint.config.shape, 29);
  const BenchMeasurement m = run_bench(tiny.model, state, options);
  BenchContext context;
  context.options = options;
  context.backend = "cpu";
  context.device = tiny.backend->device_name();
  context.threads = tiny.backend->threads();
  context.copy_bytes_per_second = measure_copy_bandwidth(*tiny.backend, 16u << 20, 2);
  context.matmul_flops_per_second = measure_matmul_rate(*tiny.backend, tiny.checkpoint, 8, 1);
  EXPECT_GT(context.copy_bytes_per_second, 1e8);
  EXPECT_GT(context.matmul_flops_per_second, 1e6);
  const Json r = bench_report(context, m, tiny.checkpoint);
  EXPECT_EQ(r["schema_version"], 1);
  for (const char* key : {"commit", "dirty", "build_type", "compiler", "build_flags"}) {
    EXPECT_TRUE(r["meta"].contains(key)) << key;
  }
  EXPECT_EQ(r["meta"]["commit"].get<std::string>().size() == 40 ||
                r["meta"]["commit"] == "unknown",
            true);
  EXPECT_EQ(r["workload"]["prompt_kind"], kPromptKind);
  EXPECT_EQ(r["workload"]["kv_cache"], "f32");
  EXPECT_EQ(r["results"]["decode"]["token_ids"].size(), 4u);
  EXPECT_EQ(r["results"]["decode"]["step_wall_secs"].size(), 4u);
  EXPECT_EQ(r["results"]["decode"]["token_digest"], digest_hex(m.digest));
  const double utilisation = r["bandwidth"]["utilisation"].get<double>();
  EXPECT_GT(utilisation, 0.0);
  EXPECT_NEAR(utilisation, r["bandwidth"]["achieved_bytes_per_s"].get<double>() /
                               r["bandwidth"]["copy_bytes_per_s"].get<double>(), 1e-12);
  const std::string line = bench_summary_line(r);
  EXPECT_NE(line.find("digest=" + digest_hex(m.digest)), std::string::npos) << line;
  EXPECT_NE(line.find("prefill: 24 tok"), std::string::npos) << line;
  EXPECT_NE(line.find("| KV cache f32"), std::string::npos) << line;
  // The CPU has no CUDA options; a CUDA run records the ones it was built with.
  EXPECT_TRUE(r["device"]["cuda_options"].is_null());
  EXPECT_EQ(r["device"]["code_path"], "");
  context.backend = "cuda";
  context.code_path = "compute capability 9.0, sm_90 machine code; ...";
  context.cuda_options = CudaOptions::disabling("stream-gemv");
  const Json c = bench_report(context, m, tiny.checkpoint);
  EXPECT_EQ(c["device"]["cuda_options"],
            (Json{{"pdl", true}, {"stream_gemv", false}, {"fused_conv", true}, {"moe_layer", true}}));
  EXPECT_EQ(c["device"]["code_path"], context.code_path);
}

}  // namespace
}  // namespace lily

// StateSnapshot: restore == a fresh prefill to the same position; prefill stops at snapshot points.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "../model/tiny_model_fixture.h"
#include "backend/backend.h"
#include "engine/generator.h"
#include "model/decode_state.h"
#include "model/qwen36_model.h"
#include "model/state_snapshot.h"

namespace lily {
namespace {

constexpr int64_t kMaxSeq = 96;

testing::TinyModel& tiny() {
  return testing::tiny_model();
}
const ModelShape& shape() {
  return tiny().checkpoint.config.shape;
}

// `n` deterministic token ids from `seed` (below the tiny vocabulary of 4096).
std::vector<int32_t> tokens(size_t n, uint32_t seed) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int32_t>((seed * 7919u + static_cast<uint32_t>(i) * 2654435761u) % 997u);
  }
  return ids;
}

std::span<const int32_t> slice(const std::vector<int32_t>& ids, size_t begin, size_t end) {
  return std::span<const int32_t>(ids).subspan(begin, end - begin);
}

std::vector<float> logits_now() {
  std::vector<float> out;
  tiny().model.logits_to_host(out);
  return out;
}

// Every buffer of the state (KV, conv windows, recurrent), host copies.
std::vector<std::vector<float>> contents(const DecodeState& state) {
  std::vector<std::vector<float>> out;
  for (size_t b = 0; b < state.buffers.size(); ++b) {
    std::vector<float> host(state.sizes[b]);
    tiny().backend->copy_to_host(state.buffers[b], host.size(), host.data());
    out.push_back(std::move(host));
  }
  for (size_t i = 0; i < state.attention.size(); ++i) {
    if (state.kinds[i] != LayerKind::full_attention) continue;
    for (const KvCacheView& cache : {state.attention[i].keys, state.attention[i].values}) {
      std::vector<float> host(state.kv_elements);  // the CPU's caches are f32
      tiny().backend->copy_kv_to_host(cache, host.size(), host.data());
      out.push_back(std::move(host));
    }
  }
  return out;
}

size_t argmax(const std::vector<float>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return worst;
}

TEST(StateSnapshot, BytesAreTheGdnLayersConvWindowsAndRecurrentStates) {
  // Full model: 30 GDN layers x ((4 - 1) x 8192 conv channels + 32 x 128 x 128) floats x 4 bytes.
  EXPECT_EQ(StateSnapshot::bytes(ModelShape::production()), 65'863'680u);
  // Tiny: 6 GDN layers of 8 x ((4 - 1) x (2 x 2 x 128 + 4 x 128) + 4 x 128 x 128) floats x 4.
  EXPECT_EQ(StateSnapshot::bytes(shape()), 1'646'592u);
  // And that is what one allocates.
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const uint64_t before = backend->allocated_bytes();
  StateSnapshot snapshot(*backend, shape());
  EXPECT_EQ(backend->allocated_bytes() - before, 1'646'592u);
  EXPECT_FALSE(snapshot.captured());
  EXPECT_EQ(snapshot.position(), -1);
}

// The state moves on past p with a different continuation; restoring the snapshot at p and
// feeding Y gives what a fresh state fed prompt[0, p) + Y gives. With the same chunking
// ([0, p) then Y) the operations are the same, so logits and state match exactly; with the
// fresh prefill in one chunk they match within float rounding (chunk sizes change the sums).
TEST(StateSnapshot, RestoredStateGivesTheLogitsOfAFreshPrefill) {
  const auto prefix = tokens(21, 1);
  const auto dropped = tokens(9, 2);    // e.g. the reasoning the next prompt no longer holds
  const auto continued = tokens(7, 3);  // what the next prompt has instead

  DecodeState state(*tiny().backend, shape(), kMaxSeq);
  tiny().model.forward(state, prefix);
  StateSnapshot snapshot(*tiny().backend, shape());
  snapshot.capture(*tiny().backend, state);
  EXPECT_TRUE(snapshot.captured());
  EXPECT_EQ(snapshot.position(), 21);
  tiny().model.forward(state, dropped);
  ASSERT_EQ(state.position, 30);
  // Without the restore, the state goes on from 30: clearly different logits (the check can fail).
  DecodeState moved_on(*tiny().backend, shape(), kMaxSeq);
  tiny().model.forward(moved_on, prefix);
  tiny().model.forward(moved_on, dropped);
  tiny().model.forward(moved_on, continued);
  const std::vector<float> wrong = logits_now();

  snapshot.restore(*tiny().backend, state);
  EXPECT_EQ(state.position, 21);
  EXPECT_EQ(state.device_position_value, -1);
  tiny().model.forward(state, continued);
  const std::vector<float> restored = logits_now();

  DecodeState fresh(*tiny().backend, shape(), kMaxSeq);
  tiny().model.forward(fresh, prefix);
  tiny().model.forward(fresh, continued);
  const std::vector<float> same_chunks = logits_now();
  EXPECT_EQ(restored, same_chunks);  // bit for bit
  // The GDN parts match exactly; KV rows match below the position (rows above it in `state`
  // still hold the dropped tokens, which attention never reads).
  const auto a = contents(state);
  const auto b = contents(fresh);
  ASSERT_EQ(a.size(), b.size());
  const size_t row = shape().num_key_value_heads * shape().head_dim;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool kv = a[i].size() == static_cast<size_t>(kMaxSeq) * row;
    const size_t used = kv ? static_cast<size_t>(state.position) * row : a[i].size();
    EXPECT_TRUE(
        std::equal(a[i].begin(), a[i].begin() + static_cast<std::ptrdiff_t>(used), b[i].begin()))
        << "buffer " << i;
  }

  std::vector<int32_t> whole = prefix;
  whole.insert(whole.end(), continued.begin(), continued.end());
  DecodeState one_chunk(*tiny().backend, shape(), kMaxSeq);
  tiny().model.forward(one_chunk, whole);
  const std::vector<float> one_shot = logits_now();
  EXPECT_LT(max_abs_difference(restored, one_shot), 1e-4);
  EXPECT_EQ(argmax(restored), argmax(one_shot));
  const auto top_restored = top_logits(restored, 8);
  const auto top_fresh = top_logits(one_shot, 8);
  for (size_t i = 0; i < top_fresh.size(); ++i) {
    EXPECT_EQ(top_restored[i].first, top_fresh[i].first) << "rank " << i;
  }
  EXPECT_GT(max_abs_difference(wrong, one_shot), 1e-2);
}

// With a bf16 KV cache on the CPU (--kv-cache bf16): the snapshot holds no KV rows, and the
// restored state's rows below the position are the rounded ones it wrote, so restore + Y gives
// the fresh state's logits and KV bits exactly (the same chunking), as with f32.
TEST(StateSnapshot, RestoreWithABf16KvCacheGivesTheFreshStatesBits) {
  const auto prefix = tokens(21, 1);
  const auto dropped = tokens(9, 2);
  const auto continued = tokens(7, 3);
  DecodeState state(*tiny().backend, shape(), kMaxSeq, KvDtype::bf16);
  tiny().model.forward(state, prefix);
  StateSnapshot snapshot(*tiny().backend, shape());
  snapshot.capture(*tiny().backend, state);
  tiny().model.forward(state, dropped);
  snapshot.restore(*tiny().backend, state);
  ASSERT_EQ(state.position, 21);
  tiny().model.forward(state, continued);
  const std::vector<float> restored = logits_now();
  DecodeState fresh(*tiny().backend, shape(), kMaxSeq, KvDtype::bf16);
  tiny().model.forward(fresh, prefix);
  tiny().model.forward(fresh, continued);
  EXPECT_EQ(restored, logits_now());  // bit for bit
  const size_t used = static_cast<size_t>(state.position) * shape().num_key_value_heads * shape().head_dim;
  for (size_t i = 0; i < state.attention.size(); ++i) {
    if (state.kinds[i] != LayerKind::full_attention) continue;
    for (int which = 0; which < 2; ++which) {
      const KvCacheView& a = which == 0 ? state.attention[i].keys : state.attention[i].values;
      const KvCacheView& b = which == 0 ? fresh.attention[i].keys : fresh.attention[i].values;
      ASSERT_EQ(a.dtype, KvDtype::bf16);
      std::vector<uint16_t> ha(state.kv_elements), hb(state.kv_elements);
      tiny().backend->copy_kv_to_host(a, ha.size(), ha.data());
      tiny().backend->copy_kv_to_host(b, hb.size(), hb.data());
      EXPECT_TRUE(std::equal(ha.begin(), ha.begin() + static_cast<std::ptrdiff_t>(used), hb.begin()))
          << "layer " << i << (which == 0 ? " keys" : " values");
    }
  }
  // And it is not the f32 state's: the logits differ.
  DecodeState f32(*tiny().backend, shape(), kMaxSeq);
  tiny().model.forward(f32, prefix);
  tiny().model.forward(f32, continued);
  EXPECT_GT(max_abs_difference(restored, logits_now()), 0.0);
}

TEST(StateSnapshot, RestoreOnlyIntoTheStateItWasTakenFrom) {
  StateSnapshot snapshot(*tiny().backend, shape());
  DecodeState state(*tiny().backend, shape(), kMaxSeq);
  EXPECT_THROW(snapshot.restore(*tiny().backend, state), std::logic_error);  // nothing captured
  tiny().model.forward(state, tokens(5, 4));
  snapshot.capture(*tiny().backend, state);
  DecodeState other(*tiny().backend, shape(), kMaxSeq);
  EXPECT_THROW(snapshot.restore(*tiny().backend, other), std::logic_error);
  EXPECT_EQ(other.position, 0);
  // A snapshot of another shape does not fit the state's buffers.
  ModelShape small = shape();
  small.linear_num_value_heads = 2;
  StateSnapshot misfit(*tiny().backend, small);
  EXPECT_THROW(misfit.capture(*tiny().backend, state), std::invalid_argument);
}

// A model over the tiny checkpoint with 8-token prefill chunks, so that chunking is visible.
struct SmallChunks {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  Qwen36Model model{tiny().checkpoint, *backend, 8};
};

struct PrefillRun {
  GenerationResult result;
  std::vector<int64_t> snapshots;  // state.position at each on_snapshot
  int chunks = 0;                  // cancel_prefill calls: one before each prefill chunk
};

PrefillRun prefill(SmallChunks& m, DecodeState& state, std::span<const int32_t> prompt,
                   std::vector<int64_t> points, int cancel_on_chunk = -1) {
  PrefillRun run;
  GenerationOptions options;
  options.max_tokens = 3;
  options.snapshot_at = std::move(points);
  options.on_snapshot = [&run](DecodeState& s) { run.snapshots.push_back(s.position); };
  options.cancel_prefill = [&run, cancel_on_chunk] { return run.chunks++ == cancel_on_chunk; };
  run.result = generate(m.model, state, prompt, options);
  return run;
}

TEST(GeneratorSnapshots, PrefillEndsAChunkAtEachPointInsideThePrompt) {
  SmallChunks m;
  const auto prompt = tokens(30, 5);
  DecodeState plain_state(*m.backend, shape(), kMaxSeq);
  const PrefillRun plain = prefill(m, plain_state, prompt, {});
  EXPECT_EQ(plain.chunks, 4);  // [0, 8) [8, 16) [16, 24) [24, 30)
  EXPECT_TRUE(plain.snapshots.empty());

  // 0 is what the state holds already, 30 the prompt's end, 40 beyond it: skipped.
  DecodeState state(*m.backend, shape(), kMaxSeq);
  const PrefillRun run = prefill(m, state, prompt, {0, 5, 8, 8, 13, 30, 40});
  EXPECT_EQ(run.snapshots, (std::vector<int64_t>{5, 8, 13}));
  EXPECT_EQ(run.chunks, 6);  // [0, 5) [5, 8) [8, 13) [13, 21) [21, 29) [29, 30)
  EXPECT_EQ(run.result.tokens, plain.result.tokens);
  EXPECT_EQ(run.result.fed, plain.result.fed);
  EXPECT_EQ(state.position, plain_state.position);

  // Without on_snapshot the points change nothing.
  DecodeState quiet(*m.backend, shape(), kMaxSeq);
  GenerationOptions options;
  options.max_tokens = 3;
  options.snapshot_at = {5, 13};
  int chunks = 0;
  options.cancel_prefill = [&chunks] { return ++chunks < 0; };
  EXPECT_EQ(generate(m.model, quiet, prompt, options).tokens, plain.result.tokens);
  EXPECT_EQ(chunks, 4);

  options.snapshot_at = {13, 5};
  EXPECT_THROW(generate(m.model, quiet, prompt, options), std::invalid_argument);
}

// Points are absolute positions: on a state already holding 6 tokens, 3 and 6 are skipped.
TEST(GeneratorSnapshots, PointsAreStatePositionsOnTopOfACachedPrefix) {
  SmallChunks m;
  const auto all = tokens(26, 6);
  DecodeState state(*m.backend, shape(), kMaxSeq);
  m.model.forward(state, slice(all, 0, 6));
  const PrefillRun run = prefill(m, state, slice(all, 6, 26), {3, 6, 10, 26});
  EXPECT_EQ(run.snapshots, (std::vector<int64_t>{10}));
  EXPECT_EQ(run.chunks, 3);  // [6, 10) [10, 18) [18, 26)
}

TEST(GeneratorSnapshots, CancelAfterASnapshotKeepsWhatWasFed) {
  SmallChunks m;
  const auto prompt = tokens(30, 7);
  DecodeState state(*m.backend, shape(), kMaxSeq);
  const PrefillRun run = prefill(m, state, prompt, {5, 8, 13}, 2);  // cancel before [8, 13)
  EXPECT_EQ(run.result.finish_reason, "cancelled");
  EXPECT_EQ(run.snapshots, (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(state.position, 8);
  EXPECT_EQ(run.result.prompt_unfed, 22);
  EXPECT_TRUE(run.result.tokens.empty());
}

}  // namespace
}  // namespace lily

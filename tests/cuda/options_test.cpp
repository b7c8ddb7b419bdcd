// CudaOptions (--cuda-disable): each disabled path stays at zero in the path counts, the others run, results unchanged.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend_test_support.h"
#include "cuda_test_support.h"

namespace lily::testing {
namespace {

// What one backend gives for the probe below: the outputs and the counts after it.
struct ProbeResult {
  std::vector<float> tall_y;   // [40000] the tall Q4 matmul, n = 1
  std::vector<float> mixer_y;  // [96] the Gated DeltaNet mixer, n = 1
  CudaPathCounts counts;
};

// The three switchable paths' ops, on fixed inputs (seeded): a one-token matmul over a tall
// Q4 matrix of 1024 inputs (the bulk-copy GEMV's shape, as the lm_head), and one step of the
// Gated DeltaNet mixer (the conv inside the delta rule), every kernel launched through the
// backend's launch helper (PDL).
ProbeResult probe(Backend& be) {
  Rng rng(601);
  const QuantWeight tall(rng, 4, 1, 40'000, 1024, 0, "tall");
  const std::vector<float> x = rng.uniform_vector(1024, -2.0f, 2.0f);
  float* y = be.alloc(40'000);
  be.matmul(tall.view(), 0, 40'000, to_device(be, x), 1, y);

  const GatedDeltaNetDims d{2, 4, 32, 32, 4};
  const auto C = static_cast<size_t>(d.channels());
  const DenseTensor conv(DType::BF16, {C, 4, 1}, rng.uniform_vector(C * 4, -0.6f, 0.6f), "conv1d");
  const DenseTensor a_log(DType::F32, {4}, rng.uniform_vector(4, 0.0f, 2.7f), "A_log");
  const DenseTensor dt_bias(DType::BF16, {4}, rng.uniform_vector(4, -1.0f, 1.0f), "dt_bias");
  const DenseTensor norm(DType::BF16, {32}, rng.uniform_vector(32, 0.5f, 1.5f), "norm");
  const QuantWeight out_proj(rng, 4, 1, 96, 4 * 32, 0, "out_proj");
  const GatedDeltaNetWeights w = mixer_weights(conv, a_log, dt_bias, norm, out_proj);
  float* window = to_device(be, rng.uniform_vector(3 * C, -2.0f, 2.0f));
  float* state = to_device(be, rng.uniform_vector(4 * 32 * 32, -0.5f, 0.5f));
  float* mixer_y = be.alloc(96);
  be.gated_delta_net_mixer(w, d, 1e-6f, to_device(be, rng.uniform_vector(C, -2.0f, 2.0f)),
                           to_device(be, rng.uniform_vector(128, -3.0f, 3.0f)),
                           to_device(be, rng.uniform_vector(4, -3.0f, 3.0f)),
                           to_device(be, rng.uniform_vector(4, -4.0f, 4.0f)), window, state, 1,
                           be.alloc(C), be.alloc(128), be.alloc(128), mixer_y);
  return {to_host(be, y, 40'000), to_host(be, mixer_y, 96), path_counts(be)};
}

// Each --cuda-disable choice: its counter stays at zero while the default backend's rises
// (where the device runs the path at all), the other paths run as by default, the start-up
// line names the choice, and the outputs do not change (the bulk-copy GEMV and PDL are bit
// for bit the same; the fused conv agrees with the four ops to f32 rounding).
TEST(CudaOptions, EachDisabledPathStaysAtZero) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  const std::string path = be->code_path();
  EXPECT_NE(path.find("options: pdl on, stream-gemv on, fused-conv on, moe-layer on"), std::string::npos) << path;
  const bool pdl = path.find("programmatic dependent launch on") != std::string::npos;
  const bool streams = path.find("bulk-copy lm_head GEMV on") != std::string::npos;
  const ProbeResult base = probe(*be);
  EXPECT_EQ(base.counts.pdl_launches > 0, pdl) << path;
  EXPECT_EQ(base.counts.stream_gemv, streams ? 1u : 0u) << path;
  EXPECT_EQ(base.counts.fused_conv_delta, 1u);
  const bool norm_inside = path.find("gated norm inside the delta rule on") != std::string::npos;
  EXPECT_EQ(base.counts.gated_norm_in_delta, norm_inside ? 1u : 0u) << path;
  // Thread-block clusters come with compute capability 9.0 code, as PDL does.
  EXPECT_EQ(norm_inside, pdl) << path;
  if (!pdl || !streams) {
    std::printf("[cuda] this device runs neither or not both Hopper paths: %s\n", path.c_str());
  }

  for (const char* name : {"pdl", "stream-gemv", "fused-conv"}) {
    const std::string disabled = name;
    std::string why;
    const std::unique_ptr<Backend> off = cuda_backend_or_null(CudaOptions::disabling(disabled), &why);
    ASSERT_TRUE(off) << why;
    const std::string off_path = off->code_path();
    EXPECT_NE(off_path.find(disabled + " off"), std::string::npos) << off_path;
    const ProbeResult got = probe(*off);
    EXPECT_EQ(got.counts.pdl_launches > 0, pdl && disabled != "pdl") << disabled << ": " << off_path;
    EXPECT_EQ(got.counts.stream_gemv, streams && disabled != "stream-gemv" ? 1u : 0u) << disabled;
    // The generic GEMV takes the tall matmul without the bulk copies, and the output
    // projection without the fused conv (the mixer's four ops; fused, its launch is the
    // mixer's own).
    const uint64_t extra = (streams && disabled == "stream-gemv" ? 1u : 0u) +
                           (disabled == "fused-conv" ? 1u : 0u);
    EXPECT_EQ(got.counts.gemv, base.counts.gemv + extra) << disabled;
    EXPECT_EQ(got.counts.fused_conv_delta, disabled != "fused-conv" ? 1u : 0u) << disabled;
    EXPECT_EQ(got.counts.gated_norm_in_delta, norm_inside && disabled != "fused-conv" ? 1u : 0u)
        << disabled << ": " << off_path;
    EXPECT_EQ(got.tall_y, base.tall_y) << disabled << ": the tall matmul changed";
    if (disabled == "fused-conv") {
      EXPECT_LT(compare_f32(got.mixer_y, base.mixer_y).normalised, 1e-6) << disabled;
    } else {
      EXPECT_EQ(got.mixer_y, base.mixer_y) << disabled << ": the mixer changed";
    }
  }
}

}  // namespace
}  // namespace lily::testing

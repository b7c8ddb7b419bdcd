// CPU one-token ops merged into one pool barrier (matmul_group, expert_swiglu_with_shared): same bits as the ops one by one.
#include <gtest/gtest.h>

#include <bit>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_test_support.h"

namespace lily::testing {
namespace {

void expect_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << label << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

const char* name_of(CpuPrecision p) { return p == CpuPrecision::fast ? "fast" : "exact"; }

// Three targets of one width (Q4 rows from the middle, Q8, a one-row Q4: the shape of the MoE's
// router and shared-expert gate), one token: one barrier, and each target's bits are those of
// its own matmul. Two tokens: the targets in turn, the same bits.
TEST(CpuDecodeBarriers, MatmulGroupOfOneTokenIsOneBarrierWithTheSameBits) {
  for (CpuPrecision precision : {CpuPrecision::exact, CpuPrecision::fast}) {
    Rng rng(61);
    CpuBackend be(2, precision);
    const QuantWeight a(rng, 4, 1, 40, 256, 0, "a");
    const QuantWeight b(rng, 8, 1, 7, 256, 1, "b");
    const QuantWeight c(rng, 4, 1, 1, 256, 2, "c");
    for (int64_t n : {1, 2}) {
      const std::string label = std::string(name_of(precision)) + " n=" + std::to_string(n);
      const std::vector<float> x = rng.uniform_vector(static_cast<size_t>(n) * 256, -2.0f, 2.0f);
      std::vector<float> ya(static_cast<size_t>(n) * 30), yb(static_cast<size_t>(n) * 7), yc(static_cast<size_t>(n));
      const MatmulTarget targets[] = {{&a.view(), 10, 30, ya.data()}, {&b.view(), 0, 7, yb.data()},
                                      {&c.view(), 0, 1, yc.data()}};
      const uint64_t before = be.pool_barriers();
      be.matmul_group(targets, x.data(), n);
      if (n == 1) {
        EXPECT_EQ(be.pool_barriers() - before, 1u) << label;
      }
      std::vector<float> wa(ya.size()), wb(yb.size()), wc(yc.size());
      be.matmul(a.view(), 10, 30, x.data(), n, wa.data());
      be.matmul(b.view(), 0, 7, x.data(), n, wb.data());
      be.matmul(c.view(), 0, 1, x.data(), n, wc.data());
      expect_bits(ya, wa, label + " a");
      expect_bits(yb, wb, label + " b");
      expect_bits(yc, wc, label + " c");
    }
  }
}

// Widths that differ cannot share one prepared input: the targets run in turn, still right.
TEST(CpuDecodeBarriers, MatmulGroupOfMixedWidthsRunsTheTargetsInTurn) {
  Rng rng(62);
  CpuBackend be(2, CpuPrecision::fast);
  const QuantWeight a(rng, 4, 1, 8, 128, 0, "a");
  const QuantWeight b(rng, 4, 1, 8, 256, 0, "b");
  const std::vector<float> x = rng.uniform_vector(256, -2.0f, 2.0f);
  std::vector<float> ya(8), yb(8), wa(8), wb(8);
  const MatmulTarget targets[] = {{&a.view(), 0, 8, ya.data()}, {&b.view(), 0, 8, yb.data()}};
  const uint64_t before = be.pool_barriers();
  be.matmul_group(targets, x.data(), 1);
  EXPECT_EQ(be.pool_barriers() - before, 2u);
  be.matmul(a.view(), 0, 8, x.data(), 1, wa.data());
  be.matmul(b.view(), 0, 8, x.data(), 1, wb.data());
  expect_bits(ya, wa, "a");
  expect_bits(yb, wb, "b");
}

// The routed experts' SwiGLU (k = 3 slots, one expert twice) and the shared expert's on one
// token: one barrier, the bits of the two expert_swiglu calls (two barriers).
TEST(CpuDecodeBarriers, SwigluWithSharedOfOneTokenIsOneBarrierWithTheSameBits) {
  for (CpuPrecision precision : {CpuPrecision::exact, CpuPrecision::fast}) {
    Rng rng(63);
    CpuBackend be(2, precision);
    // I = 96 rows per expert: the 64-row chunks and a thread's range both end inside a slot.
    const QuantWeight gate(rng, 4, 5, 96, 128, 0, "gate");
    const QuantWeight up(rng, 4, 5, 96, 128, 1, "up");
    const QuantWeight sgate(rng, 4, 1, 80, 128, 2, "shared_gate");
    const QuantWeight sup(rng, 4, 1, 80, 128, 3, "shared_up");
    const std::vector<int32_t> ids = {4, 1, 4};
    const std::vector<float> x = rng.uniform_vector(128, -2.0f, 2.0f);
    std::vector<float> h(3 * 96), sh(80), wh(3 * 96), wsh(80);
    const uint64_t before = be.pool_barriers();
    be.expert_swiglu_with_shared(gate.view(), up.view(), ids.data(), 3, h.data(), sgate.view(), sup.view(),
                                 sh.data(), x.data(), 1);
    EXPECT_EQ(be.pool_barriers() - before, 1u) << name_of(precision);
    be.expert_swiglu(gate.view(), up.view(), x.data(), ids.data(), 1, 3, wh.data());
    be.expert_swiglu(sgate.view(), sup.view(), x.data(), nullptr, 1, 1, wsh.data());
    expect_bits(h, wh, std::string(name_of(precision)) + " routed");
    expect_bits(sh, wsh, std::string(name_of(precision)) + " shared");
  }
}

}  // namespace
}  // namespace lily::testing

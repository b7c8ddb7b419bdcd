// The base ops' contract on the CPU backend: every rejection case with the contract's exact text.
#include <gtest/gtest.h>

#include "backend_test_support.h"
#include "op_contract_cases.h"

namespace lily::testing {
namespace {

// The CUDA twin (tests/cuda/op_contract_test.cpp) runs the same cases and expects the same text.
TEST(OpContract, CpuRejectsWithTheContractsMessages) {
  auto be = cpu();
  expect_contract_rejections(*be);
}

}  // namespace
}  // namespace lily::testing

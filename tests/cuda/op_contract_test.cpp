// The base ops' contract on the CUDA backend: the CPU's rejection cases, the same exact text.
#include <gtest/gtest.h>

#include "cuda_test_support.h"
#include "op_contract_cases.h"

namespace lily::testing {
namespace {

TEST(CudaOpContract, RejectsWithTheContractsMessages) {
  LILY_CUDA_BACKEND_OR_SKIP(be);
  expect_contract_rejections(*be);
}

}  // namespace
}  // namespace lily::testing

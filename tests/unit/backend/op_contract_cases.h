// The base ops' rejection cases (backend/op_contract.h), run on the CPU and on CUDA alike.
#pragma once

#include "backend/backend.h"

namespace lily::testing {

// Feeds every base op arguments that break its contract, one at a time, on `be` (buffers
// allocated from it, so that a check that failed to throw could not pass host memory to a
// device kernel), and expects std::invalid_argument with exactly the contract's message:
// the same text on every backend. Each failure names the case.
void expect_contract_rejections(Backend& be);

}  // namespace lily::testing

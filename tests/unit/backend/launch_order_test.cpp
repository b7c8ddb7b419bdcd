// cuda::LaunchOrder (src/backend/cuda/launch_order.h, plain C++): the programmatic-dependent-
// launch ordering rule the CUDA backend checks at dispatch, exercised without a GPU.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "backend/cuda/launch_order.h"

namespace lily::testing {
namespace {

using cuda::LaunchOrder;

// A kernel launch as cuda::launch counts it.
void launch(LaunchOrder& order) { ++*order.counter(); }

TEST(LaunchOrder, RefusesAReadBeforeTheWaitRightAfterTheLaunchThatWroteIt) {
  LaunchOrder order;
  float state[4] = {};
  launch(order);
  order.wrote(state, "recurrent state", "gated_delta_rule");
  try {
    order.check_read_before_wait(state, "recurrent state", "gated_delta_rule");
    FAIL() << "a read before the wait right after the write was accepted";
  } catch (const std::logic_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("gated_delta_rule: reads its recurrent state before waiting"), std::string::npos)
        << message;
    EXPECT_NE(message.find("Issue another op"), std::string::npos) << message;
  }
}

TEST(LaunchOrder, AcceptsTheReadOnceAnotherOperationSeparatesThem) {
  float window[4] = {};
  {
    LaunchOrder order;  // a kernel in between
    launch(order);
    order.wrote(window, "conv window", "conv1d_silu");
    launch(order);
    EXPECT_NO_THROW(order.check_read_before_wait(window, "conv window", "conv1d_silu"));
  }
  {
    LaunchOrder order;  // a copy or memset in between (it serialises the stream)
    launch(order);
    order.wrote(window, "conv window", "conv1d_silu");
    order.issued_other();
    EXPECT_NO_THROW(order.check_read_before_wait(window, "conv window", "conv1d_silu"));
  }
}

TEST(LaunchOrder, OnlyTheBufferTheLastLaunchWroteIsRefused) {
  LaunchOrder order;
  float state[4] = {};
  float window[4] = {};
  EXPECT_NO_THROW(order.check_read_before_wait(state, "recurrent state", "gated_delta_rule"))
      << "nothing written yet";
  launch(order);
  order.wrote(state, "recurrent state", "gated_delta_net_mixer's delta rule");
  launch(order);
  order.wrote(window, "conv window", "gated_delta_net_mixer's output projection (window shift)");
  // The state was written two launches ago: finished before the next launch starts.
  EXPECT_NO_THROW(order.check_read_before_wait(state, "recurrent state", "gated_delta_net_mixer"));
  EXPECT_THROW(order.check_read_before_wait(window, "conv window", "gated_delta_net_mixer"),
               std::logic_error);
  EXPECT_NO_THROW(order.check_read_before_wait(nullptr, "conv window", "gated_delta_net_mixer"));
}

}  // namespace
}  // namespace lily::testing

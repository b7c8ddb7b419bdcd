// The CPU thread pool: every index of a parallel_for runs once, in one contiguous range per
// thread, and each call counts one barrier.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace lily::testing {
namespace {

TEST(ThreadPool, EveryIndexRunsOnceInOneRangePerThread) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, int64_t{1000},
                          int64_t{4097}}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(count));
      std::mutex mutex;
      std::vector<std::pair<int64_t, int64_t>> chunks;
      pool.parallel_for(count, [&](int64_t begin, int64_t end) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          chunks.emplace_back(begin, end);
        }
        for (int64_t i = begin; i < end; ++i) runs[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << threads << " threads, count " << count << ", index " << i;
      }
      for (const auto& [begin, end] : chunks) {
        EXPECT_LT(begin, end) << "no empty chunk";
        EXPECT_GE(begin, 0);
        EXPECT_LE(end, count);
      }
      // One range per thread at most (the caller's included), each a long run of indices.
      EXPECT_LE(chunks.size(), static_cast<size_t>(threads)) << threads << " threads, count " << count;
    }
  }
}

TEST(ThreadPool, ManyJobsInARowCountOneBarrierEach) {
  ThreadPool pool(3);
  const uint64_t before = pool.barriers();
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 500; ++job) {
    pool.parallel_for(37, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sum.fetch_add(i);
    });
  }
  EXPECT_EQ(sum.load(), 500 * (36 * 37 / 2));
  EXPECT_EQ(pool.barriers() - before, 500u);
}

}  // namespace
}  // namespace lily::testing

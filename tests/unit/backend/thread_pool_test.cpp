// The CPU thread pool: every index of a parallel_for runs once, in the pool's fixed chunks; a
// slow thread's unstarted chunks are taken by the others; each call counts one barrier.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace lily::testing {
namespace {

TEST(ThreadPool, EveryIndexRunsOnceInTheFixedChunks) {
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
      // The chunks are the pool's: at most kChunksPerThread a thread, each a long run of indices
      // (count / chunks, give or take one), never split further.
      const int64_t most = std::min<int64_t>(count, int64_t{ThreadPool::kChunksPerThread} * threads);
      EXPECT_EQ(static_cast<int64_t>(chunks.size()), threads == 1 ? std::min<int64_t>(count, 1) : most)
          << threads << " threads, count " << count;
      for (const auto& [begin, end] : chunks) {
        EXPECT_LT(begin, end) << "no empty chunk";
        EXPECT_GE(begin, 0);
        EXPECT_LE(end, count);
        if (threads > 1) {
          EXPECT_LE(end - begin, (count + most - 1) / most) << threads << " threads, count " << count;
        }
      }
    }
  }
}

// Work stealing: the worker stalls in its first chunk (as a core the machine slows down), and
// the caller, done with its own share, takes the worker's other chunks from the back.
TEST(ThreadPool, AStalledThreadsChunksAreTakenByTheOthers) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  const int64_t count = 1600;
  std::atomic<int64_t> by_caller{0};
  std::atomic<bool> stalled{false};
  pool.parallel_for(count, [&](int64_t begin, int64_t end) {
    if (std::this_thread::get_id() == caller) {
      by_caller.fetch_add(end - begin);
    } else if (!stalled.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  // Without stealing the caller runs its half (800); with it, all but the chunk the worker
  // stalled in (and whatever it ran before the caller got there): at least 15 of 16 chunks
  // unless the caller itself was descheduled for most of 200 ms.
  EXPECT_GE(by_caller.load(), count * 3 / 4);
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

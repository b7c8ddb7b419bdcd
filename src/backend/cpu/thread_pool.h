// A fixed pool of worker threads running parallel_for over index ranges.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lily {

// parallel_for(count, fn) splits [0, count) into one contiguous range per thread and calls
// fn(begin, end) on each; the caller's thread takes the first range. Blocks until all ranges
// are done. Not reentrant: one parallel_for at a time (the model runs on one thread).
//
// A decode step issues hundreds of short parallel_for calls, so waking workers through a
// condition variable each time would cost more than the work: workers spin briefly on an
// atomic job counter before they sleep, and the caller spins for their completion.
class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: std::thread::hardware_concurrency()
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // How many parallel_for calls have gone to the workers so far (each one a barrier: the caller
  // waits for every worker). A call of count <= 1 or on a one-thread pool runs inline and does
  // not count.
  uint64_t barriers() const { return generation_.load(std::memory_order_relaxed); }
  void parallel_for(int64_t count, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_count_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace lily

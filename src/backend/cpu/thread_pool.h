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

// parallel_for(count, fn) splits [0, count) into up to kChunksPerThread contiguous chunks per
// thread and calls fn(begin, end) on each chunk, once; the caller's thread owns the first
// share. Each thread runs its own share's chunks in ascending order, then takes chunks from
// the back of the other shares that are not yet started (work stealing), so that a thread the
// machine slows down (a busy or throttled core: on the 2-vCPU dev box the worker ran about 25%
// slower than the caller in every op, docs/perf/cpu.md) leaves its last chunks to the others,
// while each thread still streams long runs of consecutive indices. Blocks until all chunks
// are done. Not reentrant: one parallel_for at a time (the model runs on one thread). Callers
// must not depend on which thread runs which chunk (every op writes per index).
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

  static constexpr int kChunksPerThread = 8;

 private:
  void worker_loop(int index);
  // Runs thread `index`'s share, then steals; every chunk of the current job runs once.
  void run_share(int index);
  // Claims the next chunk from the front (owner) or the back (thief) of share `t`.
  bool claim(int t, bool from_back, int64_t* chunk);
  void run_chunk(int64_t chunk) const;

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_count_ = 0;
  int64_t job_chunks_ = 0;
  // Per thread: the unclaimed chunks [front, back) of its share, packed front | back << 32.
  std::vector<std::atomic<uint64_t>> shares_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace lily

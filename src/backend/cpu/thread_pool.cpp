// A fixed pool of worker threads running parallel_for over index ranges.
#include "backend/cpu/thread_pool.h"

#include <algorithm>

namespace lily {

namespace {

// How long a worker keeps polling for the next job before it sleeps (iterations of a
// pause-instruction loop, roughly 100 microseconds).
constexpr int kSpinIterations = 20000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Range of part `index` of `parts` over [0, count).
std::pair<int64_t, int64_t> split(int64_t count, int parts, int index) {
  const int64_t base = count / parts;
  const int64_t extra = count % parts;
  const int64_t begin = index * base + std::min<int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t count, const std::function<void(int64_t, int64_t)>& fn) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    fn(0, count);
    return;
  }
  job_ = &fn;
  job_count_ = count;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    // Publishing under the mutex pairs with the sleepers' predicate check: no lost wake-up.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  const auto [begin, end] = split(count, size(), 0);
  if (begin < end) fn(begin, end);
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kSpinIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t current = generation_.load(std::memory_order_acquire);
    for (int spins = 0; current == seen && spins < kSpinIterations; ++spins) {
      cpu_relax();
      current = generation_.load(std::memory_order_acquire);
    }
    if (current == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_.load() || generation_.load(std::memory_order_acquire) != seen;
      });
      if (stopping_.load()) return;
      current = generation_.load(std::memory_order_acquire);
    }
    seen = current;
    const auto [begin, end] = split(job_count_, size(), index);
    if (begin < end) (*job_)(begin, end);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace lily

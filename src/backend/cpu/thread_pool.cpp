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
  shares_ = std::vector<std::atomic<uint64_t>>(static_cast<size_t>(threads));
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
  job_chunks_ = std::min<int64_t>(count, int64_t{kChunksPerThread} * size());
  for (int t = 0; t < size(); ++t) {
    const auto [front, back] = split(job_chunks_, size(), t);
    shares_[static_cast<size_t>(t)].store(static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32,
                                          std::memory_order_relaxed);
  }
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    // Publishing under the mutex pairs with the sleepers' predicate check: no lost wake-up.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_share(0);
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
    run_share(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run_share(int index) {
  int64_t chunk = 0;
  while (claim(index, false, &chunk)) run_chunk(chunk);
  for (int k = 1; k < size(); ++k) {
    const int victim = (index + k) % size();
    while (claim(victim, true, &chunk)) run_chunk(chunk);
  }
}

bool ThreadPool::claim(int t, bool from_back, int64_t* chunk) {
  std::atomic<uint64_t>& share = shares_[static_cast<size_t>(t)];
  uint64_t packed = share.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t front = packed & 0xffffffffu;
    const uint64_t back = packed >> 32;
    if (front >= back) return false;
    const uint64_t next = from_back ? front | (back - 1) << 32 : (front + 1) | back << 32;
    if (share.compare_exchange_weak(packed, next, std::memory_order_acq_rel)) {
      *chunk = static_cast<int64_t>(from_back ? back - 1 : front);
      return true;
    }
  }
}

void ThreadPool::run_chunk(int64_t chunk) const {
  const auto [begin, end] = split(job_count_, static_cast<int>(job_chunks_), static_cast<int>(chunk));
  if (begin < end) (*job_)(begin, end);
}

}  // namespace lily

// Start-up progress while weights load: a bar (bytes, rate, ETA) on a terminal, plain lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace lily {

class LoadProgress {
 public:
  // `interactive`: redraw one line with \r (stderr is a terminal); otherwise a plain line at
  // every 10% step.
  LoadProgress(std::FILE* out, bool interactive, std::string label);

  // Bytes done of total. Redraws at most 10 times a second.
  void update(uint64_t done, uint64_t total);
  // The final line ("<label>: 19.51 GB in 12.3 s (1.59 GB/s)").
  void finish();

  // "[#######.............]  5.20/19.51 GB  1.32 GB/s  ETA 11s" (exposed for tests).
  static std::string bar_line(uint64_t done, uint64_t total, double seconds, int width);

 private:
  std::FILE* out_;
  bool interactive_;
  std::string label_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
  int last_decile_ = -1;
  uint64_t done_ = 0;
  uint64_t total_ = 0;
};

}  // namespace lily

// Start-up progress reporting: terminal bar or plain lines.
#include "core/load_progress.h"

#include <algorithm>

namespace lily {

LoadProgress::LoadProgress(std::FILE* out, bool interactive, std::string label)
    : out_(out),
      interactive_(interactive),
      label_(std::move(label)),
      start_(std::chrono::steady_clock::now()) {}

std::string LoadProgress::bar_line(uint64_t done, uint64_t total, double seconds, int width) {
  const double fraction =
      total == 0 ? 1.0 : std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
  const int filled = static_cast<int>(fraction * width);
  // Built by appends: GCC 12 -O3 reports a false -Wrestrict on the operator+ chain.
  std::string line;
  line.reserve(static_cast<size_t>(width) + 2);
  line.push_back('[');
  line.append(static_cast<size_t>(filled), '#');
  line.append(static_cast<size_t>(width - filled), '.');
  line.push_back(']');
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  char text[128];
  if (rate > 0 && done < total) {
    const double eta = static_cast<double>(total - done) / rate;
    std::snprintf(text, sizeof text, " %6.2f/%.2f GB  %.2f GB/s  ETA %.0fs",
                  static_cast<double>(done) / 1e9, static_cast<double>(total) / 1e9, rate / 1e9,
                  eta);
  } else {
    std::snprintf(text, sizeof text, " %6.2f/%.2f GB  %.2f GB/s", static_cast<double>(done) / 1e9,
                  static_cast<double>(total) / 1e9, rate / 1e9);
  }
  return line + text;
}

void LoadProgress::update(uint64_t done, uint64_t total) {
  done_ = done;
  total_ = total;
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - start_).count();
  if (interactive_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && done < total) return;
    last_draw_ = now;
    std::fprintf(out_, "\r%s %s", label_.c_str(), bar_line(done, total, seconds, 30).c_str());
    std::fflush(out_);
    return;
  }
  const int decile = total == 0 ? 10 : static_cast<int>(done * 10 / total);
  // Plain lines only for loads worth following (a tiny checkpoint loads in milliseconds).
  if (decile == last_decile_ || total < (1ull << 30)) return;
  last_decile_ = decile;
  std::fprintf(out_, "%s: %d%% (%.2f/%.2f GB, %.1f s)\n", label_.c_str(), decile * 10,
               static_cast<double>(done) / 1e9, static_cast<double>(total) / 1e9, seconds);
}

void LoadProgress::finish() {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (interactive_) std::fputs("\r\033[K", out_);
  std::fprintf(out_, "%s: %.2f GB in %.1f s (%.2f GB/s)\n", label_.c_str(),
               static_cast<double>(total_) / 1e9, seconds,
               seconds > 0 ? static_cast<double>(total_) / 1e9 / seconds : 0.0);
}

}  // namespace lily

// Stop strings on streamed text: the earliest match across token boundaries, and the hold-back.
#include "text/stop_strings.h"

#include <algorithm>
#include <stdexcept>

namespace lily {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& stop : stops_) {
    if (stop.empty()) throw std::invalid_argument("StopStringMatcher: empty stop string");
  }
}

StopStringMatcher::Release StopStringMatcher::push(std::string_view piece) {
  Release out;
  if (stopped_) return out;
  held_.append(piece);
  if (stops_.empty()) {
    out.text.swap(held_);
    return out;
  }
  // Everything released earlier ended before any possible match start (the hold-back below),
  // so the first match, if any, starts inside held_.
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    out.text = held_.substr(0, first);
    out.stopped = true;
    stopped_ = true;
    held_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string. Stop strings are
  // valid UTF-8 and start on a character boundary, so the cut never splits a character.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, held_.size());
    for (size_t k = longest; k > hold; --k) {
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(stop).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  out.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace lily

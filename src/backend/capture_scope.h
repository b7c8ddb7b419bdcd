// RAII around graph capture: an exception between begin and end never leaves the stream capturing.
#pragma once

#include "backend/backend.h"

namespace lily {

// Opens a capture on construction; end() completes it and returns the graph. If the scope is
// left without end() (an op threw while recording), the destructor aborts the capture, so the
// backend runs ops again and the next request is not failed by a stream still capturing.
class CaptureScope {
 public:
  explicit CaptureScope(Backend& backend) : backend_(backend) { backend_.begin_capture(); }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
  ~CaptureScope() {
    if (open_) backend_.abort_capture();
  }

  // The recorded graph, for Backend::replay. end_capture closes the capture even when it
  // throws (instantiation failed), so the scope is closed before the call.
  int end() {
    open_ = false;
    return backend_.end_capture();
  }

 private:
  Backend& backend_;
  bool open_ = true;
};

}  // namespace lily

// The ordering rule that programmatic dependent launch adds to the op contract, checked on the
// host: a kernel that reads an input before its dependency wait must not follow the stream
// operation that wrote it. Plain C++ (no CUDA types), so the CPU tests check it too.
//
// Why: under programmatic dependent launch (cuda_common.cuh) a kernel may start while the
// launch just before it in the stream still runs, and a few kernels read inputs before their
// grid_dependency_wait so that those loads overlap that launch: the one-token delta rule its
// recurrent state (2 MB a layer), the conv and the delta rule with the conv fused in their
// carried window. Such an input is safe when anything but the stream operation immediately
// before wrote it: every kernel waits for its predecessor before it lets the next one launch,
// so the one before that has finished, and a copy or memset in between serialises the stream.
// The model meets the rule by construction (a state is written once a step, hundreds of
// launches apart, and the window shift the fused mixer defers to its output projection is read
// again only by the next step's conv), but nothing checked it. CudaBackend records here what
// each launch of such an op writes and refuses a launch that would read it right after.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace lily::cuda {

class LaunchOrder {
 public:
  // Advanced once for every stream operation: kernel launches through cuda::Stream::issued,
  // the backend's copies, memsets, host reads and graph launches through issued_other().
  uint64_t* counter() { return &issued_; }
  void issued_other() { ++issued_; }

  // The stream operation issued last wrote `buffer` (`what`, in `op`). Only the last such
  // write matters: an input written earlier has at least one operation after it.
  void wrote(const void* buffer, const char* what, const char* op) {
    last_ = Write{buffer, what, op, issued_};
  }

  // `op`'s next launch reads `buffer` (`what`) before its dependency wait: throws
  // std::logic_error if the stream operation issued last wrote it.
  void check_read_before_wait(const void* buffer, const char* what, const char* op) const {
    if (buffer == nullptr || buffer != last_.buffer || last_.after != issued_) return;
    throw std::logic_error(std::string(op) + ": reads its " + what +
                           " before waiting for the launch before it, and that launch (" +
                           last_.op + ") writes the " + last_.what +
                           "; under programmatic dependent launch it may still be running. "
                           "Issue another op (or a copy) between them.");
  }

 private:
  struct Write {
    const void* buffer = nullptr;
    const char* what = "";
    const char* op = "";
    uint64_t after = ~uint64_t{0};  // issued_ right after the writing operation
  };
  uint64_t issued_ = 0;
  Write last_;
};

}  // namespace lily::cuda

// The CUDA backend's options (--cuda-disable) and its per-path call counts; plain C++, no CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lily {

class Backend;

// The code paths of the CUDA backend that can be switched off for comparison (`lily serve|run|
// bench --cuda-disable pdl,stream-gemv,fused-conv,moe-layer`; docs/cuda.md). Each is on by default and
// runs only where the device and the code it runs allow it (CudaBackend::code_path names
// what runs). Held by the backend that was built with them: there are no process globals.
// Every list of the paths (the flag's names, describe(), the bench JSON) comes from
// kCudaPaths below, so a new path is added in one place.
struct CudaOptions {
  bool pdl = true;          // programmatic dependent launch (code built for sm_90+)
  bool stream_gemv = true;  // the bulk-copy lm_head GEMV (sm_90+ code, 144 KB shared memory)
  bool fused_conv = true;   // the conv (and, on 9.0, the gated norm) inside the one-token
                            // delta rule (gated_delta_net_mixer)
  bool moe_layer = true;    // the decode plan's persistent MoE kernel (one launch per layer)

  // The names --cuda-disable takes, comma separated: "pdl, stream-gemv, fused-conv, moe-layer".
  static std::string names();

  // "pdl on, stream-gemv on, fused-conv on, moe-layer on".
  std::string describe() const;

  bool all_on() const;

  // The options with every path named in `list` off ("pdl,fused-conv"; empty: all on).
  // An unknown or empty name, or one named twice, throws std::invalid_argument naming it and
  // the valid names.
  static CudaOptions disabling(std::string_view list);
};

// One switchable path: its --cuda-disable name, its key in the bench JSON
// (device.cuda_options) and its member.
struct CudaPath {
  using Member = bool CudaOptions::*;
  std::string_view flag;
  std::string_view json_key;
  Member on;
};
inline constexpr CudaPath kCudaPaths[] = {
    {"pdl", "pdl", &CudaOptions::pdl},
    {"stream-gemv", "stream_gemv", &CudaOptions::stream_gemv},
    {"fused-conv", "fused_conv", &CudaOptions::fused_conv},
    {"moe-layer", "moe_layer", &CudaOptions::moe_layer},
};
inline constexpr size_t kCudaPathCount = sizeof(kCudaPaths) / sizeof(kCudaPaths[0]);

inline std::string CudaOptions::names() {
  std::string out;
  for (const CudaPath& path : kCudaPaths) {
    if (!out.empty()) out += ", ";
    out += path.flag;
  }
  return out;
}

inline std::string CudaOptions::describe() const {
  std::string out;
  for (const CudaPath& path : kCudaPaths) {
    if (!out.empty()) out += ", ";
    out += path.flag;
    out += this->*path.on ? " on" : " off";
  }
  return out;
}

inline bool CudaOptions::all_on() const {
  for (const CudaPath& path : kCudaPaths) {
    if (!(this->*path.on)) return false;
  }
  return true;
}

inline CudaOptions CudaOptions::disabling(std::string_view list) {
  CudaOptions options;
  if (list.empty()) return options;
  bool seen[kCudaPathCount] = {};
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t comma = list.find(',', begin);
    const size_t end = comma == std::string_view::npos ? list.size() : comma;
    const std::string_view name = list.substr(begin, end - begin);
    size_t which = kCudaPathCount;
    for (size_t i = 0; i < kCudaPathCount; ++i) {
      if (name == kCudaPaths[i].flag) which = i;
    }
    if (which == kCudaPathCount) {
      throw std::invalid_argument("unknown CUDA path \"" + std::string(name) +
                                  "\", expected a comma-separated list of " + names());
    }
    if (seen[which]) {
      throw std::invalid_argument("CUDA path \"" + std::string(name) + "\" is named twice");
    }
    seen[which] = true;
    options.*kCudaPaths[which].on = false;
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return options;
}

// How often each kernel path of the CUDA backend was chosen, counted on the host when an op
// is dispatched: eager calls and calls recorded into a graph. A graph replay does not pass
// through dispatch, so its launches are not counted again (a captured decode step counts
// once, however often it is replayed). Tests read them to assert that the path they name ran.
struct CudaPathCounts {
  uint64_t gemv = 0;                 // matmul, n <= 8: the generic GEMV (one launch)
  uint64_t stream_gemv = 0;          // matmul, n == 1 over a tall Q4 matrix: the bulk-copy GEMV
  uint64_t tensor_core_gemm = 0;     // matmul, n > 8: the tensor-core GEMM
  uint64_t batched_gemv = 0;         // matmul_group in one launch
  uint64_t fused_swiglu_shared = 0;  // expert_swiglu_with_shared in one launch
  uint64_t fused_route_swiglu = 0;   // route_expert_swiglu in one launch (routing inside)
  uint64_t grouped_moe = 0;          // expert_swiglu / expert_down_combine, n > 8: grouped GEMMs
  uint64_t tensor_core_decode_attention = 0;  // attention, n == 1, bf16 cache, head_dim 256, groups of 8
  uint64_t int8_tensor_core_decode_attention = 0;  // the same shape over an int8 cache
  uint64_t fused_conv_delta = 0;     // gated_delta_net_mixer, n == 1: conv inside the delta rule
  uint64_t gated_norm_in_delta = 0;  // ... and its gated norm in the same launch (clusters, 9.0)
  uint64_t pdl_launches = 0;         // kernels launched with programmatic dependent launch
};

// The counts of a CUDA backend; std::invalid_argument for any other backend.
const CudaPathCounts& cuda_path_counts(const Backend& backend);

}  // namespace lily

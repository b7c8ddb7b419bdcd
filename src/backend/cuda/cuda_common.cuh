// Shared device helpers of the CUDA backend: error checks, MLX affine dequantisation, warp sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_ops.h"

namespace lily::cuda {

// Whether `status` leaves the CUDA context unusable for the rest of the process ("sticky"
// errors: an illegal address, a trap, an uncorrectable ECC error...): every later call
// returns it again, so nothing on this device can run any more.
bool poisons_context(cudaError_t status);

// Throws, naming the call, file and line: DeviceFault (core/error.h) when the error poisons
// the context, std::runtime_error otherwise (a bad launch configuration, out of memory...).
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);

#define LILY_CUDA_CHECK(call)                                                 \
  do {                                                                        \
    const cudaError_t lily_status_ = (call);                                  \
    if (lily_status_ != cudaSuccess) {                                        \
      ::lily::cuda::throw_cuda_error(lily_status_, #call, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

// After a kernel launch: a bad configuration shows up here, not at a later sync.
#define LILY_CUDA_LAUNCH_CHECK() LILY_CUDA_CHECK(cudaGetLastError())

// ---- programmatic dependent launch ------------------------------------------------------
// A decode step is ~400 dependent kernels of a few microseconds each, so the gap between one
// kernel's end and the next one's start is a large part of the step. With programmatic
// dependent launch (compute capability 9.0+), every kernel of this backend is launched with
// the programmatic-serialization attribute: it may start before its predecessor in the stream
// has finished. Contract, for every kernel launched through `launch`:
//   * before `grid_dependency_wait()` it may only read memory no kernel writes (weights), or
//     memory that the launch just before it does not write (a recurrent state, a conv window:
//     written one step earlier), which CudaBackend checks with LaunchOrder (launch_order.h);
//   * every thread that reads or writes activations calls it first, and every block calls
//     it before it exits (so a kernel never completes before the one it follows: completion
//     stays ordered along the stream, which later kernels rely on).
// `allow_dependent_launch()` lets the next kernel launch before this one ends; kernels call
// it once their main loop is done (the next kernel's blocks then land on SMs as this one's
// finish), except the small ones of pure latency (norms, attention's q/k prepare and combine,
// the one-token delta rule with the gated norm inside), which call it right after their wait,
// so that the GEMV after them loads its weights while they run (+5-7% decode at 256 on an
// H100, docs/perf/bench-cuda.md). Never before the wait:
// calling it at the very start measured slower (273 vs 318 tok/s on an H200: the next
// kernels' waiting blocks fill the SMs early and the chain of launches runs ahead), and the
// first rule above holds only because a kernel lets the next one launch after it has waited
// (so the launch before the one just before has finished).
// Whether the attribute is set comes from the Stream the backend passes (cuda_ops.h): off for
// code built below sm_90 and with --cuda-disable pdl (to measure what it buys); the
// instructions are no-ops then.

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Pulls a weight line into L2 ahead of use (before grid_dependency_wait: weights are
// constant), so the first loads after the sync hit L2 instead of device memory.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Launches `kernel` on `stream`, with the programmatic-serialization attribute when `pdl`
// (counted in *stream.pdl_launches), in thread-block clusters of `cluster` blocks when that is
// more than one (compute capability 9.0), and counts it in *stream.issued (LaunchOrder).
template <typename... Params, typename... Args>
void launch_with(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                 const Stream& stream, bool pdl, dim3 cluster, Args... args) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (pdl) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster.x;
    attributes[count].val.clusterDim.y = cluster.y;
    attributes[count++].val.clusterDim.z = cluster.z;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream.handle;
  config.attrs = attributes;
  config.numAttrs = count;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so that the next launch check does not report it again
    LILY_CUDA_CHECK(status);
  }
  if (pdl && stream.pdl_launches != nullptr) ++*stream.pdl_launches;
  if (stream.issued != nullptr) ++*stream.issued;
}

// The launch of every kernel that follows the PDL contract above: with the attribute when
// stream.pdl.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            const Stream& stream, Args... args) {
  launch_with(kernel, grid, block, shared_bytes, stream, stream.pdl, dim3(1, 1, 1), args...);
}

// The same in thread-block clusters of `cluster` blocks (compute capability 9.0 only).
template <typename... Params, typename... Args>
void launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block,
                    size_t shared_bytes, const Stream& stream, Args... args) {
  launch_with(kernel, grid, block, shared_bytes, stream, stream.pdl, cluster, args...);
}

// The launch of a kernel that does not call grid_dependency_wait() (the prefill's GEMMs and
// attention, the grouped MoE and its sort, the conv's window update): never with the
// attribute, so it starts only when the kernel before it has completed, as `<<<...>>>` would;
// counted like every other launch, so that no launch can be left out of LaunchOrder's count.
template <typename... Params, typename... Args>
void launch_serial(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   const Stream& stream, Args... args) {
  launch_with(kernel, grid, block, shared_bytes, stream, false, dim3(1, 1, 1), args...);
}

// A stream operation that is not a kernel launch: counted in stream.issued as the launches
// count themselves (LaunchOrder).
inline void count_issued(const Stream& stream) {
  if (stream.issued != nullptr) ++*stream.issued;
}

// An asynchronous copy or memset on `stream`, counted (the backend's and the kernel files' one
// way to issue them, so that none is left out of LaunchOrder's count).
inline void copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                       const Stream& stream) {
  LILY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream.handle));
  count_issued(stream);
}
inline void zero_async(void* dst, size_t bytes, const Stream& stream) {
  LILY_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream.handle));
  count_issued(stream);
}

// An attribute of the current device, e.g. cudaDevAttrMultiProcessorCount (callers cache it:
// the backend only ever uses device 0).
inline int device_attribute(cudaDeviceAttr attribute) {
  int device = 0;
  int value = 0;
  LILY_CUDA_CHECK(cudaGetDevice(&device));
  LILY_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

// The current device's SM count, queried once (the launchers size grids by it).
inline int sm_count() {
  static const int count = device_attribute(cudaDevAttrMultiProcessorCount);
  return count;
}

inline constexpr int kGroupSize = 64;  // MLX affine group size, the only one the model uses

// Whether p may be read and written as float4 / uint4 (nullptr counts as aligned).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// 1 / sqrt(mean square + eps) of a row of `dim` values whose squares sum to sum_sq: the RMSNorm
// scale that norms.cu and the persistent kernels' own norms share.
__device__ __forceinline__ float rms_scale(float sum_sq, int64_t dim, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(dim) + eps);
}

// Element j (0..7) of a Q4 word: MLX packs element 8w+j into bits 4j..4j+3 of word w.
__device__ __forceinline__ float q4_at(uint32_t word, int j) {
  return static_cast<float>((word >> (4 * j)) & 0xFu);
}

// Element j (0..3) of a Q8 word: bits 8j..8j+7.
__device__ __forceinline__ float q8_at(uint32_t word, int j) {
  return static_cast<float>((word >> (8 * j)) & 0xFFu);
}

// Dequantised value exactly as MLX (and the CPU backend) computes it in f32: the product
// rounded, then the sum rounded. Not fused: an FMA would differ in the last bit.
__device__ __forceinline__ float dequant(float q, float scale, float bias) {
  return __fadd_rn(__fmul_rn(scale, q), bias);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }

}  // namespace lily::cuda

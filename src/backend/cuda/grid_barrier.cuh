// Grid-wide barriers of the persistent kernels (moe_layer.cu, the lab's
// tools/lab/delta_net_layer.cu): a monotonic arrival counter in global memory, and the L2
// loads of data other blocks wrote.
#pragma once

#include <cuda_runtime.h>

namespace lily::cuda {

// Data written by another block of this launch is read through L2 (ld.global.cg): the
// non-coherent path (__ldg) and L1 may hold stale copies.
__device__ __forceinline__ float load_shared_result(const float* p) { return __ldcg(p); }

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Every block of the grid waits in grid_barrier until all have arrived. The counter only grows
// (never reset): arrival `a` belongs to barrier instance a / gridDim.x, and a block cannot
// arrive at instance i + 1 before all have arrived at i. Every launch on one counter must use
// the same grid size (the plan fixes it), and blocks must be co-resident (checked at plan
// build). It comes in two halves, so that a block can issue loads that depend on no other
// block (weights) between its arrival and its wait: grid_arrive's release orders only what came
// before it, so such loads overlap the wait instead of delaying the arrival. grid_arrive
// returns the count to wait for (meaningful in thread 0). A release add and an acquire load
// replaced __threadfence + atomicAdd and a trailing __threadfence (two fence.sc.gpu): decode
// 449.2, 447.2 against 443.3, 443.2 tok/s at 256 on an H100 (docs/perf/bench-cuda.md).
__device__ __forceinline__ unsigned long long grid_arrive(unsigned long long* counter) {
  __syncthreads();
  unsigned long long target = 0;
  if (threadIdx.x == 0) {
    // A release add: the block's writes (ordered before thread 0 by the __syncthreads) become
    // visible before the arrival, without a separate fence.sc (__threadfence) round trip.
    unsigned long long arrived;
    asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;"
                 : "=l"(arrived)
                 : "l"(counter)
                 : "memory");
    target = (arrived / gridDim.x + 1) * gridDim.x;
  }
  return target;
}
__device__ __forceinline__ void grid_wait(unsigned long long* counter, unsigned long long target) {
  if (threadIdx.x == 0) {
    while (load_acquire(counter) < target) {
    }
    // No fence after it: the acquire load orders what follows, and the __syncthreads below
    // passes that on to the block's other threads (which read other blocks' data via L2).
  }
  __syncthreads();
}
__device__ __forceinline__ void grid_barrier(unsigned long long* counter) {
  grid_wait(counter, grid_arrive(counter));
}

}  // namespace lily::cuda

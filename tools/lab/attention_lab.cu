// Kernel lab (not a test, not built by default): the one-token decode attention at 131,072 keys
// as a step runs it (per layer the split kernel, then the split combine, launched with
// programmatic dependent launch inside a CUDA graph over 10 layers, each with its own cache),
// for several split counts, on the int8 cache (decode_tc_int8_kernel) and the bf16 cache
// (decode_tc_kernel). It prints, per layer: split kernel + combine, split kernel alone, and the
// combine alone over the partials, so the cost of a split and of the combine in a graph is read
// in seconds instead of through two 131,072-token prefills per `lily bench` arm.
// Build: cmake -DLILY_BUILD_LAB=ON, target attention_lab; run: build/attention_lab.
//
// The kernels live in attention.cu's anonymous namespace, so this translation unit includes it
// (and does not link the backend library's copy of it).
#include "backend/cuda/attention.cu"
#include "lab_support.cuh"

// A named namespace: an unnamed one here would make the CUDA stubs' references to attention.cu's
// unnamed-namespace kernels ambiguous.
namespace lily::cuda::attention_lab {

using namespace lily::cuda::lab;

constexpr int kLayers = 10;  // the model's attention layers: each graph streams 10 caches from DRAM
constexpr int64_t kPos = 131072;
constexpr int64_t kCapacity = kPos + 8;
constexpr int kKvHeads = 2;
constexpr int kQHeads = kKvHeads * kTcG;
constexpr int kReps = 20;

struct Caches {
  void* keys;
  void* values;
  float* key_scales;    // int8 only
  float* value_scales;  // int8 only
};

__global__ void finite_bf16(uint32_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    p[i] &= 0xBFFFBFFFu;  // exponent's top bit off in both halves: |x| < 2, finite
  }
}

// One layer's caches: random codes (int8) or random finite bf16 values, positive int8 scales.
Caches make_caches(bool int8, uint64_t seed) {
  const int64_t elements = kCapacity * kKvHeads * kTcD;
  const int64_t bytes = elements * (int8 ? 1 : 2);
  Caches c{};
  c.keys = dev<uint32_t>(bytes / 4);
  c.values = dev<uint32_t>(bytes / 4);
  fill_words<<<1024, 256>>>(static_cast<uint32_t*>(c.keys), bytes / 4, seed);
  fill_words<<<1024, 256>>>(static_cast<uint32_t*>(c.values), bytes / 4, seed + 1);
  if (!int8) {
    // Random bits are random bf16 values, NaNs and infinities among them: keep them finite.
    finite_bf16<<<1024, 256>>>(static_cast<uint32_t*>(c.keys), bytes / 4);
    finite_bf16<<<1024, 256>>>(static_cast<uint32_t*>(c.values), bytes / 4);
  } else {
    c.key_scales = dev<float>(kCapacity * kKvHeads);
    c.value_scales = dev<float>(kCapacity * kKvHeads);
    fill_f32<<<1024, 256>>>(c.key_scales, kCapacity * kKvHeads, 0.01f, 0.0001f);
    fill_f32<<<1024, 256>>>(c.value_scales, kCapacity * kKvHeads, 0.01f, 0.0001f);
  }
  return c;
}

int run() {
  cudaStream_t raw;
  LILY_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  const Stream s{raw, /*pdl=*/true, /*pdl_launches=*/nullptr};  // PDL on, as the backend on sm_90
  LILY_CUDA_CHECK(cudaFuncSetAttribute(decode_tc_int8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kT8SmemBytes)));
  LILY_CUDA_CHECK(cudaFuncSetAttribute(decode_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kTcSmemBytes)));
  float* qg = dev<float>(int64_t(kQHeads) * 2 * kTcD);
  float* k = dev<float>(int64_t(kKvHeads) * kTcD);
  float* v = dev<float>(int64_t(kKvHeads) * kTcD);
  float* out = dev<float>(int64_t(kQHeads) * kTcD);
  fill_f32<<<64, 256>>>(qg, int64_t(kQHeads) * 2 * kTcD, -1.0f, 0.02f);
  fill_f32<<<8, 256>>>(k, int64_t(kKvHeads) * kTcD, -0.5f, 0.01f);
  fill_f32<<<8, 256>>>(v, int64_t(kKvHeads) * kTcD, -0.7f, 0.015f);
  int32_t* pos = dev<int32_t>(1);
  const int32_t pos_host = static_cast<int32_t>(kPos);
  LILY_CUDA_CHECK(cudaMemcpy(pos, &pos_host, sizeof(pos_host), cudaMemcpyHostToDevice));
  const int max_splits = 4 * sm_count();
  float* part_o = dev<float>(int64_t(kQHeads) * max_splits * kTcD);
  float* part_ml = dev<float>(int64_t(kQHeads) * max_splits * 2);
  const float scale = 1.0f / 16.0f;  // 1 / sqrt(256)

  for (const bool int8 : {true, false}) {
    std::vector<Caches> caches;
    for (int l = 0; l < kLayers; ++l) {
      caches.push_back(make_caches(int8, 7919u * uint64_t(l + 1)));
    }
    LILY_CUDA_CHECK(cudaDeviceSynchronize());
    auto split_kernel = [&](const Caches& c, int splits) {
      if (int8) {
        launch(decode_tc_int8_kernel, dim3(kKvHeads, static_cast<unsigned>(splits)), kT8Threads, kT8SmemBytes, s, qg, k,
               v, static_cast<int8_t*>(c.keys), static_cast<int8_t*>(c.values), c.key_scales, c.value_scales,
               kCapacity, kKvHeads, int64_t(-1), pos, splits, scale, part_o, part_ml);
      } else {
        launch(decode_tc_kernel, dim3(kKvHeads, static_cast<unsigned>(splits)), kTcThreads, kTcSmemBytes, s, qg, k, v,
               static_cast<__nv_bfloat16*>(c.keys), static_cast<__nv_bfloat16*>(c.values), kCapacity, kKvHeads,
               int64_t(-1), pos, splits, scale, part_o, part_ml);
      }
    };
    auto combine = [&](int splits) {
      launch(decode_combine_kernel<kTcD>, kQHeads, kTcD, 0, s, qg, kCapacity, kTcG, int64_t(-1), pos, splits,
             part_o, part_ml, out);
    };
    // The backend's own choice first (launch_decode's): 2 blocks an SM for int8, 1 for bf16.
    const int backend_splits =
        int8 ? decode_tc_splits(kCapacity, kKvHeads, 2) : decode_tc_splits(kCapacity, kKvHeads);
    std::printf("%s cache, %lld keys, %d layers, %d SMs (backend's split count: %d)\n", int8 ? "int8" : "bf16",
                static_cast<long long>(kPos + 1), kLayers, sm_count(), backend_splits);
    for (int splits : {backend_splits, 16, 32, 64, 96, 128, 198, 264}) {
      if (splits > max_splits) continue;
      cudaGraphExec_t both = capture(raw, [&] {
        for (const Caches& c : caches) {
          split_kernel(c, splits);
          combine(splits);
        }
      });
      cudaGraphExec_t alone = capture(raw, [&] {
        for (const Caches& c : caches) split_kernel(c, splits);
      });
      cudaGraphExec_t merges = capture(raw, [&] {
        for (int l = 0; l < kLayers; ++l) combine(splits);
      });
      const float t_both = time_graph(both, raw, kReps) / kLayers;
      const float t_alone = time_graph(alone, raw, kReps) / kLayers;
      const float t_merge = time_graph(merges, raw, kReps) / kLayers;
      std::printf("  splits %3d: split kernel + combine %7.2f us/layer | split kernel alone %7.2f | "
                  "combine alone %6.2f | difference %6.2f\n",
                  splits, t_both, t_alone, t_merge, t_both - t_alone);
      LILY_CUDA_CHECK(cudaGraphExecDestroy(both));
      LILY_CUDA_CHECK(cudaGraphExecDestroy(alone));
      LILY_CUDA_CHECK(cudaGraphExecDestroy(merges));
    }
    for (Caches& c : caches) {
      cudaFree(c.keys);
      cudaFree(c.values);
      if (int8) {
        cudaFree(c.key_scales);
        cudaFree(c.value_scales);
      }
    }
  }
  LILY_CUDA_CHECK(cudaGetLastError());
  return 0;
}

}  // namespace lily::cuda::attention_lab

int main() { return lily::cuda::attention_lab::run(); }

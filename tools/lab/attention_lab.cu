// Kernel lab (not a test, not built by default): the one-token decode attention at 131,072 keys
// as a step runs it (per layer the split kernel, then the split combine, launched with
// programmatic dependent launch inside a CUDA graph over 10 layers, each with its own cache),
// for several split counts, on the int8 cache (decode_tc_int8_kernel), the bf16 cache
// (decode_tc_kernel) and the f32 cache (decode_split_kernel, CUDA cores). It prints, per layer:
// split kernel + combine, split kernel alone, the combine alone over the partials, and the same
// for the combine as it was before it batched its loads (commit 864d86c, kept here to compare),
// whose output it checks bit for bit against the backend's; so the cost of a split and of the
// combine in a graph is read in seconds instead of through two 131,072-token prefills per
// `lily bench` arm.
// Build: cmake -DLILY_BUILD_LAB=ON, target attention_lab; run: build/attention_lab.
//
// The kernels live in attention.cu's anonymous namespace, so this translation unit includes it
// (and does not link the backend library's copy of it).
#include "backend/cuda/attention.cu"
#include "lab_support.cuh"

#include <cstring>

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

// The split combine as it was at 864d86c: one partial in flight per thread (each split's load
// waits for the loop's previous one), the reference for decode_combine_kernel's bits and time.
template <int D>
__global__ void __launch_bounds__(D)
    combine_before(const float* qg, int64_t capacity, int G, int64_t pos_host,
                   const int32_t* pos_device, int splits, const float* part_o, const float* part_ml,
                   float* out) {
  grid_dependency_wait();
  const int h = blockIdx.x;
  const int d = threadIdx.x;
  float* o = out + static_cast<int64_t>(h) * D;
  const CombineRange r = combine_range(capacity, G, pos_host, pos_device, splits, h);
  if (r.valid == 0) {
    o[d] = NAN;
    return;
  }
  const int valid = r.valid;
  auto at = [&](int sp) { return r.at(sp); };
  float mx = kNegInf;
  for (int sp = 0; sp < valid; ++sp) mx = fmaxf(mx, part_ml[at(sp) * 2]);
  float total = 0.0f;
  float acc = 0.0f;
  for (int sp = 0; sp < valid; ++sp) {
    const float ms = part_ml[at(sp) * 2];
    const float w = ms == kNegInf ? 0.0f : expf(ms - mx);
    total += w * part_ml[at(sp) * 2 + 1];
    acc += w * part_o[at(sp) * D + d];
  }
  const float gate = qg[(static_cast<int64_t>(h) * 2 + 1) * D + d];
  o[d] = acc / total * sigmoidf_(gate);
}

enum class Cache { int8, bf16, f32 };
const char* name(Cache c) {
  return c == Cache::int8 ? "int8" : c == Cache::bf16 ? "bf16" : "f32";
}
int element_bytes(Cache c) {
  return c == Cache::int8 ? 1 : c == Cache::bf16 ? 2 : 4;
}

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

// One layer's caches: random codes (int8), random finite bf16 values, values in [-1, 1) (f32),
// positive int8 scales.
Caches make_caches(Cache type, uint64_t seed) {
  const bool int8 = type == Cache::int8;
  const int64_t elements = kCapacity * kKvHeads * kTcD;
  const int64_t bytes = elements * element_bytes(type);
  Caches c{};
  c.keys = dev<uint32_t>(bytes / 4);
  c.values = dev<uint32_t>(bytes / 4);
  if (type == Cache::f32) {
    fill_f32<<<1024, 256>>>(static_cast<float*>(c.keys), elements, -1.0f, 0.02f);
    fill_f32<<<1024, 256>>>(static_cast<float*>(c.values), elements, -0.9f, 0.019f);
    return c;
  }
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
  LILY_CUDA_CHECK(cudaFuncSetAttribute(decode_tc_int8_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
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

  std::vector<float> bits_new(size_t(kQHeads) * kTcD), bits_before(size_t(kQHeads) * kTcD);
  for (const Cache type : {Cache::int8, Cache::bf16, Cache::f32}) {
    const bool int8 = type == Cache::int8;
    std::vector<Caches> caches;
    for (int l = 0; l < kLayers; ++l) {
      caches.push_back(make_caches(type, 7919u * uint64_t(l + 1)));
    }
    LILY_CUDA_CHECK(cudaDeviceSynchronize());
    auto split_kernel = [&](const Caches& c, int splits) {
      if (type == Cache::int8) {
        launch(decode_tc_int8_kernel, dim3(kKvHeads, static_cast<unsigned>(splits)), kT8Threads,
               kT8SmemBytes, s, qg, k, v, static_cast<int8_t*>(c.keys),
               static_cast<int8_t*>(c.values), c.key_scales, c.value_scales, kCapacity, kKvHeads,
               int64_t(-1), pos, splits, scale, part_o, part_ml);
      } else if (type == Cache::bf16) {
        launch(decode_tc_kernel, dim3(kKvHeads, static_cast<unsigned>(splits)), kTcThreads, kTcSmemBytes, s, qg, k, v,
               static_cast<__nv_bfloat16*>(c.keys), static_cast<__nv_bfloat16*>(c.values), kCapacity, kKvHeads,
               int64_t(-1), pos, splits, scale, part_o, part_ml);
      } else {
        launch(decode_split_kernel<kTcD, kTcG, float>,
               dim3(kKvHeads, static_cast<unsigned>(splits)), kDecodeThreads, 0, s, qg, k, v,
               static_cast<float*>(c.keys), static_cast<float*>(c.values),
               static_cast<const float*>(nullptr), static_cast<const float*>(nullptr), kCapacity,
               kQHeads, kKvHeads, kTcG, int64_t(-1), pos, splits, scale, part_o, part_ml);
      }
    };
    auto combine = [&](int splits) {
      launch(decode_combine_kernel<kTcD>, kQHeads, kTcD, 0, s, qg, kCapacity, kTcG, int64_t(-1), pos, splits,
             part_o, part_ml, out);
    };
    auto combine_old = [&](int splits) {
      launch(combine_before<kTcD>, kQHeads, kTcD, 0, s, qg, kCapacity, kTcG, int64_t(-1), pos,
             splits, part_o, part_ml, out);
    };
    // The backend's own choice first (launch_decode's).
    const int backend_splits =
        type == Cache::f32 ? decode_splits(kCapacity) : decode_tc_splits(kCapacity, kKvHeads);
    std::printf(
        "%s cache, %lld keys, %d layers, %d SMs (backend's split count: %d); us per layer\n",
        name(type), static_cast<long long>(kPos + 1), kLayers, sm_count(), backend_splits);
    for (int splits : {backend_splits, 32, 48, 56, 64, 66, 80, 96, 128, 132, 198, 264}) {
      if (splits > max_splits) continue;
      // The two combines' outputs over the same partials, bit for bit.
      // (The stream does not synchronise with the legacy default stream of cudaMemcpy.)
      split_kernel(caches[0], splits);
      combine(splits);
      LILY_CUDA_CHECK(cudaStreamSynchronize(raw));
      LILY_CUDA_CHECK(
          cudaMemcpy(bits_new.data(), out, bits_new.size() * 4, cudaMemcpyDeviceToHost));
      combine_old(splits);
      LILY_CUDA_CHECK(cudaStreamSynchronize(raw));
      LILY_CUDA_CHECK(
          cudaMemcpy(bits_before.data(), out, bits_before.size() * 4, cudaMemcpyDeviceToHost));
      const bool same = std::memcmp(bits_new.data(), bits_before.data(), bits_new.size() * 4) == 0;
      cudaGraphExec_t both = capture(raw, [&] {
        for (const Caches& c : caches) {
          split_kernel(c, splits);
          combine(splits);
        }
      });
      cudaGraphExec_t both_old = capture(raw, [&] {
        for (const Caches& c : caches) {
          split_kernel(c, splits);
          combine_old(splits);
        }
      });
      cudaGraphExec_t alone = capture(raw, [&] {
        for (const Caches& c : caches) split_kernel(c, splits);
      });
      cudaGraphExec_t merges = capture(raw, [&] {
        for (int l = 0; l < kLayers; ++l) combine(splits);
      });
      cudaGraphExec_t merges_old = capture(raw, [&] {
        for (int l = 0; l < kLayers; ++l) combine_old(splits);
      });
      const float t_both = time_graph(both, raw, kReps) / kLayers;
      const float t_both_old = time_graph(both_old, raw, kReps) / kLayers;
      const float t_alone = time_graph(alone, raw, kReps) / kLayers;
      const float t_merge = time_graph(merges, raw, kReps) / kLayers;
      const float t_merge_old = time_graph(merges_old, raw, kReps) / kLayers;
      std::printf(
          "  splits %3d: kernel + combine %7.2f (before %7.2f) | kernel alone %7.2f | "
          "combine alone %6.2f (before %6.2f) | outputs %s\n",
          splits, t_both, t_both_old, t_alone, t_merge, t_merge_old,
          same ? "bit-identical" : "DIFFER");
      for (cudaGraphExec_t g : {both, both_old, alone, merges, merges_old})
        LILY_CUDA_CHECK(cudaGraphExecDestroy(g));
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

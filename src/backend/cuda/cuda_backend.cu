// The CUDA backend: device memory, weight upload, op dispatch to the kernels, graph capture.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/op_contract.h"
#include "core/bf16.h"

namespace lily {

namespace {

// What the CUDA backend refuses beyond the shared contract (backend/op_contract.h, checked
// first): its kernels' limits and its own calls. Never a fallback.
void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("cuda ") + op + ": " + what);
}

constexpr size_t kAlign = 256;
size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

__global__ void add_i32_kernel(int32_t* value, int32_t delta) {
  cuda::grid_dependency_wait();
  *value += delta;
}


// cudaMalloc of `bytes`; out of memory is an error naming `what`, the bytes asked for and
// the free memory (the runtime's own text says neither).
void* malloc_or_explain(size_t bytes, const char* what) {
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so later calls start clean
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    std::string message = "CUDA out of memory: ";
    message += what;
    message += " needs " + std::to_string(bytes >> 20) + " MiB, ";
    message += std::to_string(free_bytes >> 20) + " MiB free of " +
               std::to_string(total_bytes >> 20) +
               " MiB (lower --max-seq or --cache-snapshots, or free the GPU)";
    throw std::runtime_error(message);
  }
  LILY_CUDA_CHECK(status);
  return ptr;
}

// The kernels' shapes, from dims the contract has accepted.
cuda::AttentionShape attention_shape(const AttentionDims& d, const char* op) {
  // The kernels hold one head row per warp lane group: 64, 128 or 256 values.
  require(d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256, op,
          "head_dim must be 64, 128 or 256 on CUDA, got " + std::to_string(d.head_dim));
  return {static_cast<int>(d.q_heads), static_cast<int>(d.kv_heads), static_cast<int>(d.head_dim),
          static_cast<int>(d.rotary_dim), d.rope_theta};
}

cuda::DeltaNetShape delta_net_shape(const GatedDeltaNetDims& d, const char* op) {
  const auto supported = [](int64_t dim) { return dim == 32 || dim == 64 || dim == 128; };
  require(supported(d.key_dim) && supported(d.value_dim), op,
          "key_dim and value_dim must be 32, 64 or 128 on CUDA");
  require(d.conv_kernel <= 8, op, "conv_kernel must be at most 8 on CUDA, got " +
                                      std::to_string(d.conv_kernel));
  return {static_cast<int>(d.key_heads), static_cast<int>(d.value_heads), static_cast<int>(d.key_dim),
          static_cast<int>(d.value_dim), static_cast<int>(d.conv_kernel)};
}

}  // namespace

// ---- workspace --------------------------------------------------------------------------

CudaWorkspace::~CudaWorkspace() {
  for (Slot& slot : slots_) cudaFree(slot.ptr);
  for (void* ptr : retired_) cudaFree(ptr);
}

void* CudaWorkspace::get(int slot, size_t bytes) {
  require(slot >= 0 && slot < cuda::kWsCount, "workspace", "slot out of range");
  Slot& s = slots_[slot];
  if (bytes <= s.bytes) return s.ptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  LILY_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
  if (status != cudaStreamCaptureStatusNone) {
    throw std::logic_error("cuda workspace: slot " + std::to_string(slot) + " must grow to " +
                           std::to_string(bytes) +
                           " bytes during graph capture; the eager step should have sized it");
  }
  void* ptr = malloc_or_explain(round_up(bytes), "scratch");
  if (s.ptr != nullptr) retired_.push_back(s.ptr);  // a captured graph may still use it
  s.ptr = ptr;
  s.bytes = round_up(bytes);
  bytes_ += s.bytes;
  return ptr;
}

// ---- device, memory ----------------------------------------------------------------------

bool cuda_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    if (why != nullptr) {
      *why = status != cudaSuccess ? std::string("no CUDA driver or device (") +
                                         cudaGetErrorString(status) + ")"
                                   : "no CUDA device";
    }
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    if (why != nullptr) *why = "cannot read the properties of CUDA device 0";
    return false;
  }
  if (prop.major < 8) {
    if (why != nullptr) {
      *why = std::string(prop.name) + " has compute capability " + std::to_string(prop.major) +
             "." + std::to_string(prop.minor) + "; lily needs 8.0 or newer";
    }
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_cuda_backend(uint64_t required_bytes, const CudaOptions& options) {
  std::string why;
  if (!cuda_available(&why)) throw std::runtime_error("CUDA unusable: " + why);
  auto backend = std::make_unique<CudaBackend>(options);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  backend->memory_info(&free_bytes, &total_bytes);
  if (required_bytes > free_bytes) {
    throw std::runtime_error(
        "CUDA device " + backend->device_name() + " has " + std::to_string(free_bytes >> 20) +
        " MiB free of " + std::to_string(total_bytes >> 20) + " MiB; weights + state + scratch need " +
        std::to_string(required_bytes >> 20) + " MiB (lower --max-seq or use --device cpu)");
  }
  return backend;
}

const CudaPathCounts& cuda_path_counts(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (cuda == nullptr) {
    throw std::invalid_argument("cuda_path_counts: the " + backend.name() +
                                " backend is not the CUDA backend");
  }
  return cuda->path_counts();
}

CudaBackend::CudaBackend(const CudaOptions& options) : options_(options) {
  LILY_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  LILY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  device_name_ = prop.name;
  // Which of the build's codes the device runs: machine code for its architecture (sm_80,
  // 86, 89, 90a, 120) or, on any other GPU, the compute_80 PTX that the driver JIT-compiles.
  // The Hopper paths exist only in code built for sm_90+, so they are chosen by the code's
  // architecture, not by the device's alone.
  cudaFuncAttributes code{};
  LILY_CUDA_CHECK(cudaFuncGetAttributes(&code, add_i32_kernel));
  compute_capability_ = prop.major * 10 + prop.minor;
  code_binary_version_ = code.binaryVersion;
  code_ptx_version_ = code.ptxVersion;
  LILY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // Programmatic dependent launch needs 9.0 on both; --cuda-disable pdl turns it off to
  // measure what it buys.
  launch_ = cuda::Stream{stream_, options_.pdl && prop.major >= 9 && code.ptxVersion >= 90,
                         &counts_.pdl_launches, order_.counter()};
  // The lm_head's bulk copies need 9.0 and room for their tiles in shared memory;
  // --cuda-disable stream-gemv keeps the generic GEMV.
  stream_gemv_.enabled =
      options_.stream_gemv && prop.major >= 9 && cuda::stream_gemv_built_for_device();
  stream_gemv_.max_shared_bytes = prop.sharedMemPerBlockOptin;
  // The gated norm inside the fused mixer's delta rule launch needs thread-block clusters.
  gated_norm_in_delta_ =
      options_.fused_conv && prop.major >= 9 && cuda::gated_delta_norm_built_for_device();
  workspace_ = std::make_unique<CudaWorkspace>(stream_);
  LILY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned_reads_), 2 * sizeof(int32_t),
                                cudaHostAllocDefault));
  for (cudaEvent_t& event : read_events_) {
    LILY_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  LILY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned_words_),
                                2 * TokenRecordLayout::kWords * sizeof(int32_t),
                                cudaHostAllocDefault));
  for (cudaEvent_t& event : word_events_) {
    LILY_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
}

CudaBackend::~CudaBackend() {
  // Destructors must not throw: errors here are ignored (the process is tearing down).
  cudaStreamSynchronize(stream_);
  for (cudaGraphExec_t graph : graphs_) cudaGraphExecDestroy(graph);
  workspace_.reset();
  for (void* ptr : allocations_) cudaFree(ptr);
  for (cudaEvent_t event : read_events_) cudaEventDestroy(event);
  for (cudaEvent_t event : word_events_) cudaEventDestroy(event);
  cudaFreeHost(pinned_reads_);
  cudaFreeHost(pinned_words_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::memory_info(size_t* free_bytes, size_t* total_bytes) const {
  LILY_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

bool CudaBackend::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  LILY_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
  return status != cudaStreamCaptureStatusNone;
}

std::string CudaBackend::code_path() const {
  const auto version = [](int v) { return std::to_string(v / 10) + "." + std::to_string(v % 10); };
  std::string path = "compute capability " + version(compute_capability_) + ", ";
  if (code_ptx_version_ < code_binary_version_) {
    path += "JIT-compiled from the compute_" + std::to_string(code_ptx_version_) + " PTX";
  } else {
    path += "sm_" + std::to_string(code_binary_version_) + " machine code";
  }
  path += launch_.pdl ? "; programmatic dependent launch on" : "; programmatic dependent launch off";
  // The lm_head's rows are 2048 values (hidden_size).
  path += cuda::stream_gemv_enabled_for(2048, stream_gemv_) ? ", bulk-copy lm_head GEMV on"
                                                           : ", bulk-copy lm_head GEMV off";
  path += options_.fused_conv ? ", conv inside the delta rule on" : ", conv inside the delta rule off";
  path += gated_norm_in_delta_ ? ", gated norm inside the delta rule on"
                               : ", gated norm inside the delta rule off";
  path += cuda::tensor_core_decode_attention_fits() ? ", bf16 decode attention on tensor cores"
                                                    : ", bf16 decode attention on CUDA cores";
  // What was asked for, beside what runs: a path the device cannot run stays off even when on.
  path += "; options: " + options_.describe();
  return path;
}

void CudaBackend::abort_capture() noexcept {
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);  // ends it even when the capture was invalidated
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();  // a capture error is not sticky: later calls start clean
}

void CudaBackend::lose_device(FaultSite /*site*/) {
  // Recorded into the graph during a capture (the fault then comes at its replay), queued
  // behind the graph at a replay, run at once in an eager step.
  cuda::launch_poison_context(launch_);
}

void* CudaBackend::device_alloc(size_t bytes) {
  require(!capturing(), "alloc", "no allocation during graph capture");
  void* ptr = malloc_or_explain(round_up(std::max<size_t>(bytes, 1)), "a buffer");
  allocations_.push_back(ptr);
  allocated_ += round_up(std::max<size_t>(bytes, 1));
  // Zero-filled, as the contract says; synchronous, but allocation only happens at set-up.
  cuda::zero_async(ptr, round_up(std::max<size_t>(bytes, 1)), launch_);
  LILY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ptr;
}

float* CudaBackend::alloc(size_t count) { return static_cast<float*>(device_alloc(count * 4)); }
int32_t* CudaBackend::alloc_i32(size_t count) {
  return static_cast<int32_t*>(device_alloc(count * 4));
}

bool CudaBackend::serves_kv_cache(KvDtype dtype) const {
  return dtype == KvDtype::f32 || dtype == KvDtype::bf16 || dtype == KvDtype::int8;
}

KvCacheView CudaBackend::alloc_kv_cache(size_t count, KvDtype dtype, int64_t head_dim) {
  require(serves_kv_cache(dtype), "alloc_kv_cache", "unknown KV cache dtype");
  void* ptr = device_alloc(count * kv_dtype_bytes(dtype));  // 256-byte aligned: 16-byte loads
  switch (dtype) {
    case KvDtype::f32: return KvCacheView(static_cast<float*>(ptr));
    case KvDtype::bf16: return KvCacheView::bf16(static_cast<uint16_t*>(ptr));
    case KvDtype::int8: break;
  }
  require(head_dim > 0 && count % static_cast<size_t>(head_dim) == 0, "alloc_kv_cache",
          "an int8 KV cache needs rows of head_dim values (head_dim " + std::to_string(head_dim) + ")");
  auto* scales = static_cast<float*>(device_alloc(count / static_cast<size_t>(head_dim) * sizeof(float)));
  return KvCacheView::int8(static_cast<int8_t*>(ptr), scales, head_dim);
}

void CudaBackend::zero_kv_cache(const KvCacheView& cache, size_t count) {
  require(cache.data != nullptr, "zero_kv_cache", "null cache");
  cuda::zero_async(cache.data, count * kv_dtype_bytes(cache.dtype), launch_);
  if (const size_t sb = cache.scale_count(count) * sizeof(float)) {
    cuda::zero_async(cache.scales, sb, launch_);
  }
}

// Host layout (backend.h): the elements, then an int8 cache's row scales.
void CudaBackend::copy_kv_to_host(const KvCacheView& cache, size_t count, void* host_dst) {
  require(cache.data != nullptr && host_dst != nullptr, "copy_kv_to_host", "null buffers");
  const size_t eb = count * kv_dtype_bytes(cache.dtype);
  cuda::copy_async(host_dst, cache.data, eb, cudaMemcpyDeviceToHost, launch_);
  if (const size_t sb = cache.scale_count(count) * sizeof(float)) {
    cuda::copy_async(static_cast<char*>(host_dst) + eb, cache.scales, sb, cudaMemcpyDeviceToHost,
                     launch_);
  }
  LILY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_kv_from_host(const void* host_src, size_t count, const KvCacheView& cache) {
  require(cache.data != nullptr && host_src != nullptr, "copy_kv_from_host", "null buffers");
  const size_t eb = count * kv_dtype_bytes(cache.dtype);
  cuda::copy_async(cache.data, host_src, eb, cudaMemcpyHostToDevice, launch_);
  if (const size_t sb = cache.scale_count(count) * sizeof(float)) {
    cuda::copy_async(cache.scales, static_cast<const char*>(host_src) + eb, sb,
                     cudaMemcpyHostToDevice, launch_);
  }
  LILY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::zero(float* buffer, size_t count) {
  cuda::zero_async(buffer, count * sizeof(float), launch_);
}

void CudaBackend::copy_to_host(const float* src, size_t count, float* host_dst) {
  cuda::copy_async(host_dst, src, count * 4, cudaMemcpyDeviceToHost, launch_);
  LILY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}
void CudaBackend::copy_to_host_i32(const int32_t* src, size_t count, int32_t* host_dst) {
  cuda::copy_async(host_dst, src, count * 4, cudaMemcpyDeviceToHost, launch_);
  LILY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}
// Host sources may be reused as soon as these return, so they wait for the transfer.
void CudaBackend::copy_from_host(const int32_t* host_src, size_t count, int32_t* dst) {
  cuda::copy_async(dst, host_src, count * 4, cudaMemcpyHostToDevice, launch_);
  LILY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}
void CudaBackend::copy_from_host(const float* host_src, size_t count, float* dst) {
  cuda::copy_async(dst, host_src, count * 4, cudaMemcpyHostToDevice, launch_);
  LILY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}
void CudaBackend::copy(const float* src, size_t count, float* dst) {
  cuda::copy_async(dst, src, count * 4, cudaMemcpyDeviceToDevice, launch_);
}
void CudaBackend::add_i32(int32_t* value, int32_t delta) {
  cuda::launch(add_i32_kernel, 1, 1, 0, launch_, value, delta);
}

void CudaBackend::read_async(const int32_t* src, int slot) {
  require(slot == 0 || slot == 1, "read_async", "slot must be 0 or 1");
  cuda::copy_async(pinned_reads_ + slot, src, sizeof(int32_t), cudaMemcpyDeviceToHost, launch_);
  LILY_CUDA_CHECK(cudaEventRecord(read_events_[slot], stream_));
}

int32_t CudaBackend::wait_read(int slot) {
  require(slot == 0 || slot == 1, "wait_read", "slot must be 0 or 1");
  LILY_CUDA_CHECK(cudaEventSynchronize(read_events_[slot]));
  return pinned_reads_[slot];
}

void CudaBackend::read_words_async(const int32_t* src, int64_t count, int slot) {
  require(slot == 0 || slot == 1, "read_words_async", "slot must be 0 or 1");
  require(src != nullptr && count >= 1 && count <= TokenRecordLayout::kWords, "read_words_async",
          "needs a source and 1.." + std::to_string(TokenRecordLayout::kWords) + " words");
  cuda::copy_async(pinned_words_ + slot * TokenRecordLayout::kWords, src,
                   static_cast<size_t>(count) * sizeof(int32_t), cudaMemcpyDeviceToHost, launch_);
  LILY_CUDA_CHECK(cudaEventRecord(word_events_[slot], stream_));
}

const int32_t* CudaBackend::wait_read_words(int slot) {
  require(slot == 0 || slot == 1, "wait_read_words", "slot must be 0 or 1");
  LILY_CUDA_CHECK(cudaEventSynchronize(word_events_[slot]));
  return pinned_words_ + slot * TokenRecordLayout::kWords;
}

uint64_t CudaBackend::allocated_bytes() const { return allocated_ + workspace_->bytes(); }

void CudaBackend::synchronize() { LILY_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// ---- graphs -----------------------------------------------------------------------------

void CudaBackend::begin_capture() {
  require(!capturing(), "begin_capture", "a capture is already open");
  // Thread-local mode: other threads' unrelated CUDA calls do not invalidate the capture.
  LILY_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
}

int CudaBackend::end_capture() {
  cudaGraph_t graph = nullptr;
  LILY_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  LILY_CUDA_CHECK(status);
  graphs_.push_back(exec);
  return static_cast<int>(graphs_.size() - 1);
}

void CudaBackend::replay(int graph) {
  require(graph >= 0 && static_cast<size_t>(graph) < graphs_.size(), "replay", "unknown graph");
  LILY_CUDA_CHECK(cudaGraphLaunch(graphs_[static_cast<size_t>(graph)], stream_));
  order_.issued_other();
  fault_point(FaultSite::replay);  // test only (--test-fault); nothing when no fault is armed
}

// ---- weights ----------------------------------------------------------------------------

namespace {

// Every weight view of the model, for upload.
void for_each_weight(const ModelWeights& w, const auto& on_quant, const auto& on_dense) {
  on_quant(w.embed);
  on_quant(w.lm_head);
  on_dense(w.final_norm);
  for (const LayerWeights& layer : w.layers) {
    on_dense(layer.input_norm);
    on_dense(layer.post_attention_norm);
    if (layer.kind == LayerKind::linear_attention) {
      const GatedDeltaNetWeights& g = layer.gdn;
      for (const QuantView* q : {&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_a, &g.in_proj_b, &g.out_proj}) on_quant(*q);
      for (const DenseView* d : {&g.conv1d, &g.a_log, &g.dt_bias, &g.norm}) on_dense(*d);
    } else {
      const AttentionWeights& a = layer.attn;
      for (const QuantView* q : {&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj}) on_quant(*q);
      for (const DenseView* d : {&a.q_norm, &a.k_norm}) on_dense(*d);
    }
    const MoeWeights& m = layer.moe;
    for (const QuantView* q : {&m.router, &m.experts_gate, &m.experts_up, &m.experts_down,
                               &m.shared_gate, &m.shared_up, &m.shared_down, &m.shared_expert_gate}) {
      on_quant(*q);
    }
  }
}

}  // namespace

void CudaBackend::prepare(const ModelWeights& weights, const LoadProgressFn& progress) {
  uint64_t total = 0;
  for_each_weight(
      weights, [&](const QuantView& q) { total += q.stored_bytes(); },
      [&](const DenseView& d) { total += d.nbytes; });
  uint64_t done = 0;
  uint64_t reported = 0;
  auto advance = [&](uint64_t bytes) {
    done += bytes;
    if (progress && (done - reported >= (256ull << 20) || done == total)) {
      progress(done, total);
      reported = done;
    }
  };
  for_each_weight(
      weights,
      [&](const QuantView& q) {
        quant(q);
        advance(q.stored_bytes());
      },
      [&](const DenseView& d) {
        dense(d);
        advance(d.nbytes);
      });
  if (progress && reported != done) progress(done, total);
}

namespace {
// Identifies a view's host data: its pointers, shape and first bytes. The model's views stay
// put for the backend's life; the fingerprint keeps a test that frees a weight and gets the
// same address for a different one from reading a stale copy.
std::string weight_key(const void* a, const void* b, const void* c, uint64_t shape0,
                       uint64_t shape1, size_t head_bytes) {
  std::string key(reinterpret_cast<const char*>(&a), sizeof a);
  key.append(reinterpret_cast<const char*>(&b), sizeof b);
  key.append(reinterpret_cast<const char*>(&c), sizeof c);
  key.append(reinterpret_cast<const char*>(&shape0), sizeof shape0);
  key.append(reinterpret_cast<const char*>(&shape1), sizeof shape1);
  key.append(static_cast<const char*>(a), head_bytes);
  return key;
}
}  // namespace

// Weights go up on the backend's own stream and are waited for: cudaMemcpy from pageable memory
// runs on the legacy stream and may return before its DMA lands, and stream_ is non-blocking,
// so an op launched right after a lazy first-use upload (the op tests do that) could read a
// partly written weight. (Never inside a graph capture: device_alloc refuses first.)
void CudaBackend::upload_weight(void* dst, const void* host_src, size_t bytes) {
  // Pageable, possibly unaligned mapped memory: the driver stages it.
  cuda::copy_async(dst, host_src, bytes, cudaMemcpyHostToDevice, launch_);
  LILY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

const cuda::QuantMatrix& CudaBackend::quant(const QuantView& view) {
  contract::check_weight(view, "upload", "weight");
  const size_t head = std::min<uint64_t>(32, view.words_per_row() * 4);
  const std::string key = weight_key(view.codes, view.scales, view.biases,
                                     view.rows() * 16 + static_cast<uint64_t>(view.bits), view.in, head);
  auto it = quant_.find(key);
  if (it != quant_.end()) return it->second;
  const uint64_t rows = view.rows();
  const size_t code_bytes = rows * view.words_per_row() * 4;
  const size_t group_bytes = rows * view.groups_per_row() * 2;
  auto* codes = static_cast<uint32_t*>(device_alloc(code_bytes));
  auto* scales = static_cast<__nv_bfloat16*>(device_alloc(group_bytes));
  auto* biases = static_cast<__nv_bfloat16*>(device_alloc(group_bytes));
  upload_weight(codes, view.codes, code_bytes);
  upload_weight(scales, view.scales, group_bytes);
  upload_weight(biases, view.biases, group_bytes);
  cuda::QuantMatrix m;
  m.codes = codes;
  m.scales = scales;
  m.biases = biases;
  m.bits = view.bits;
  m.experts = static_cast<int64_t>(view.experts);
  m.out = static_cast<int64_t>(view.out);
  m.in = static_cast<int64_t>(view.in);
  return quant_.emplace(key, m).first->second;
}

const float* CudaBackend::dense(const DenseView& view) {
  // The ops check the shapes (op_contract); any tensor they pass is BF16 or F32 with data.
  require(view.data != nullptr && (view.dtype == DType::BF16 || view.dtype == DType::F32),
          "upload", "tensor " + view.name + " must be BF16 or F32 with data");
  const std::string key = weight_key(view.data, nullptr, nullptr, view.nbytes,
                                     static_cast<uint64_t>(view.dtype), std::min<uint64_t>(view.nbytes, 32));
  auto it = dense_.find(key);
  if (it != dense_.end()) return it->second;
  const bool f32 = view.dtype == DType::F32;
  const size_t count = view.nbytes / (f32 ? 4 : 2);
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) {
    if (f32) {
      std::memcpy(&host[i], view.data + 4 * i, 4);
    } else {
      uint16_t bits = 0;
      std::memcpy(&bits, view.data + 2 * i, 2);
      host[i] = bf16_to_f32(bits);
    }
  }
  auto* device = static_cast<float*>(device_alloc(count * 4));
  upload_weight(device, host.data(), count * 4);
  return dense_.emplace(key, device).first->second;
}

// ---- ops --------------------------------------------------------------------------------

void CudaBackend::embed(const QuantView& table, const int32_t* ids, int64_t n, float* out) {
  contract::check_embed(table, ids, n, out);
  cuda::embed(quant(table), ids, n, out, launch_);
}

bool CudaBackend::resolve_group(std::span<const MatmulTarget> targets, const float* x, int64_t n,
                                const char* op, cuda::GemvTarget (&batch)[cuda::kMaxGemvTargets]) {
  require(!targets.empty(), op, "no targets");
  bool one_launch = n <= cuda::kGemvMaxTokens && targets.size() <= cuda::kMaxGemvTargets;
  for (size_t i = 0; i < targets.size(); ++i) {
    const MatmulTarget& t = targets[i];
    contract::check_matmul_target(t, i, x, n, op, op);
    const cuda::QuantMatrix& m = quant(*t.w);
    if (i < cuda::kMaxGemvTargets) batch[i] = cuda::GemvTarget{m, t.row_begin, t.rows, t.y};
    one_launch = one_launch && m.bits == batch[0].w.bits && m.in == batch[0].w.in;
  }
  return one_launch;
}

void CudaBackend::matmul_group(std::span<const MatmulTarget> targets, const float* x, int64_t n) {
  // One launch when the group fits the batched GEMV (the model's groups all do in decode).
  // Otherwise the same products, one launch each.
  cuda::GemvTarget batch[cuda::kMaxGemvTargets];
  if (resolve_group(targets, x, n, "matmul_group", batch)) {
    ++counts_.batched_gemv;
    cuda::gemv_batch(batch, static_cast<int>(targets.size()), x, n, launch_);
    return;
  }
  for (const MatmulTarget& t : targets) matmul(*t.w, t.row_begin, t.rows, x, n, t.y);
}

void CudaBackend::gated_delta_net_mixer(const GatedDeltaNetWeights& w,
                                        const GatedDeltaNetDims& dims, float eps,
                                        const float* mixed, const float* z, const float* a,
                                        const float* b, float* window, float* state, int64_t n,
                                        float* conv_out, float* core_out, float* normed,
                                        float* y) {
  const cuda::DeltaNetShape d = delta_net_shape(dims, "gated_delta_net_mixer");
  if (!options_.fused_conv || n != 1 || !cuda::gated_delta_step_supports(d)) {
    Backend::gated_delta_net_mixer(w, dims, eps, mixed, z, a, b, window, state, n, conv_out,
                                   core_out, normed, y);
    return;
  }
  // One token: the conv inside the delta rule's launch, which only reads the window; the
  // output projection's launch shifts it, after every block of the delta rule has read it.
  // The arguments are checked as the four ops would check them.
  const char* op = "gated_delta_net_mixer";
  contract::check_conv1d_silu(mixed, window, w.conv1d, dims, 1, conv_out, op);
  contract::check_gated_delta_rule(conv_out, a, b, w.a_log, w.dt_bias, state, dims, 1, core_out, op);
  contract::check_gated_rms_norm(core_out, z, w.norm, dims.value_heads, dims.value_dim, normed, op);
  contract::check_matmul(w.out_proj, 0, static_cast<int64_t>(w.out_proj.rows()), normed, 1, y, op);
  require(cuda::aligned16(state), op, "needs a 16-byte aligned state");
  // The delta step reads the window and the state before its dependency wait; it writes the
  // state, and the output projection's launch the window (the deferred shift): both recorded.
  order_.check_read_before_wait(window, "conv window", op);
  order_.check_read_before_wait(state, "recurrent state", op);
  ++counts_.fused_conv_delta;
  // The gated norm inside the same launch where clusters allow it, else a launch of its own.
  const bool norm_inside = gated_norm_in_delta_ && cuda::gated_delta_norm_supports(d);
  const cuda::DeltaGatedNorm norm{z, dense(w.norm), eps, normed};
  cuda::gated_delta_step(mixed, window, dense(w.conv1d), a, b, dense(w.a_log), dense(w.dt_bias),
                         state, d, core_out, launch_, norm_inside ? &norm : nullptr);
  order_.wrote(state, "recurrent state", "gated_delta_net_mixer's delta rule");
  if (norm_inside) {
    ++counts_.gated_norm_in_delta;
  } else {
    gated_rms_norm(core_out, z, w.norm, dims.value_heads, dims.value_dim, eps, normed);
  }
  // The output projection, whose launch also shifts the window.
  const cuda::QuantMatrix& out_proj = quant(w.out_proj);
  const cuda::GemvTarget target{out_proj, 0, out_proj.rows(), y};
  const cuda::WindowShift shift{mixed, window, d.channels(), d.conv_kernel};
  cuda::gemv_batch(&target, 1, normed, 1, launch_, shift);
  order_.wrote(window, "conv window", "gated_delta_net_mixer's output projection (window shift)");
}

void CudaBackend::matmul(const QuantView& w, int64_t row_begin, int64_t rows, const float* x,
                         int64_t n, float* y) {
  contract::check_matmul(w, row_begin, rows, x, n, y);
  const cuda::QuantMatrix& m = quant(w);
  if (cuda::stream_gemv_applies(m, rows, x, n, stream_gemv_)) {
    ++counts_.stream_gemv;
    cuda::stream_gemv(m, row_begin, rows, x, y, stream_gemv_, launch_);
  } else if (n <= cuda::kGemvMaxTokens) {
    ++counts_.gemv;
    cuda::gemv(m, row_begin, rows, x, n, y, launch_);
  } else {
    ++counts_.tensor_core_gemm;
    cuda::gemm(m, row_begin, rows, x, n, y, *workspace_, launch_);
  }
}

void CudaBackend::rms_norm(const float* x, const DenseView& gain, int64_t n, int64_t dim,
                           float eps, float* out) {
  contract::check_rms_norm(x, gain, n, dim, out);
  cuda::rms_norm(x, dense(gain), n, dim, eps, out, launch_);
}

void CudaBackend::add_rms_norm(float* residual, const float* delta, const DenseView& gain,
                               int64_t n, int64_t dim, float eps, float* out) {
  contract::check_add_rms_norm(residual, delta, gain, n, dim, out);
  cuda::add_rms_norm(residual, delta, dense(gain), n, dim, eps, out, launch_);
}

void CudaBackend::gated_rms_norm(const float* x, const float* z, const DenseView& gain,
                                 int64_t rows, int64_t dim, float eps, float* out) {
  contract::check_gated_rms_norm(x, z, gain, rows, dim, out);
  cuda::gated_rms_norm(x, z, dense(gain), rows, dim, eps, out, launch_);
}

void CudaBackend::attention_prepare(float* qg, float* k, const DenseView& q_norm,
                                    const DenseView& k_norm, const AttentionDims& dims,
                                    SeqPos start_pos, int64_t n, float eps) {
  contract::check_attention_prepare(qg, k, q_norm, k_norm, dims, start_pos, n);
  const cuda::AttentionShape a = attention_shape(dims, "attention_prepare");
  cuda::attention_prepare(qg, k, dense(q_norm), dense(k_norm), a, start_pos.host, start_pos.device,
                          n, eps, launch_);
}

void CudaBackend::attention(const float* qg, const float* k, const float* v, KvCacheView k_cache,
                            KvCacheView v_cache, int64_t capacity, const AttentionDims& dims,
                            SeqPos start_pos, int64_t n, float* out) {
  contract::check_attention(qg, k, v, k_cache, v_cache, capacity, dims, start_pos, n, out);
  const cuda::AttentionShape a = attention_shape(dims, "attention");
  // The contract has checked the buffers and that keys and values share one dtype.
  cuda::KvCaches caches{k_cache.data, v_cache.data, cuda::KvType::f32};
  if (k_cache.dtype == KvDtype::bf16) caches.type = cuda::KvType::bf16;
  if (k_cache.dtype == KvDtype::int8) {
    caches.type = cuda::KvType::int8;
    caches.key_scales = k_cache.scales;
    caches.value_scales = v_cache.scales;
  }
  const cuda::AttentionPath path = cuda::attention(qg, k, v, caches, capacity, a, start_pos.host,
                                                   start_pos.device, n, out, *workspace_, launch_);
  if (path == cuda::AttentionPath::decode_tensor_cores) ++counts_.tensor_core_decode_attention;
  if (path == cuda::AttentionPath::decode_int8_tensor_cores) ++counts_.int8_tensor_core_decode_attention;
}

void CudaBackend::conv1d_silu(const float* mixed, float* window, const DenseView& weight,
                              const GatedDeltaNetDims& dims, int64_t n, float* out) {
  contract::check_conv1d_silu(mixed, window, weight, dims, n, out);
  const cuda::DeltaNetShape d = delta_net_shape(dims, "conv1d_silu");
  order_.check_read_before_wait(window, "conv window", "conv1d_silu");
  cuda::conv1d_silu(mixed, window, dense(weight), d, n, out, launch_);
  order_.wrote(window, "conv window", "conv1d_silu");
}

void CudaBackend::gated_delta_rule(const float* conv, const float* a, const float* b,
                                   const DenseView& a_log, const DenseView& dt_bias, float* state,
                                   const GatedDeltaNetDims& dims, int64_t n, float* out) {
  contract::check_gated_delta_rule(conv, a, b, a_log, dt_bias, state, dims, n, out);
  const cuda::DeltaNetShape d = delta_net_shape(dims, "gated_delta_rule");
  // The one-token kernel moves the state as float4 rows (value_dim % 8 == 0 keeps every row
  // aligned once the base is; device allocations are 256-byte aligned).
  require(cuda::aligned16(state), "gated_delta_rule", "needs a 16-byte aligned state");
  // The one-token kernel loads the state before its dependency wait; the chunked one after.
  if (n == 1) order_.check_read_before_wait(state, "recurrent state", "gated_delta_rule");
  cuda::gated_delta_rule(conv, a, b, dense(a_log), dense(dt_bias), state, d, n, out, launch_);
  order_.wrote(state, "recurrent state", "gated_delta_rule");
}

void CudaBackend::moe_route(const float* logits, int64_t n, int64_t experts, int64_t k,
                            int32_t* ids, float* weights) {
  contract::check_moe_route(logits, n, experts, k, ids, weights);
  require(k <= 16 && experts <= 1024, "moe_route",
          "needs k <= 16 and experts <= 1024, got k = " + std::to_string(k) + " and experts = " +
              std::to_string(experts));
  cuda::moe_route(logits, n, experts, k, ids, weights, launch_);
}

void CudaBackend::expert_swiglu(const QuantView& gate, const QuantView& up, const float* x,
                                const int32_t* ids, int64_t n, int64_t k, float* h) {
  contract::check_expert_swiglu(gate, up, x, ids, n, k, h);
  require(ids != nullptr || k == 1, "expert_swiglu",
          "ids == nullptr (every slot expert 0) needs k == 1 on CUDA, got k = " + std::to_string(k));
  const cuda::QuantMatrix& g = quant(gate);
  const cuda::QuantMatrix& u = quant(up);
  if (n <= cuda::kGemvMaxTokens) {
    cuda::expert_swiglu_gemv(g, u, x, ids, n, k, h, launch_);
  } else {
    ++counts_.grouped_moe;
    cuda::expert_swiglu_grouped(g, u, x, ids, n, k, h, *workspace_, launch_);
  }
}

CudaBackend::SwigluMatrices CudaBackend::resolve_swiglu(const QuantView& gate,
                                                        const QuantView& up,
                                                        const QuantView& shared_gate,
                                                        const QuantView& shared_up, const float* x,
                                                        const int32_t* ids, int64_t k, float* h,
                                                        float* shared_h, int64_t n, const char* op) {
  // Both SwiGLUs' arguments as expert_swiglu checks them (the unfused path is those two ops).
  contract::check_expert_swiglu(gate, up, x, ids, n, k, h, op);
  contract::check_expert_swiglu(shared_gate, shared_up, x, nullptr, n, 1, shared_h, op);
  const SwigluMatrices m{&quant(gate), &quant(up), &quant(shared_gate), &quant(shared_up),
                         false};
  const bool fits = n <= cuda::kGemvMaxTokens && ids != nullptr &&
                    m.shared_gate->bits == m.gate->bits && m.shared_up->bits == m.up->bits &&
                    m.shared_gate->in == m.gate->in && m.shared_up->in == m.up->in;
  return SwigluMatrices{m.gate, m.up, m.shared_gate, m.shared_up, fits};
}

void CudaBackend::expert_swiglu_with_shared(const QuantView& gate, const QuantView& up,
                                            const int32_t* ids, int64_t k, float* h,
                                            const QuantView& shared_gate,
                                            const QuantView& shared_up, float* shared_h,
                                            const float* x, int64_t n) {
  const SwigluMatrices m = resolve_swiglu(gate, up, shared_gate, shared_up, x, ids, k, h, shared_h,
                                          n, "expert_swiglu_with_shared");
  if (!m.fits) {  // prefill (grouped GEMMs), or shapes the fused kernel does not take
    expert_swiglu(gate, up, x, ids, n, k, h);
    expert_swiglu(shared_gate, shared_up, x, nullptr, n, 1, shared_h);
    return;
  }
  ++counts_.fused_swiglu_shared;
  cuda::expert_swiglu_shared_gemv(*m.gate, *m.up, ids, k, h, m.shared_gate, m.shared_up, shared_h,
                                  x, n, launch_);
}

void CudaBackend::route_expert_swiglu(const float* router_logits, int64_t experts, int64_t k,
                                      int32_t* ids, float* weights, const QuantView& gate,
                                      const QuantView& up, float* h, const QuantView& shared_gate,
                                      const QuantView& shared_up, float* shared_h, const float* x,
                                      int64_t n, const QuantView* next_down) {
  const char* op = "route_expert_swiglu";
  contract::check_moe_route(router_logits, n, experts, k, ids, weights, op);
  const SwigluMatrices m =
      resolve_swiglu(gate, up, shared_gate, shared_up, x, ids, k, h, shared_h, n, op);
  // One launch for decode-sized steps of the model's shapes (see route_expert_swiglu_gemv);
  // otherwise the routing kernel, then the SwiGLU op.
  if (!m.fits || k > cuda::kMaxFusedRouteK || experts > cuda::kMaxFusedRouteExperts ||
      k > experts) {
    moe_route(router_logits, n, experts, k, ids, weights);
    expert_swiglu_with_shared(gate, up, ids, k, h, shared_gate, shared_up, shared_h, x, n);
    return;
  }
  require(m.gate->experts == experts, op,
          "gate " + gate.name + " has " + std::to_string(m.gate->experts) + " experts, the router " +
              std::to_string(experts));
  // The down projection's rows of the chosen experts head for L2 from inside the launch.
  const cuda::QuantMatrix* down = next_down != nullptr ? &quant(*next_down) : nullptr;
  require(down == nullptr || down->experts == experts, op,
          "next_down needs one matrix per expert");
  ++counts_.fused_route_swiglu;
  cuda::route_expert_swiglu_gemv(router_logits, experts, ids, weights, *m.gate, *m.up, k, h,
                                 *m.shared_gate, *m.shared_up, shared_h, x, n, down, launch_);
}

void CudaBackend::expert_down_combine(const QuantView& down, const float* h, const int32_t* ids,
                                      const float* weights, int64_t n, int64_t k,
                                      const QuantView& shared_down, const float* shared_h,
                                      const float* shared_logit, float* out) {
  contract::check_expert_down_combine(down, h, ids, weights, n, k, shared_down, shared_h,
                                     shared_logit, out);
  const cuda::QuantMatrix& d = quant(down);
  const cuda::QuantMatrix& s = quant(shared_down);
  if (n <= cuda::kGemvMaxTokens) {
    cuda::expert_down_combine_gemv(d, h, ids, weights, n, k, s, shared_h, shared_logit, out, launch_);
  } else {
    ++counts_.grouped_moe;
    cuda::expert_down_combine_grouped(d, h, ids, weights, n, k, s, shared_h, shared_logit, out,
                                      *workspace_, launch_);
  }
}

void CudaBackend::argmax(const float* logits, int64_t n, int64_t vocab, int32_t* out) {
  contract::check_argmax(logits, n, vocab, out);
  cuda::argmax(logits, n, vocab, out, *workspace_, launch_);
}

// The parameters live in device memory, where they cannot be checked without a round trip:
// the host checks them before uploading (sampler_params_error); the kernels stay memory-safe
// whatever they read.
void CudaBackend::sample(const float* logits, int64_t vocab, const SamplerBuffers& sampler,
                         int32_t* token_out) {
  require(logits != nullptr && token_out != nullptr && sampler.params != nullptr &&
              sampler.counts != nullptr && sampler.prompt_seen != nullptr && sampler.step != nullptr,
          "sample", "needs logits, token_out and the four sampler buffers");
  require(vocab >= 1 && vocab <= kMaxSamplerVocab, "sample",
          "vocab must be in [1, " + std::to_string(kMaxSamplerVocab) + "]");
  if (sampler_state_ == nullptr) sampler_state_ = device_alloc(cuda::sampler_state_bytes());
  cuda::sample(logits, vocab, sampler, token_out, sampler_state_, *workspace_, launch_);
}

void CudaBackend::token_logprobs(const float* logits, int64_t vocab, const int32_t* token,
                                 const SamplerBuffers& sampler, int32_t* record) {
  require(logits != nullptr && token != nullptr && sampler.params != nullptr && record != nullptr,
          "token_logprobs", "needs logits, token, sampler.params and record");
  require(vocab >= 1 && vocab <= kMaxSamplerVocab, "token_logprobs",
          "vocab must be in [1, " + std::to_string(kMaxSamplerVocab) + "]");
  if (sampler_state_ == nullptr) sampler_state_ = device_alloc(cuda::sampler_state_bytes());
  cuda::token_logprobs(logits, vocab, token, sampler.params, record, sampler_state_, *workspace_,
                       launch_);
}

}  // namespace lily

// Kernel lab tool (not built by default): a CUPTI injection library that records when every
// kernel of a process ran on the GPU, so that a decode step's kernels can be seen as they run
// in the step, overlapped by programmatic dependent launch, instead of one at a time as Nsight
// Compute replays them. Load it into any CUDA program, e.g. `lily bench`:
//   CUDA_INJECTION64_PATH=build/libstep_trace.so LILY_TRACE_OUT=trace.csv lily bench ...
// The driver calls InitializeInjection() when CUDA starts; at exit the library writes one CSV
// row per kernel (start and end in ns on the GPU's clock, the graph and graph node it was
// launched from, grid, block, demangled name). tools/gpu/step_timeline.py reads it.
// Build: cmake -DLILY_BUILD_LAB=ON, target step_trace (needs CUPTI, CUDA::cupti).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start = 0, end = 0;  // ns, GPU timestamps
  uint32_t graph_id = 0;        // 0: not launched from a graph
  uint64_t graph_node = 0;
  uint32_t stream = 0;
  int32_t grid[3] = {0, 0, 0};
  int32_t block[3] = {0, 0, 0};
  std::string name;
};

std::mutex records_mutex;
std::vector<KernelRecord> records;  // guarded by records_mutex
constexpr size_t kBufferBytes = size_t{8} << 20;

void report(const char* what, CUptiResult status) {
  const char* text = nullptr;
  cuptiGetResultString(status, &text);
  std::fprintf(stderr, "step_trace: %s failed: %s\n", what,
               text != nullptr ? text : "unknown CUPTI error");
}

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain != nullptr ? plain : name;
  std::free(plain);
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<KernelRecord> batch;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    KernelRecord r;
    r.start = k->start;
    r.end = k->end;
    r.graph_id = k->graphId;
    r.graph_node = k->graphNodeId;
    r.stream = k->streamId;
    r.grid[0] = k->gridX, r.grid[1] = k->gridY, r.grid[2] = k->gridZ;
    r.block[0] = k->blockX, r.block[1] = k->blockY, r.block[2] = k->blockZ;
    r.name = demangled(k->name);
    batch.push_back(std::move(r));
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0) {
    std::fprintf(stderr, "step_trace: CUPTI dropped %zu records\n", dropped);
  }
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(records_mutex);
  records.insert(records.end(), batch.begin(), batch.end());
}

// Names hold commas (template arguments): quoted, with quotes doubled, as CSV wants.
std::string csv_field(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

void write_records() {
  const CUptiResult flushed = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (flushed != CUPTI_SUCCESS) report("cuptiActivityFlushAll", flushed);
  const char* path = std::getenv("LILY_TRACE_OUT");
  if (path == nullptr || *path == '\0') path = "step_trace.csv";
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "step_trace: cannot write %s\n", path);
    return;
  }
  const std::lock_guard<std::mutex> lock(records_mutex);
  std::fprintf(f, "start_ns,end_ns,graph_id,graph_node,stream,grid,block,name\n");
  for (const KernelRecord& r : records) {
    std::fprintf(f, "%llu,%llu,%u,%llu,%u,%dx%dx%d,%dx%dx%d,%s\n",
                 static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.end),
                 r.graph_id, static_cast<unsigned long long>(r.graph_node), r.stream, r.grid[0],
                 r.grid[1], r.grid[2], r.block[0], r.block[1], r.block[2],
                 csv_field(r.name).c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "step_trace: %zu kernels to %s\n", records.size(), path);
}

// Before a context goes, its records are forced out of CUPTI's buffers: the CUDA runtime may
// tear the context down at exit before write_records runs.
void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void*) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  }
}

}  // namespace

// The driver's entry point for a library named by CUDA_INJECTION64_PATH.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  CUptiResult status = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (status != CUPTI_SUCCESS) {
    report("cuptiActivityRegisterCallbacks", status);
    return 0;
  }
  // CONCURRENT_KERNEL, not KERNEL: the latter serialises kernels, which would hide exactly the
  // overlap this tool is for.
  status = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (status != CUPTI_SUCCESS) {
    report("cuptiActivityEnable(CONCURRENT_KERNEL)", status);
    return 0;
  }
  CUpti_SubscriberHandle subscriber = nullptr;
  status = cuptiSubscribe(&subscriber, on_resource, nullptr);
  if (status == CUPTI_SUCCESS) {
    status = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                                 CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
  }
  if (status != CUPTI_SUCCESS)
    report("cuptiSubscribe / cuptiEnableCallback (context destroy)", status);
  std::atexit(write_records);
  return 1;
}

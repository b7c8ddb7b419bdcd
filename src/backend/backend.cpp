// Defaults of the backend interface: capture (unsupported), fault sites, fused ops run unfused, f32 KV caches.
#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace lily {

const char* kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::bf16: return "bf16";
    case KvDtype::int8: return "int8";
    case KvDtype::f32: break;
  }
  return "f32";
}
size_t kv_dtype_bytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::bf16: return 2;
    case KvDtype::int8: return 1;
    case KvDtype::f32: break;
  }
  return 4;
}
std::optional<KvDtype> parse_kv_dtype(std::string_view name) {
  if (name == "f32") return KvDtype::f32;
  if (name == "bf16") return KvDtype::bf16;
  if (name == "int8") return KvDtype::int8;
  return std::nullopt;
}
uint64_t kv_cache_bytes(KvDtype dtype, uint64_t count, int64_t head_dim) {
  uint64_t bytes = count * kv_dtype_bytes(dtype);
  if (dtype == KvDtype::int8 && head_dim > 0) bytes += count / static_cast<uint64_t>(head_dim) * sizeof(float);
  return bytes;
}

float quantize_kv_row(const float* x, int64_t width, int8_t* codes) {
  float absmax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < width; ++i) {
    finite = finite && std::isfinite(x[i]);
    absmax = std::max(absmax, std::fabs(x[i]));
  }
  if (!finite || absmax == 0.0f) {
    std::fill(codes, codes + width, int8_t{0});
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();  // NaN: every value reads NaN
  }
  const float inv = 127.0f / absmax;
  for (int64_t i = 0; i < width; ++i) {
    const float q = std::nearbyint(x[i] * inv);  // the default rounding: to nearest, ties to even
    codes[i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
  }
  return absmax / 127.0f;
}

float* KvCacheView::f32() const {
  if (dtype != KvDtype::f32) {
    throw std::logic_error(std::string("KvCacheView: an f32 pointer asked of a ") +
                           kv_dtype_name(dtype) + " KV cache");
  }
  return static_cast<float*>(data);
}
uint16_t* KvCacheView::bf16_bits() const {
  if (dtype != KvDtype::bf16) {
    throw std::logic_error(std::string("KvCacheView: a bf16 pointer asked of a ") +
                           kv_dtype_name(dtype) + " KV cache");
  }
  return static_cast<uint16_t*>(data);
}
int8_t* KvCacheView::int8_codes() const {
  if (dtype != KvDtype::int8) {
    throw std::logic_error(std::string("KvCacheView: int8 codes asked of a ") + kv_dtype_name(dtype) +
                           " KV cache");
  }
  return static_cast<int8_t*>(data);
}
float* KvCacheView::int8_scales() const {
  if (dtype != KvDtype::int8) {
    throw std::logic_error(std::string("KvCacheView: int8 scales asked of a ") + kv_dtype_name(dtype) +
                           " KV cache");
  }
  return scales;
}

namespace {
// The defaults serve f32 caches only; anything else is the backend's to refuse clearly.
void require_f32_cache(const Backend& be, KvDtype dtype, const char* op) {
  if (dtype != KvDtype::f32) {
    throw std::invalid_argument(be.name() + " " + op + ": the " + be.name() +
                                " backend keeps KV caches in f32 only, asked for " +
                                kv_dtype_name(dtype) + " (--kv-cache f32)");
  }
}
}  // namespace

KvCacheView Backend::alloc_kv_cache(size_t count, KvDtype dtype, int64_t /*head_dim*/) {
  require_f32_cache(*this, dtype, "alloc_kv_cache");
  return KvCacheView(alloc(count));
}
void Backend::zero_kv_cache(const KvCacheView& cache, size_t count) {
  require_f32_cache(*this, cache.dtype, "zero_kv_cache");
  zero(cache.f32(), count);
}
void Backend::copy_kv_to_host(const KvCacheView& cache, size_t count, void* host_dst) {
  require_f32_cache(*this, cache.dtype, "copy_kv_to_host");
  copy_to_host(cache.f32(), count, static_cast<float*>(host_dst));
}
void Backend::copy_kv_from_host(const void* host_src, size_t count, const KvCacheView& cache) {
  require_f32_cache(*this, cache.dtype, "copy_kv_from_host");
  copy_from_host(static_cast<const float*>(host_src), count, cache.f32());
}

void Backend::matmul_group(std::span<const MatmulTarget> targets, const float* x, int64_t n) {
  for (size_t i = 0; i < targets.size(); ++i) {
    const MatmulTarget& t = targets[i];
    if (t.w == nullptr) {
      throw std::invalid_argument("matmul_group: targets[" + std::to_string(i) +
                                  "].w is null, expected a weight");
    }
    matmul(*t.w, t.row_begin, t.rows, x, n, t.y);
  }
}

void Backend::gated_delta_net_mixer(const GatedDeltaNetWeights& w, const GatedDeltaNetDims& dims,
                                    float eps, const float* mixed, const float* z, const float* a,
                                    const float* b, float* window, float* state, int64_t n,
                                    float* conv_out, float* core_out, float* normed, float* y) {
  conv1d_silu(mixed, window, w.conv1d, dims, n, conv_out);
  gated_delta_rule(conv_out, a, b, w.a_log, w.dt_bias, state, dims, n, core_out);
  gated_rms_norm(core_out, z, w.norm, n * dims.value_heads, dims.value_dim, eps, normed);
  matmul(w.out_proj, 0, static_cast<int64_t>(w.out_proj.rows()), normed, n, y);
}

void Backend::expert_swiglu_with_shared(const QuantView& gate, const QuantView& up,
                                        const int32_t* ids, int64_t k, float* h,
                                        const QuantView& shared_gate, const QuantView& shared_up,
                                        float* shared_h, const float* x, int64_t n) {
  expert_swiglu(gate, up, x, ids, n, k, h);
  expert_swiglu(shared_gate, shared_up, x, nullptr, n, 1, shared_h);
}

void Backend::route_expert_swiglu(const float* router_logits, int64_t experts, int64_t k,
                                  int32_t* ids, float* weights, const QuantView& gate,
                                  const QuantView& up, float* h, const QuantView& shared_gate,
                                  const QuantView& shared_up, float* shared_h, const float* x,
                                  int64_t n, const QuantView* /*next_down: a hint*/) {
  moe_route(router_logits, n, experts, k, ids, weights);
  expert_swiglu_with_shared(gate, up, ids, k, h, shared_gate, shared_up, shared_h, x, n);
}

void Backend::fault_point(FaultSite site) {
  if (!has_armed_fault_ || armed_fault_.site != site) return;
  if (armed_fault_.skip > 0) {
    --armed_fault_.skip;
    return;
  }
  has_armed_fault_ = false;
  if (armed_fault_.kind == FaultKind::device) return lose_device(site);
  std::string where = name();
  where += " backend, ";
  where += fault_site_name(site);
  throw std::runtime_error("injected error (--test-fault) at " + where);
}

void Backend::lose_device(FaultSite site) {
  std::string where = name();
  where += " backend, ";
  where += fault_site_name(site);
  throw DeviceFault("injected device fault (--test-fault) at " + where);
}

void Backend::begin_capture() {
  throw std::logic_error(name() + " backend: graph capture is not supported");
}
int Backend::end_capture() {
  throw std::logic_error(name() + " backend: graph capture is not supported");
}
void Backend::replay(int /*graph*/) {
  throw std::logic_error(name() + " backend: graph capture is not supported");
}

}  // namespace lily

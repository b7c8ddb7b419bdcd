// Test-only fault injection (`lily serve --test-fault SITE:KIND[:SKIP]`): one decode op made to fail.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lily {

// Where the fault fires. `step`: a decode step's ops run eagerly (every step on the CPU; on
// CUDA the first step of each graph key, before its graph exists). `capture`: while a decode
// step is being recorded into a CUDA graph. `replay`: when a recorded graph is launched.
enum class FaultSite { step, capture, replay };

// What fails. `error`: an ordinary exception from the op (a bad argument, a failed launch):
// the request fails, the backend stays usable. `device`: the device is lost for good: on
// CUDA a kernel writes to an invalid address, which poisons the context as a real bug would
// (at replay, when injected into a capture); on the CPU a DeviceFault is thrown in its place.
enum class FaultKind { error, device };

struct FaultInjection {
  FaultSite site = FaultSite::step;
  FaultKind kind = FaultKind::error;
  int64_t skip = 0;  // visits of the site passed by before the one that fails (once)
};

// "step|capture|replay:error|device[:SKIP]". Throws InputError naming the part that is wrong.
FaultInjection parse_fault_injection(std::string_view spec);

const char* fault_site_name(FaultSite site);

}  // namespace lily

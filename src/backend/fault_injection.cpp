// Test-only fault injection: parsing of the --test-fault specification.
#include "backend/fault_injection.h"

#include <charconv>
#include <string>

#include "core/error.h"

namespace lily {
namespace {

constexpr const char* kExpected = "expected SITE:KIND[:SKIP] with SITE step, capture or replay, "
                                  "KIND error or device, SKIP a count >= 0";

InputError bad_spec(std::string_view spec, const std::string& what) {
  std::string message = "--test-fault \"";
  message += spec;
  message += "\": ";
  message += what;
  message += "; ";
  message += kExpected;
  return InputError(message);
}

}  // namespace

const char* fault_site_name(FaultSite site) {
  switch (site) {
    case FaultSite::step: return "step";
    case FaultSite::capture: return "capture";
    case FaultSite::replay: return "replay";
  }
  return "?";
}

FaultInjection parse_fault_injection(std::string_view spec) {
  const size_t first = spec.find(':');
  if (first == std::string_view::npos) throw bad_spec(spec, "no KIND");
  const std::string_view site = spec.substr(0, first);
  std::string_view rest = spec.substr(first + 1);
  const size_t second = rest.find(':');
  const std::string_view kind = rest.substr(0, second);
  FaultInjection fault;
  if (site == "step") {
    fault.site = FaultSite::step;
  } else if (site == "capture") {
    fault.site = FaultSite::capture;
  } else if (site == "replay") {
    fault.site = FaultSite::replay;
  } else {
    throw bad_spec(spec, "unknown SITE \"" + std::string(site) + "\"");
  }
  if (kind == "error") {
    fault.kind = FaultKind::error;
  } else if (kind == "device") {
    fault.kind = FaultKind::device;
  } else {
    throw bad_spec(spec, "unknown KIND \"" + std::string(kind) + "\"");
  }
  if (second != std::string_view::npos) {
    const std::string_view skip = rest.substr(second + 1);
    const auto [end, ec] = std::from_chars(skip.data(), skip.data() + skip.size(), fault.skip);
    if (ec != std::errc() || end != skip.data() + skip.size() || skip.empty() || fault.skip < 0) {
      throw bad_spec(spec, "SKIP \"" + std::string(skip) + "\" is not a count");
    }
  }
  return fault;
}

}  // namespace lily

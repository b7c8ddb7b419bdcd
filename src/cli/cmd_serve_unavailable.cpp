// `lily serve` in a build configured with -DLILY_WITH_SERVER=OFF (no Boost): a clear refusal.
#include "cli/commands.h"
#include "core/error.h"

namespace lily {

int cmd_serve(const std::vector<std::string>& /*args*/) {
  throw InputError("this lily was built without the HTTP server (-DLILY_WITH_SERVER=OFF, no "
                   "Boost 1.81 headers); rebuild with the default -DLILY_WITH_SERVER=ON");
}

}  // namespace lily

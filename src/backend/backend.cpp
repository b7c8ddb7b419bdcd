// Defaults of the backend interface for backends that cannot capture op graphs.
#include "backend/backend.h"

#include <stdexcept>

namespace lily {

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

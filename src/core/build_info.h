// What the running binary was built from: commit, dirty tree, build type, compiler and flags.
#pragma once

namespace lily {

struct BuildInfo {
  const char* commit;      // 40 hex digits, or "unknown" outside a git checkout
  bool dirty;              // uncommitted changes or untracked (not ignored) files at build time
  const char* build_type;  // CMAKE_BUILD_TYPE
  const char* compiler;    // e.g. "GNU 12.2.0"
  const char* flags;       // CMAKE_CXX_FLAGS + the build type's flags
};

// Generated at every build by cmake/build_info.cmake (so the commit is never stale).
const BuildInfo& build_info();

}  // namespace lily

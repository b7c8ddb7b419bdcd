// The demo checkpoint: a tiny synthetic model generated on first use into the user's data directory.
#pragma once

#include <string>

namespace lily {

// $LILY_DATA_DIR, else $XDG_DATA_HOME/lily, else $HOME/.local/share/lily.
std::string lily_data_dir();

// <data dir>/demo-tiny-seed1, written (tiny profile, seed 1) if it does not exist yet. The
// generator writes into a private temporary directory and renames it into place, so a
// half-written demo is never used and two processes racing both end up with a whole one.
std::string ensure_demo_checkpoint();

// The warning printed whenever the demo is served: its weights are random.
std::string demo_banner(const std::string& dir);

}  // namespace lily

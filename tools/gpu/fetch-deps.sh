#!/usr/bin/env bash
# Unpacks the Debian packages the GPU machine lacks (it installs nothing) into .deps/root,
# which tools/gpu/run.sh uses and the device call carries (`carry: [".deps"]`). Boost's headers
# are too big to carry unpacked (the carry limit is 64 MiB): its .deb travels in .deps/debs and
# run.sh unpacks it there with dpkg -x.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
rm -rf .deps && mkdir -p .deps/debs .deps/root
(cd .deps/debs && apt-get download nlohmann-json3-dev libcli11-dev libutf8proc-dev libutf8proc2 libgtest-dev \
  python3-prometheus-client python3-decorator)
for deb in .deps/debs/*.deb; do dpkg -x "$deb" .deps/root; done
rm -rf .deps/debs && mkdir -p .deps/debs
(cd .deps/debs && apt-get download libboost1.81-dev)
grep -qx '/.deps/' .git/info/exclude 2>/dev/null || echo '/.deps/' >> .git/info/exclude
# For run.sh's vs-llamacpp stage: llama.cpp's source tarball and the GGUF writer of this
# model's shape, from the directory LILY_PEERS names (nothing of them is in this repository).
if [ -n "${LILY_PEERS:-}" ]; then
  mkdir -p .deps/peers && cp "$LILY_PEERS"/llama.cpp-*.tar.xz "$LILY_PEERS"/synth_qwen35moe_gguf.py .deps/peers/
fi

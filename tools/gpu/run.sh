#!/usr/bin/env bash
# On the GPU machine, in one call: build lily, write the full synthetic checkpoint (kept between
# calls), and run the `lily bench` matrix for the CPU backend on the host's cores (the CUDA tests
# and benchmarks join here when they land). Logs, reports, table and plot go to $OUT.
#   LILY_CONTEXTS   matrix contexts (default 256,512,1024)
#   LILY_THREADS    CPU threads (default 16)
# Needs the carried .deps/ (nlohmann-json and utf8proc unpacked from Debian packages by
# tools/gpu/fetch-deps.sh), since that machine installs nothing. It has no Boost either, so the
# server is left out (-DLILY_WITH_SERVER=OFF).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp/out}
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
contexts=${LILY_CONTEXTS:-256,512,1024}
threads=${LILY_THREADS:-16}
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo "no git checkout here")"
  git status --porcelain 2>/dev/null | head -5 || true
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Socket|L3'
  free -g | head -2
} | tee "$out/machine.txt"

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_BUILD_TESTS=OFF \
  -DLILY_WITH_SERVER=OFF -DCMAKE_PREFIX_PATH="$deps" \
  -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" >"$out/cmake.log" 2>&1
cmake --build build-gpu >>"$out/cmake.log" 2>&1 || { tail -40 "$out/cmake.log"; exit 1; }
lily=$PWD/build-gpu/lily

# Full production-shape checkpoint (19.5 GB) in an ignored folder, so a warm machine keeps it.
ckpt=$PWD/build-gpu/full-seed1
if [ ! -f "$ckpt/model.safetensors.index.json" ]; then
  rm -rf "$ckpt"
  "$lily" make-checkpoint --profile full --seed 1 --out "$ckpt" >"$out/make-checkpoint.log" 2>&1
  tail -1 "$out/make-checkpoint.log"
fi
"$lily" inspect --model "$ckpt" >"$out/inspect.txt"

# The bench matrix (docs/bench.md): fresh process per arm, two rounds, fail-closed.
matrix_args=(--lily "$lily" --model "$ckpt" --out "$out/matrix-cpu" --contexts "$contexts"
  --threads "$threads")
if ! git rev-parse HEAD >/dev/null 2>&1 || [ -n "$(git status --porcelain 2>/dev/null)" ]; then
  matrix_args+=(--allow-dirty)
fi
python3 tools/bench/run_matrix.py "${matrix_args[@]}" 2>&1 | tee "$out/matrix-cpu.log" || true

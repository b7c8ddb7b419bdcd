#!/usr/bin/env bash
# On the GPU machine, in one call: build lily, write the full synthetic checkpoint, and measure
# the CPU backend on the host's cores (the CUDA tests and benchmarks join here when they land).
# Logs go to $OUT. Needs the carried .deps/ (nlohmann-json and utf8proc headers/libraries
# unpacked from Debian packages by tools/gpu/fetch-deps.sh), since that machine installs nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp/out}
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
commit=${LILY_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $commit"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Socket|L3'
  free -g | head -2
} | tee "$out/machine.txt"

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_BUILD_TESTS=OFF \
  -DCMAKE_PREFIX_PATH="$deps" -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" >"$out/cmake.log" 2>&1
cmake --build build-gpu >>"$out/cmake.log" 2>&1 || { tail -40 "$out/cmake.log"; exit 1; }
lily=build-gpu/lily

# Full production-shape checkpoint (19.5 GB), timed.
ckpt=/tmp/lily-full-seed1
rm -rf "$ckpt"
"$lily" make-checkpoint --profile full --seed 1 --out "$ckpt" >"$out/make-checkpoint.log" 2>&1
tail -1 "$out/make-checkpoint.log"
"$lily" inspect --model "$ckpt" | tee "$out/inspect.txt"

# CPU figures: synthetic prompt token i = (i * 2654435761 mod 2^32) mod vocab, greedy decode.
prompt_ids() { python3 -c "import sys; n=int(sys.argv[1]); print(','.join(str((i*2654435761 % 2**32) % 248320) for i in range(n)))" "$1"; }
for threads in 16; do
  for len in 128 512; do
    echo "== full profile, CPU backend, $threads threads, prompt $len, 64 decode steps" | tee -a "$out/cpu-full.log"
    "$lily" run --model "$ckpt" --prompt-ids "$(prompt_ids $len)" --max-tokens 65 --ignore-eos \
      --threads "$threads" --max-seq 4096 2>>"$out/cpu-full.log" >/dev/null
    tail -1 "$out/cpu-full.log"
  done
done

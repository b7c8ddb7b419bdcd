#!/usr/bin/env bash
# On the GPU machine, in one call: `lily bench` of the working tree against a base commit, arm by
# arm alternating (working tree first), on the full synthetic checkpoint. Builds the working tree
# through tools/gpu/run.sh (its LILY_STAGES, default tests: cuda_tests run first, with
# LILY_GTEST_FILTER) and each base from `git archive` into /tmp/base-<commit> (lily only, once per
# machine).
#   AB_BASE    the base commit, or several separated by spaces (default HEAD: the device's .git is
#              the session's starting snapshot); with several, each arm is named base-<commit>
#   AB_PATCHES patch files (space-separated; untracked files travel to the device): each applied to a
#              copy of the working tree and built as one more arm, named after the file
#   AB_SPECS   space-separated context:kv-cache arms (default "131072:int8")
#   AB_ROUNDS  rounds of (new, base) per arm (default 1)
# Writes $OUT/bench-<ctx>-<kv>-<arm>-r<round>.json and prints each run's summary line.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
read -r -a bases <<<"${AB_BASE:-HEAD}"
read -r -a patches <<<"${AB_PATCHES:-}"
start=$(date +%s)
# Builds lily in the source tree $1 (in the background; its pid joins build_pids), log $2.
build_pids=()
build_lily() {
  (cmake -S "$1" -B "$1/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_BUILD_TESTS=OFF \
     -DLILY_WITH_SERVER=OFF -DLILY_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$deps" \
     -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" >"$2" 2>&1 &&
   nice cmake --build "$1/build" --target lily >>"$2" 2>&1; echo "build of $1: rc $?") &
  build_pids+=($!)
}
# The arms in bench order: the working tree, each patch arm, each base.
arms=(new) bins=("$PWD/build-gpu/lily")
for p in "${patches[@]}"; do
  name=$(basename "$p" .patch)
  dir=/tmp/arm-$name
  rm -rf "$dir" && mkdir -p "$dir" && tar -c --exclude=./build-gpu --exclude=./.git --exclude=./.deps . | tar -x -C "$dir" &&
    patch -s -d "$dir" -p1 <"$p" || { echo "arm $p: does not apply"; exit 2; }
  build_lily "$dir" "$out/arm-$name-cmake.log"
  arms+=("$name") bins+=("$dir/build/lily")
done
for b in "${bases[@]}"; do
  dir=/tmp/base-$b
  if [ ! -x "$dir/build/lily" ]; then  # once per machine
    rm -rf "$dir" && mkdir -p "$dir" && git archive "$b" | tar -x -C "$dir"
    build_lily "$dir" "$out/base-$b-cmake.log"
  fi
  arms+=("$([ ${#bases[@]} -eq 1 ] && echo base || echo "base-$b")") bins+=("$dir/build/lily")
done
LILY_STAGES=${LILY_STAGES:-tests} bash tools/gpu/run.sh
[ ${#build_pids[@]} -eq 0 ] || wait "${build_pids[@]}"
ckpt=$PWD/build-gpu/full-seed1
[ -f "$ckpt/model.safetensors.index.json" ] ||
  ./build-gpu/lily make-checkpoint --profile full --seed 1 --out "$ckpt" >"$out/make-checkpoint.log" 2>&1
for spec in ${AB_SPECS:-131072:int8}; do
  ctx=${spec%%:*}
  kv=${spec##*:}
  for round in $(seq "${AB_ROUNDS:-1}"); do
    for i in "${!arms[@]}"; do
      arm=${arms[$i]} bin=${bins[$i]}
      echo -n "ctx $ctx $kv $arm r$round: "
      timeout 300 "$bin" bench --model "$ckpt" --prompt-len "$ctx" --device cuda --kv-cache "$kv" \
        --json-out "$out/bench-$ctx-$kv-$arm-r$round.json" 2>&1 | tail -1
    done
  done
done
echo "ab_bench: $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# On the GPU machine, in one call: `lily bench` of the working tree against a base commit, arm by
# arm alternating (working tree first), on the full synthetic checkpoint. Builds the working tree
# through tools/gpu/run.sh (its LILY_STAGES, default tests: cuda_tests run first, with
# LILY_GTEST_FILTER) and each base from `git archive` into /tmp/base-<commit> (lily only, once per
# machine).
#   AB_BASE    the base commit, or several separated by spaces (default HEAD: the device's .git is
#              the session's starting snapshot); with several, each arm is named base-<commit>;
#              set and empty: no base arm (the patch arms against the working tree)
#   AB_PATCHES patch files (space-separated; untracked files travel to the device): each applied to a
#              copy of the working tree and built as one more arm, named after the file
#   AB_SPECS   space-separated context:kv-cache arms (default "131072:int8")
#   AB_ROUNDS  rounds of (new, base) per arm (default 1)
#   AB_LAB     1: each arm also builds tools/lab/moe_layer_lab and runs it after the benches
#              (the MoE block alone per layer and its phase timeline), to $OUT/moe-lab-<arm>.txt
# Writes $OUT/bench-<ctx>-<kv>-<arm>-r<round>.json, prints each run's summary line, and packs
# everything under $OUT into $OUT/ab-results.tgz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
read -r -a bases <<<"${AB_BASE-HEAD}"
read -r -a patches <<<"${AB_PATCHES:-}"
start=$(date +%s)
# Builds lily in the source tree $1 (in the background; its pid joins build_pids), log $2.
build_pids=()
lab=${AB_LAB:-0}
targets=(lily) && [ "$lab" = 1 ] && targets+=(moe_layer_lab)
build_lily() {
  (cmake -S "$1" -B "$1/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_BUILD_TESTS=OFF \
     -DLILY_WITH_SERVER=OFF -DLILY_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$deps" \
     -DLILY_BUILD_LAB=$([ "$lab" = 1 ] && echo ON || echo OFF) \
     -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" >"$2" 2>&1 &&
   nice cmake --build "$1/build" --target "${targets[@]}" >>"$2" 2>&1; echo "build of $1: rc $?") &
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
  if [ ! -x "$dir/build/lily" ] || { [ "$lab" = 1 ] && [ ! -x "$dir/build/moe_layer_lab" ]; }; then  # once per machine
    rm -rf "$dir" && mkdir -p "$dir" && git archive "$b" | tar -x -C "$dir"
    build_lily "$dir" "$out/base-$b-cmake.log"
  fi
  arms+=("$([ ${#bases[@]} -eq 1 ] && echo base || echo "base-$b")") bins+=("$dir/build/lily")
done
stages=${LILY_STAGES:-tests}
# The working tree's moe_layer_lab is built by run.sh, without its lab stage (which would run all
# three labs, about 40 s of device time, before the arms' own MoE lab runs below).
[ "$lab" = 1 ] && export LILY_BUILD_MOE_LAB=1
LILY_STAGES=$stages bash tools/gpu/run.sh
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
if [ "$lab" = 1 ]; then
  for i in "${!arms[@]}"; do
    echo "== moe_layer_lab, arm ${arms[$i]}"
    timeout 120 "$(dirname "${bins[$i]}")/moe_layer_lab" 2>&1 | tee "$out/moe-lab-${arms[$i]}.txt" | grep -v '^moe_layer:'
  done
fi
# The device tool returns a limited number of files: everything in one archive, named to sort first.
tar -czf "$out/ab-results.tgz" -C "$out" --exclude=ab-results.tgz . 2>/dev/null || true
echo "ab_bench: $(( $(date +%s) - start )) s"

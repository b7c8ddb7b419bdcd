#!/usr/bin/env bash
# Fresh-machine entry point: install dependencies (apt), build, then run the main job or every test.
#   bash tools/dev.sh main [--model DIR]   the main job (until `lily serve` lands: validate and
#                                          summarise the checkpoint, then one greedy answer; the
#                                          demo tiny checkpoint by default)
#   bash tools/dev.sh test                 every test: unit, oracle, independent-writer, fuzz smoke
#   bash tools/dev.sh build                install and build only
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LILY_BUILD_DIR:-$root/build}
jobs=$(nproc)

apt_packages=(build-essential cmake pkg-config git python3
  nlohmann-json3-dev libutf8proc-dev libboost1.81-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev)

install_deps() {
  local missing=()
  for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
  if ((${#missing[@]})); then
    echo "== installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

build() {
  echo "== building in $build_dir"
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build_dir" -j"$jobs"
}

data_dir() { echo "${LILY_DATA_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/lily}"; }

# The demo checkpoint: tiny profile, seed 1, generated once. Its answers are noise.
demo_checkpoint() {
  local dir
  dir="$(data_dir)/demo-tiny-seed1"
  if [ ! -f "$dir/model.safetensors.index.json" ]; then
    rm -rf "$dir.partial"
    mkdir -p "$(data_dir)"
    "$build_dir/lily" make-checkpoint --profile tiny --seed 1 --out "$dir.partial" >&2
    mv "$dir.partial" "$dir"
  fi
  echo "$dir"
}

run_main() {
  local model=${LILY_MODEL:-}
  if [ "${1:-}" = "--model" ]; then model=$2; fi
  if [ -z "$model" ]; then
    model=$(demo_checkpoint)
    echo "== no --model given: using the DEMO checkpoint $model (synthetic weights; its answers are noise)"
  fi
  "$build_dir/lily" inspect --model "$model"
  echo "== one greedy answer on the CPU (lily run --prompt)"
  "$build_dir/lily" run --model "$model" --prompt "Hello! Who are you?" --max-tokens 16
}

run_tests() {
  for script in "$root"/tests/oracle/*/install.sh; do
    [ -f "$script" ] && bash "$script"
  done
  echo "== unit, oracle and independent-writer tests"
  (cd "$build_dir" && ctest --output-on-failure -j"$jobs")
  echo "== fuzz smoke run"
  FUZZ_SECONDS=${FUZZ_SECONDS:-15} bash "$root/tools/fuzz-smoke.sh"
  echo "== all tests passed"
}

case "${1:-}" in
  main) install_deps; build; shift; run_main "$@" ;;
  test) install_deps; build; run_tests ;;
  build) install_deps; build ;;
  *) sed -n '2,7p' "$0" >&2; exit 2 ;;
esac

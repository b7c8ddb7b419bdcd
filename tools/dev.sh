#!/usr/bin/env bash
# Fresh-machine entry point: install dependencies (apt), build, then run the main job or every test.
#   bash tools/dev.sh main [serve options]  the main job: `lily serve` (the demo tiny checkpoint
#                                           unless --model DIR or LILY_MODEL is given)
#   bash tools/dev.sh test                 every test: unit, oracle, independent-writer, fuzz smoke,
#                                          engine and server tests under ThreadSanitizer
#   bash tools/dev.sh build                install and build only
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LILY_BUILD_DIR:-$root/build}
jobs=$(nproc)

apt_packages=(build-essential cmake pkg-config git python3 python3-prometheus-client python3-jinja2
  nlohmann-json3-dev libcli11-dev libutf8proc-dev libboost1.81-dev libgtest-dev libgmock-dev
  libbenchmark-dev clang libclang-rt-14-dev haproxy
  clang-19 libclang-rt-19-dev llvm-19)  # the ThreadSanitizer job (tools/tsan.sh): compiler, runtime, symbolizer

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
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build_dir" -j"$jobs"
}

# The main job: the server. Without --model (and without LILY_MODEL) `lily serve` generates and
# serves the demo checkpoint (tiny, seed 1, random weights: its answers are noise). Every
# argument is passed on, e.g. --model DIR --bind 127.0.0.1:8000 --max-seq 4096. Ctrl-C stops it.
run_main() {
  echo "== lily serve $*"
  exec "$build_dir/lily" serve "$@"
}

run_tests() {
  for script in "$root"/tests/oracle/*/install.sh; do
    [ -f "$script" ] && bash "$script"
  done
  echo "== unit, oracle and independent-writer tests"
  (cd "$build_dir" && ctest --output-on-failure -j"$jobs")
  echo "== fuzz smoke run"
  FUZZ_SECONDS=${FUZZ_SECONDS:-15} bash "$root/tools/fuzz-smoke.sh"
  echo "== engine and server tests under ThreadSanitizer"
  bash "$root/tools/tsan.sh"
  echo "== all tests passed"
}

case "${1:-}" in
  main) install_deps; build; shift; run_main "$@" ;;
  test) install_deps; build; run_tests ;;
  build) install_deps; build ;;
  *) sed -n '2,6p' "$0" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz and runs each briefly.
#
#   tools/fuzz-smoke.sh                 20 s per target
#   FUZZ_SECONDS=300 tools/fuzz-smoke.sh
#
# Environment: FUZZ_SECONDS (per target, default 20), FUZZ_TARGETS (space-separated subset of
# the targets to run, default all), FUZZ_BUILD_DIR (default
# <repo>/build-fuzz), FUZZ_JOBS (build parallelism, default 2), CC/CXX (default clang,
# clang++). Seeds are generated from a tiny synthetic checkpoint at run time; inputs the
# fuzzer finds go to $FUZZ_BUILD_DIR/fuzz-work/corpus/<target>, crashes to
# $FUZZ_BUILD_DIR/fuzz-work/artifacts. Exit status: 0 when every target ran its time
# without a crash, 1 otherwise.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${FUZZ_SECONDS:-20}
jobs=${FUZZ_JOBS:-2}
read -r -a targets <<<"${FUZZ_TARGETS:-fuzz_safetensors_header fuzz_safetensors_index fuzz_model_config fuzz_chat_request fuzz_output_parser}"

echo "== configure and build ($build)"
mkdir -p "$build"
CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S "$root" -B "$build" \
  -DLILY_FUZZ=ON -DLILY_BUILD_TESTS=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"$jobs" --target lily_fuzzers

work=$build/fuzz-work
rm -rf "$work"
mkdir -p "$work/artifacts" "$work/logs"
echo "== seeds"
"$build/tests/fuzz/lily_fuzz_seeds" "$work/seeds"

declare -A seeds=(
  [fuzz_safetensors_header]=header
  [fuzz_safetensors_index]=index
  [fuzz_model_config]=config
  [fuzz_chat_request]=chat
  [fuzz_output_parser]=output)
declare -A dicts=(
  [fuzz_safetensors_header]=safetensors_header.dict
  [fuzz_safetensors_index]=safetensors_index.dict
  [fuzz_model_config]=model_config.dict
  [fuzz_chat_request]=chat_request.dict
  [fuzz_output_parser]=output_parser.dict)

failed=0
summary=()
for target in "${targets[@]}"; do
  echo "== $target (${seconds} s)"
  corpus=$work/corpus/$target
  log=$work/logs/$target.log
  mkdir -p "$corpus"
  set +e
  "$build/tests/fuzz/$target" "$corpus" "$work/seeds/${seeds[$target]}" \
    -dict="$root/tests/fuzz/${dicts[$target]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/$target-" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | sed 's/cov: //')
  units=$(find "$corpus" -type f | wc -l)
  if [[ $rc -eq 0 ]]; then
    status=ok
  else
    status="CRASH (exit $rc)"
    failed=1
    echo "---- last lines of $log"
    tail -n 40 "$log"
    ls -l "$work/artifacts" || true
  fi
  summary+=("$(printf '%-26s %-16s execs %-10s time %-5s cov %-6s new corpus %s' \
    "$target" "$status" "${execs:-?}" "${took:-?}s" "${cov:-?}" "$units")")
done

echo
echo "== fuzz smoke summary (${seconds} s per target, logs in $work/logs)"
printf '%s\n' "${summary[@]}"
if [[ $failed -ne 0 ]]; then
  echo "FAILED: at least one target crashed; reproduce with <binary> <artifact>"
  exit 1
fi
echo "OK: no crashes"

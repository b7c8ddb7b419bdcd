#!/usr/bin/env bash
# Builds the engine and server tests with ThreadSanitizer (clang-19) in build-tsan and runs them; any report fails.
#
#   bash tools/tsan.sh
#
# Environment: TSAN_BUILD_DIR (default <repo>/build-tsan), TSAN_JOBS (build and test
# parallelism, default nproc). What runs: the engine tests (sequences, the engine loop with its
# queue, cancellation and shutdown, snapshots), the streamed HTTP
# transport over real sockets, and the Python suites that drive the instrumented `lily serve`
# (raw HTTP, SSE streaming and cancellation, /metrics): the inference thread, the HTTP threads
# and the thread pool under real traffic. Every TSan report goes to a file under
# $TSAN_BUILD_DIR/tsan-reports (the server suites keep `lily serve`'s stderr to themselves), and
# any report fails the run, whatever the test that triggered it concluded.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TSAN_BUILD_DIR:-$root/build-tsan}
jobs=${TSAN_JOBS:-$(nproc)}
targets=(lily engine_loop_tests sequence_engine_tests snapshot_cache_tests http_stream_tests)
# CTest names: gtest cases are "<executable>.<suite>.<case>", the Python groups server_*. Left
# out: the groups that check request parsing and refusals (validation, auth, output, fields),
# which add no thread interplay beyond what these have, for CI time; and engine_tests (the
# session cache and generator driven from one thread: the longest group under TSan, with no
# thread interplay that engine_loop_tests and the server groups do not have).
tests="^(engine_loop_tests|sequence_engine_tests|snapshot_cache_tests|http_stream_tests)\."
tests+="|^server_http_raw_(transport|stress|queue|disconnect|shutdown)$|^server_sse_(stream|text|cancel)$|^server_metrics$"

for tool in clang++-19 llvm-symbolizer-19; do
  command -v "$tool" >/dev/null || { echo "tsan: $tool not found (apt: clang-19 libclang-rt-19-dev llvm-19)" >&2; exit 1; }
done

echo "== ThreadSanitizer build ($build)"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++-19 \
  -DLILY_SANITIZE=thread -DLILY_WITH_CUDA=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

reports=$build/tsan-reports
rm -rf "$reports"
mkdir -p "$reports"
# halt_on_error: the first report ends the process (exit 66), so it cannot be lost in a test
# that tolerates a dying server; second_deadlock_stack: both stacks of a lock-order inversion.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 log_path=$reports/tsan external_symbolizer_path=$(command -v llvm-symbolizer-19)"

# Clang's arithmetic, not the GCC build's: the server tests that build on a greedy answer of
# the tiny checkpoint check their fact first and skip visibly where it differs.
export LILY_TEST_NUMERICS=clang-tsan

echo "== engine and server tests under ThreadSanitizer"
set +e
(cd "$build" && ctest --output-on-failure --no-tests=error -j"$jobs" -R "$tests")
rc=$?
set -e

mapfile -t found < <(grep -l "ThreadSanitizer" "$reports"/* 2>/dev/null)
if ((${#found[@]})); then
  for file in "${found[@]}"; do
    echo "---- $file"
    cat "$file"
  done
  echo "FAILED: ThreadSanitizer reported ${#found[@]} time(s) (reports above, in $reports)"
  exit 1
fi
if [[ $rc -ne 0 ]]; then
  echo "FAILED: a test failed under ThreadSanitizer (ctest exit $rc)"
  exit 1
fi
echo "OK: no ThreadSanitizer reports"

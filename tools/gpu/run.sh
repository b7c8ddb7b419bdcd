#!/usr/bin/env bash
# On the GPU machine, in one call: build lily with CUDA, run the CUDA tests, compute-sanitizer
# on a tiny run, and the `lily bench` matrices. Logs, JSON reports, tables and plots go to $OUT.
#   LILY_STAGES        which stages, comma-separated (default tests,sanitizer,bench-cuda):
#                        tests       cuda_tests (every CUDA op vs float64 and the CPU backend,
#                                    tiny goldens through CUDA, full-checkpoint logits vs CPU)
#                        sanitizer   compute-sanitizer memcheck on a tiny `lily run --device cuda`
#                        bench-cuda  the CUDA bench matrix on the full synthetic checkpoint
#                        bench-cpu   the CPU bench matrix on the host's cores
#                        server      builds `lily serve` too (Boost from the carried .deb) and runs
#                                    the stdlib-Python server suites (tests/server: raw HTTP
#                                    and SSE) against `lily serve --device cuda` on the tiny
#                                    and the full synthetic checkpoints, then the streaming
#                                    figure (tools/loadtest/stream_bench.py vs lily bench)
#                        sampling    lily bench greedy and --sampling at LILY_PROFILE_CONTEXTS
#                                    (LILY_SAMPLING_ROUNDS rounds, default 2; LILY_SAMPLING_CPU=0
#                                    leaves out the host-CPU arms); the server stage takes
#                                    LILY_SERVER_GROUPS and LILY_SERVER_MODELS (default tiny full)
#                        faults      builds `lily serve` too and runs tests/server/test_faults.py
#                                    --device cuda (op errors and a lost device at the step,
#                                    capture and replay sites), then the start-up memory check
#                                    with a PyTorch process holding all but 1 GiB of the GPU
#                        ptx         cuda_tests' decode and golden tests and a `lily run` with
#                                    CUDA_FORCE_PTX_JIT=1: the compute_80 PTX JIT-compiled, as
#                                    a GPU without machine code in the build runs it (needs
#                                    LILY_CUDA_ARCHS with 80-virtual)
#                        archs       compiles the CUDA backend for the default architecture list
#                                    (sm_80/86/89/90a/120 + compute_80 PTX) in build-archs, in
#                                    the background while the other stages run
#                        vs-llamacpp  lily against llama.cpp on the host's CPU
#                                    (tools/bench/vs_llamacpp.py): llama-bench built from the
#                                    carried .deps/peers tarball, the synthetic GGUF written
#                                    there; LILY_THREADS (16), LILY_VS_CONTEXTS (256,4096),
#                                    LILY_VS_ROUNDS (1), LILY_VS_PRECISION (q8), LILY_VS_KV
#                                    (lily's --kv-cache, default lily's)
#                        bench-cpu-tiny  the CPU bench matrix of the tiny profile on one core
#                                    (LILY_TINY_CONTEXTS, default 256,512,1024,2048; 256 steps)
#                        profile     Nsight Compute kernel durations of a short full-checkpoint
#                                    run (prefill, eager decode step, graph replays) to
#                                    ncu-decode.csv, and `lily bench` arms at
#                                    LILY_PROFILE_CONTEXTS (default 256) for each of
#                                    LILY_PROFILE_ARMS (default: default,nopdl; also
#                                    nostream, noconv, nomoelayer: --cuda-disable moe-layer,
#                                    kvf32 / kvbf16 / kvint8: --kv-cache f32 / bf16 / int8); LILY_NCU=0 skips Nsight Compute;
#                                    LILY_NCU_DETAIL=<regex>: full sections of one kernel
#                        ncu-stalls  where the decode's two biggest kernels stall, per span of SASS
#                                    (tools/gpu/ncu_stalls.py on Nsight Compute's source page): the
#                                    persistent MoE kernel (moe_layer_lab) and the 2048-wide
#                                    projection GEMV (delta_net_layer_lab's op path), each with
#                                    ncu's cache flush (--cache-control all) and without it (none),
#                                    to ncu-stalls-<kernel>-<cc>.txt and ncu-stalls.tgz (the CSVs)
#                        ncu-attention  Nsight Compute's full sections of the tensor-core decode
#                                    attention at 131,073 keys: decode_tc_int8_kernel (cuda_tests'
#                                    CudaInt8KvCache.LongHistory) and decode_tc_kernel (bf16,
#                                    CudaAttention.Bf16CacheLongHistory), each one's launch at
#                                    131,072 keys, to ncu-attention-{int8,bf16}.txt
#                        lab         the kernel lab (tools/lab/, -DLILY_BUILD_LAB=ON): moe_layer_lab's
#                                    op path vs persistent MoE block per layer, and its timeline;
#                                    delta_net_layer_lab's the same for the Gated DeltaNet mixer;
#                                    attention_lab's decode attention + split combine at 131,072
#                                    keys in a graph, per split count (int8, bf16 and f32 caches;
#                                    the combine against its old form, bit for bit)
#                        timeline    the decode step as it runs (tools/lab/step_trace.cpp, a CUPTI
#                                    injection library, under `lily bench` at each context of
#                                    LILY_PROFILE_CONTEXTS, LILY_KV_CACHE's cache): every kernel's
#                                    start, end and advance in the step, by tools/gpu/step_timeline.py,
#                                    to timeline-<ctx>.txt / .tsv; the same bench without the library
#                                    first, to show what the tracing costs
#   LILY_CONTEXTS      CUDA matrix contexts (default 256,1024,4096,16384,65536,131072)
#   LILY_KV_CACHE      --kv-cache of the CUDA matrix (default: lily's, f32)
#   LILY_CPU_CONTEXTS  CPU matrix contexts (default 256,512,1024); LILY_THREADS (default 16)
#   LILY_GTEST_FILTER  gtest filter for cuda_tests (default all)
#   LILY_BUILD_MOE_LAB 1: also build moe_layer_lab, without running any lab (ab_bench.sh's AB_LAB)
#   LILY_CUDA_ARCHS    CMAKE_CUDA_ARCHITECTURES of the build (default 90a, the H200's own);
#                      "90a-real;80-virtual" adds the PTX that CUDA_FORCE_PTX_JIT=1 runs
# Needs the carried .deps/ (nlohmann-json, utf8proc and GoogleTest unpacked from Debian
# packages by tools/gpu/fetch-deps.sh, and Boost's .deb), since that machine installs nothing.
# The server is built only for the server stage (Boost unpacked here first).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
stages=${LILY_STAGES:-tests,sanitizer,bench-cuda}
LILY_PROFILE_CONTEXTS=${LILY_PROFILE_CONTEXTS:-256}
LILY_PROFILE_ARMS=${LILY_PROFILE_ARMS:-default,nopdl}
has_stage() { [[ ",$stages," == *",$1,"* ]]; }
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo "no git checkout here") (the device's .git may be the session's starting snapshot)"
  git status --porcelain 2>/dev/null | head -5 || true
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
  nvcc --version | tail -2
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Socket|L3'
  free -g | head -2
} | tee "$out/machine.txt"

if has_stage archs; then
  # Every architecture of the default list must compile (the H200 runs only its own).
  (a_start=$(date +%s)
   cmake -S . -B build-archs -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_BUILD_TESTS=OFF \
     -DLILY_WITH_SERVER=OFF -DLILY_WITH_CUDA=ON -DCMAKE_PREFIX_PATH="$deps" \
     -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" >"$out/archs.log" 2>&1 &&
   nice cmake --build build-archs --target lily_backend_cuda >>"$out/archs.log" 2>&1 &&
   echo "archs: compiled for $(grep -o 'architectures [^)]*' "$out/archs.log" | head -1) in $(( $(date +%s) - a_start )) s" ||
   { echo "archs: FAILED"; grep -E "error" "$out/archs.log" | head -20; }) >"$out/archs.txt" 2>&1 &
  archs_pid=$!
fi

start=$(date +%s)
with_server=OFF
if has_stage server || has_stage faults; then
  # Boost's headers travel as the .deb (fetch-deps.sh); unpacked once per machine.
  [ -f "$deps/include/boost/version.hpp" ] || dpkg -x .deps/debs/libboost1.81-dev_*.deb .deps/root
  with_server=ON
fi
# Only what the stages need: the CUDA tests take about half of a fresh machine's build. The lab
# (-DLILY_BUILD_LAB) is configured when a lab binary is wanted, or for the timeline's step_trace.
targets=(lily)
{ has_stage tests || has_stage ptx || has_stage ncu-attention; } && targets+=(cuda_tests)
labs=()
has_stage lab && labs+=(moe_layer_lab delta_net_layer_lab attention_lab)
has_stage ncu-stalls && labs+=(moe_layer_lab delta_net_layer_lab)
[ "${LILY_BUILD_MOE_LAB:-0}" = 1 ] && labs+=(moe_layer_lab)
with_lab=OFF
{ [ ${#labs[@]} -gt 0 ] || has_stage timeline; } && with_lab=ON
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_BUILD_TESTS=OFF \
  -DLILY_BUILD_CUDA_TESTS=ON -DLILY_WITH_SERVER=$with_server -DLILY_WITH_CUDA=ON \
  -DLILY_BUILD_LAB=$with_lab \
  -DCMAKE_CUDA_ARCHITECTURES="${LILY_CUDA_ARCHS:-90a}" -DCMAKE_PREFIX_PATH="$deps" \
  -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" \
  -DGTest_DIR="$deps/lib/x86_64-linux-gnu/cmake/GTest" >"$out/cmake.log" 2>&1
cmake --build build-gpu --target "${targets[@]}" "${labs[@]}" >>"$out/cmake.log" 2>&1 || { tail -60 "$out/cmake.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
lily=$PWD/build-gpu/lily

# Full production-shape checkpoint (19.5 GB) in an ignored folder, so a warm machine keeps it.
ckpt=$PWD/build-gpu/full-seed1
ensure_full() {
  if [ ! -f "$ckpt/model.safetensors.index.json" ]; then
    rm -rf "$ckpt"
    "$lily" make-checkpoint --profile full --seed 1 --out "$ckpt" >"$out/make-checkpoint.log" 2>&1
    tail -1 "$out/make-checkpoint.log"
  fi
}
tiny=$PWD/build-gpu/tiny-seed1
[ -f "$tiny/config.json" ] || "$lily" make-checkpoint --profile tiny --seed 1 --out "$tiny" >/dev/null

if has_stage lab; then
  timeout 120 ./build-gpu/moe_layer_lab 2>&1 | tee "$out/moe_layer_lab.txt" || echo "lab: rc $?"
  timeout 120 ./build-gpu/delta_net_layer_lab 2>&1 | tee "$out/delta_net_layer_lab.txt" || echo "lab: rc $?"
  timeout 120 ./build-gpu/attention_lab 2>&1 | tee "$out/attention_lab.txt" || echo "lab: rc $?"
fi

if has_stage timeline; then
  # Built on its own: the target exists only where CMake found CUPTI (CMakeLists.txt says so).
  if ! cmake --build build-gpu --target step_trace >>"$out/cmake.log" 2>&1; then
    echo "timeline: step_trace did not build (CUPTI found? see cmake.log)"
  else
    ensure_full
    kv=(); [ -z "${LILY_KV_CACHE:-}" ] || kv=(--kv-cache "$LILY_KV_CACHE")
    for ctx in ${LILY_PROFILE_CONTEXTS//,/ }; do
      echo -n "timeline ctx $ctx, no tracing: "
      timeout 300 "$lily" bench --model "$ckpt" --prompt-len "$ctx" --device cuda "${kv[@]}" \
        --json-out "$out/timeline-$ctx-untraced.json" 2>&1 | tail -1
      echo -n "timeline ctx $ctx, traced: "
      CUDA_INJECTION64_PATH=$PWD/build-gpu/libstep_trace.so LILY_TRACE_OUT=$out/timeline-$ctx.csv \
        timeout 300 "$lily" bench --model "$ckpt" --prompt-len "$ctx" --device cuda "${kv[@]}" \
        --json-out "$out/timeline-$ctx-traced.json" 2>&1 | tail -2
      python3 tools/gpu/step_timeline.py "$out/timeline-$ctx.csv" --per-kernel "$out/timeline-$ctx.tsv" \
        >"$out/timeline-$ctx.txt" 2>&1 || echo "step_timeline: rc $?"
      head -40 "$out/timeline-$ctx.txt"
      [ ! -f "$out/timeline-$ctx.csv" ] || gzip -f "$out/timeline-$ctx.csv"
    done
  fi
fi

if has_stage profile; then
  ensure_full
  start=$(date +%s)
  # One metric needs one pass, so kernels are not replayed; graph nodes are profiled one by one.
  # (LILY_NCU=0 skips it and keeps only the bench arms.)
  [ "${LILY_NCU:-1}" = 0 ] || timeout 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page details \
    --launch-count "${LILY_NCU_KERNELS:-2400}" \
    "$lily" run --model "$ckpt" --prompt-ids 1,2,3,4,5,6 --max-tokens 4 --device cuda \
    >"$out/ncu-decode.csv" 2>"$out/ncu-decode.err" || echo "ncu: rc $?"
  [ ! -f "$out/ncu-decode.csv" ] || gzip -f "$out/ncu-decode.csv"
  # LILY_NCU_DETAIL=<kernel name regex>: the full Nsight Compute section set of the first
  # decode-step launch of the matching kernel (throughput, stall reasons, occupancy).
  if [ -n "${LILY_NCU_DETAIL:-}" ]; then
    timeout 200 ncu --set full -k "regex:${LILY_NCU_DETAIL}" --launch-skip 1 --launch-count 1 \
      "$lily" run --model "$ckpt" --prompt-ids 1,2,3,4,5,6 --max-tokens 3 --device cuda \
      >"$out/ncu-detail.txt" 2>"$out/ncu-detail.err" || echo "ncu detail: rc $?"
  fi
  echo "ncu: $(( $(date +%s) - start )) s"
  # `lily bench` arms: each context of LILY_PROFILE_CONTEXTS with each arm of LILY_PROFILE_ARMS
  # (default: the default build; nopdl: without programmatic dependent launch; nostream:
  # without the bulk-copy lm_head GEMV; noconv: without the conv inside the delta rule;
  # nomoelayer: the MoE block's four op-path launches instead of the persistent kernel).
  for ctx in ${LILY_PROFILE_CONTEXTS//,/ }; do
    for arm in ${LILY_PROFILE_ARMS//,/ }; do
      case $arm in
        default) flags=(); env=() ;;
        kvf32) flags=(--kv-cache f32); env=() ;;
        kvbf16) flags=(--kv-cache bf16); env=() ;;
        kvint8) flags=(--kv-cache int8); env=() ;;
        nopdl) flags=(--cuda-disable pdl); env=() ;;
        nostream) flags=(--cuda-disable stream-gemv); env=() ;;
        noconv) flags=(--cuda-disable fused-conv); env=() ;;
        nomoelayer) flags=(--cuda-disable moe-layer); env=() ;;
        *) echo "unknown arm $arm"; continue ;;
      esac
      echo -n "ctx $ctx $arm: "
      # A long prompt is prefilled twice (the untimed warm-up, then the measured run).
      env "${env[@]}" timeout $(( 150 + ctx / 1000 )) "$lily" bench --model "$ckpt" --prompt-len "$ctx" --device cuda \
        "${flags[@]}" --json-out "$out/bench-$ctx-$arm.json" 2>&1 | tail -1
    done
  done
fi

if has_stage sampling; then
  ensure_full
  # Greedy and the sampling arm alternately, twice, in one process each (same machine state),
  # on CUDA and (LILY_SAMPLING_CPU=1, the default) on the host's cores.
  devices=cuda
  [ "${LILY_SAMPLING_CPU:-1}" = 1 ] && devices="cuda cpu"
  for device in $devices; do
    for ctx in ${LILY_PROFILE_CONTEXTS//,/ }; do
      for round in $(seq "${LILY_SAMPLING_ROUNDS:-2}"); do
        for arm in greedy sampling; do
          flags=()
          [ "$arm" = sampling ] && flags=(--sampling)
          [ "$device" = cpu ] && flags+=(--threads "${LILY_THREADS:-16}")
          echo -n "$device ctx $ctx $arm round $round: "
          timeout 150 "$lily" bench --model "$ckpt" --prompt-len "$ctx" --device "$device" "${flags[@]}" \
            --json-out "$out/bench-$device-$ctx-$arm-$round.json" 2>&1 | tail -1
        done
      done
    done
  done
fi

if has_stage server; then
  ensure_full
  start=$(date +%s)
  # The suites start their own servers; LILY_SERVE_EXTRA_ARGS is appended to every
  # `lily serve` they start (tests/server/lily_server_harness.py).
  groups=${LILY_SERVER_GROUPS:-sse-stream,sse-text,sse-fields,sse-cancel,validation,output}
  for group in ${groups//,/ }; do
    suite=tests/server/test_http_raw.py
    case $group in sse-*) suite=tests/server/test_sse.py; group=${group#sse-} ;; esac
    for model in ${LILY_SERVER_MODELS:-tiny full}; do
      [ "$model" = full ] && [ "$group" != stream ] && continue  # a server start loads 19.5 GB
      model_dir=$tiny; [ "$model" = full ] && model_dir=$ckpt
      echo -n "server $(basename $suite) $group on $model (cuda): "
      LILY_SERVE_EXTRA_ARGS="--device cuda" LILY_TEST_MODEL="$model_dir" timeout 300 \
        python3 "$suite" --lily "$lily" --group "$group" >"$out/server-$group-$model.log" 2>&1 \
        && echo ok || { echo "FAILED (rc $?)"; tail -15 "$out/server-$group-$model.log"; }
    done
  done
  # /metrics through Prometheus' own parser (Debian's python3-prometheus-client, unpacked
  # into .deps by fetch-deps.sh), device memory from the CUDA backend.
  echo -n "server test_metrics.py on tiny (cuda): "
  PYTHONPATH=$deps/lib/python3/dist-packages LILY_SERVE_EXTRA_ARGS="--device cuda" timeout 300 \
    python3 tests/server/test_metrics.py --lily "$lily" >"$out/server-metrics-tiny.log" 2>&1 \
    && echo ok || { echo "FAILED (rc $?)"; tail -15 "$out/server-metrics-tiny.log"; }
  echo "server suites: $(( $(date +%s) - start )) s"
  # The streaming figure: one stream at a time through lily serve, and lily bench at 256 in the
  # same call.
  port=18431
  "$lily" serve --model "$ckpt" --device cuda --bind 127.0.0.1:$port --max-seq 4096 \
    >"$out/serve-full.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 120); do grep -q "serving " "$out/serve-full.log" && break; sleep 1; done
  timeout 200 python3 tools/loadtest/stream_bench.py --url 127.0.0.1:$port --prompt-words 200 \
    --max-tokens 256 --runs 6 >"$out/stream-bench.json" 2>"$out/stream-bench.err" || echo "stream bench: rc $?"
  kill -INT $serve_pid; wait $serve_pid || true
  grep -h median "$out/stream-bench.json" || tail -5 "$out/stream-bench.err"
  timeout 150 "$lily" bench --model "$ckpt" --prompt-len 256 --device cuda \
    --json-out "$out/bench-256-for-stream.json" 2>&1 | tail -1
fi

if has_stage faults; then
  start=$(date +%s)
  timeout 400 python3 tests/server/test_faults.py --lily "$lily" --device cuda \
    >"$out/faults.log" 2>&1 && echo "faults (cuda): ok" || { echo "faults (cuda): FAILED (rc $?)"; tail -30 "$out/faults.log"; }
  grep -E "^(test_|Ran |OK|FAILED|SKIPPED)" "$out/faults.log" | head -20
  # Start-up memory check: all but 1 GiB of the GPU held by another process.
  python3 -c "
import sys, time, torch
free, total = torch.cuda.mem_get_info()
held = torch.empty(free - (1 << 30), dtype=torch.uint8, device='cuda')
print('holding', free >> 20, 'MiB of', total >> 20, flush=True)
time.sleep(60)" >"$out/oom-holder.log" 2>&1 &
  holder=$!
  for _ in $(seq 60); do grep -q holding "$out/oom-holder.log" && break; sleep 1; done
  rc=0
  timeout 60 "$lily" serve --model "$tiny" --device cuda --bind 127.0.0.1:0 >"$out/oom-serve.log" 2>&1 || rc=$?
  echo "start-up with 1 GiB free: rc $rc (expected 2): $(grep -h 'error' "$out/oom-serve.log" | head -2)"
  kill $holder 2>/dev/null; wait $holder 2>/dev/null || true
  echo "faults: $(( $(date +%s) - start )) s"
fi

if has_stage ptx; then
  start=$(date +%s)
  CUDA_FORCE_PTX_JIT=1 timeout 300 "$lily" run --model "$tiny" --prompt-ids 1,2,3,4,5,6 --max-tokens 4 \
    --device cuda 2>&1 | grep -E "using CUDA|error" | head -3
  CUDA_FORCE_PTX_JIT=1 timeout 400 ./build-gpu/tests/cuda/cuda_tests \
    --gtest_filter="CudaDecode.*:Tiny/CudaGoldenTest.*:*Gemv*:*Sampler*" >"$out/cuda_tests_ptx.log" 2>&1 || true
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$out/cuda_tests_ptx.log" | tail -20 || true
  echo "ptx: $(( $(date +%s) - start )) s"
fi

if has_stage tests; then
  ensure_full
  start=$(date +%s)
  LILY_FULL_CHECKPOINT=$ckpt timeout 400 ./build-gpu/tests/cuda/cuda_tests --gtest_filter="${LILY_GTEST_FILTER:-*}" \
    --gtest_output=json:"$out/cuda_tests.json" >"$out/cuda_tests.log" 2>&1 || true
  echo "cuda_tests: $(( $(date +%s) - start )) s"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$out/cuda_tests.log" | tail -40 || true
fi

if has_stage ncu-stalls; then
  start=$(date +%s)
  csvs=()
  # (ncu's demangled names spell template arguments as "(int)4".)
  for arm in moe:moe_layer_kernel:moe_layer_lab gemv:"gemv_kernel<\(int\)4, \(int\)1, \(int\)8":delta_net_layer_lab; do
    IFS=: read -r name kernel lab <<<"$arm"
    for cc in all none; do
      rep=/tmp/ncu-stalls-$name-$cc
      timeout 120 ncu --cache-control "$cc" --kernel-name-base demangled --section SourceCounters \
        --section WarpStateStats -k "regex:$kernel" --launch-skip 20 --launch-count 1 -f -o "$rep" \
        "./build-gpu/$lab" >"$rep.log" 2>&1 || echo "ncu-stalls $name $cc: rc $? ($(tail -1 "$rep.log"))"
      if ! { ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>>"$rep.log" &&
             python3 tools/gpu/ncu_stalls.py "$rep.csv" >"$out/ncu-stalls-$name-$cc.txt" 2>&1; }; then
        echo "ncu-stalls $name $cc: no stall table ($(tail -1 "$rep.log"))"
      fi
      cat "$out/ncu-stalls-$name-$cc.txt" 2>/dev/null || true
      csvs+=("$(basename "$rep.csv")")
    done
  done
  tar -czf "$out/ncu-stalls.tgz" -C /tmp "${csvs[@]}" 2>/dev/null || true
  echo "ncu-stalls: $(( $(date +%s) - start )) s"
fi

if has_stage ncu-attention; then
  start=$(date +%s)
  # The last LongHistory case decodes the model's shape at 131,072 keys; each kernel's first
  # launch there is the one the milestone's context pays for.
  # (bf16: its first launch of that shape is at 19,990 keys, so one is skipped.)
  for arm in int8:decode_tc_int8_kernel:CudaInt8KvCache.LongHistory:0 bf16:decode_tc_kernel:CudaAttention.Bf16CacheLongHistory:1; do
    IFS=: read -r name kernel filter skip <<<"$arm"
    timeout 240 ncu --set full -k "regex:${kernel}" --launch-skip "$skip" --launch-count 1 \
      ./build-gpu/tests/cuda/cuda_tests --gtest_filter="$filter" \
      >"$out/ncu-attention-$name.txt" 2>"$out/ncu-attention-$name.err" || echo "ncu-attention $name: rc $?"
  done
  echo "ncu-attention: $(( $(date +%s) - start )) s"
fi

if has_stage sanitizer; then
  start=$(date +%s)
  timeout 150 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 \
    "$lily" run --model "$tiny" --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12 --max-tokens 8 --device cuda \
    >"$out/sanitizer-memcheck.log" 2>&1 && echo "memcheck: clean" || echo "memcheck: FAILED (rc $?)"
  tail -3 "$out/sanitizer-memcheck.log"
  echo "sanitizer: $(( $(date +%s) - start )) s"
fi

matrix_flags=()
if ! git rev-parse HEAD >/dev/null 2>&1 || [ -n "$(git status --porcelain 2>/dev/null)" ]; then
  matrix_flags+=(--allow-dirty)
fi
if has_stage bench-cuda; then
  ensure_full
  python3 tools/bench/run_matrix.py --lily "$lily" --model "$ckpt" --out "$out/matrix-cuda" \
    --device cuda --contexts "${LILY_CONTEXTS:-256,1024,4096,16384,65536,131072}" \
    ${LILY_KV_CACHE:+--kv-cache "$LILY_KV_CACHE"} \
    --arm-timeout 240 "${matrix_flags[@]}" 2>&1 | tee "$out/matrix-cuda.log" || true
  # The device tool brings back a handful of files: one archive per matrix.
  tar -czf "$out/matrix-cuda.tgz" -C "$out" matrix-cuda && rm -rf "$out/matrix-cuda"
fi
if has_stage bench-cpu; then
  ensure_full
  python3 tools/bench/run_matrix.py --lily "$lily" --model "$ckpt" --out "$out/matrix-cpu" \
    --device cpu --contexts "${LILY_CPU_CONTEXTS:-256,512,1024}" --threads "${LILY_THREADS:-16}" \
    "${matrix_flags[@]}" 2>&1 | tee "$out/matrix-cpu.log" || true
  tar -czf "$out/matrix-cpu.tgz" -C "$out" matrix-cpu && rm -rf "$out/matrix-cpu"
fi
if has_stage vs-llamacpp; then
  ensure_full
  peers=$PWD/.deps/peers
  # Outside the checkout: inside it, llama.cpp's CMake finds lily's .git and reports its commit.
  llama=/tmp/lily-peer/llama.cpp
  if [ ! -x "$llama/build/bin/llama-bench" ]; then
    rm -rf "$llama" && mkdir -p "$llama" && tar -xJf "$peers"/llama.cpp-*.tar.xz -C "$llama"
    v_start=$(date +%s)
    cmake -S "$llama" -B "$llama/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF >"$out/llama-cmake.log" 2>&1 &&
      cmake --build "$llama/build" --target llama-bench -j >>"$out/llama-cmake.log" 2>&1 ||
      { tail -30 "$out/llama-cmake.log"; exit 1; }
    echo "llama-bench: built in $(( $(date +%s) - v_start )) s"
  fi
  gguf=/tmp/lily-peer/synth.gguf
  [ -f "$gguf" ] || python3 "$peers/synth_qwen35moe_gguf.py" "$gguf" --gguf-py "$llama/gguf-py" \
    >"$out/gguf.log" 2>&1 || { tail -20 "$out/gguf.log"; exit 1; }
  vs_out=$out/vs-llamacpp-$(date +%H%M%S)
  python3 tools/bench/vs_llamacpp.py --lily "$lily" --model "$ckpt" \
    --llama-bench "$llama/build/bin/llama-bench" --gguf "$gguf" --threads "${LILY_THREADS:-16}" \
    --contexts "${LILY_VS_CONTEXTS:-256,4096}" --rounds "${LILY_VS_ROUNDS:-1}" --decode-steps 32 \
    --cpu-precision "${LILY_VS_PRECISION:-q8}" ${LILY_VS_KV:+--kv-cache "$LILY_VS_KV"} \
    --timeout 400 --out "$vs_out" 2>&1 | tee "$out/vs-llamacpp.log" || true
  tar -czf "$vs_out.tgz" -C "$out" "$(basename "$vs_out")" && rm -rf "$vs_out"
fi
if has_stage bench-cpu-tiny; then
  python3 tools/bench/run_matrix.py --lily "$lily" --model "$tiny" --out "$out/matrix-cpu-tiny" \
    --device cpu --threads 1 --contexts "${LILY_TINY_CONTEXTS:-256,512,1024,2048}" \
    --decode-steps 256 --cooldown 2 "${matrix_flags[@]}" 2>&1 | tee "$out/matrix-cpu-tiny.log" || true
  tar -czf "$out/matrix-cpu-tiny.tgz" -C "$out" matrix-cpu-tiny && rm -rf "$out/matrix-cpu-tiny"
fi

if [ -n "${archs_pid:-}" ]; then
  wait "$archs_pid" || true
  cat "$out/archs.txt"
fi

# The device tool brings back only a handful of files: everything but the machine notes and the
# matrix archives goes into one archive.
(cd "$out" && shopt -s nullglob && files=(*.log *.err *.json *.csv.gz) &&
  if [ ${#files[@]} -gt 0 ]; then tar -czf logs.tgz "${files[@]}" && rm -f "${files[@]}"; fi)

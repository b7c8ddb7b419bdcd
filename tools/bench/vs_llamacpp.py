# lily against llama.cpp on the CPU, side by side in one run: same threads, same contexts, engines alternating; a table with the ratios.
"""Side-by-side CPU benchmark: `lily bench --device cpu` against llama.cpp's `llama-bench`.

Both engines run the same model shape (lily: a `lily make-checkpoint --profile full`
directory; llama.cpp: a synthetic GGUF of the same shape, written with llama.cpp's gguf-py
outside the repository) with the same thread count, at each context, in rounds whose engine order alternates
(round 0: lily first, round 1: llama.cpp first, ...), so that slow drift of the machine
(thermal, page cache) falls on both. Nothing here is needed to build or test lily: the
llama.cpp build and the GGUF are arguments.

What is compared, per context C:
  prefill  lily: `lily bench --prompt-len C` prefill tok/s (a C-token prompt from position 0);
           llama.cpp: `llama-bench -p C -n 0 -d 0` avg_ts.
  decode   lily: the same run's decode tok/s (decode steps after the C-token prompt);
           llama.cpp: `llama-bench -p 0 -n D -d C` avg_ts (D tokens after a C-token depth).
The table gives the median over rounds and lily / llama.cpp; the bandwidth columns divide
each engine's decode bytes per token (lily's report: `bandwidth.bytes_per_step_at_mid_context`,
the same shape for both) by lily's same-run copy probe.

What a run costs on 2 threads at full shape: lily's bench prefills its prompt twice (an
untimed warm-up, then the measured one; about 50 s per 256 tokens), and llama-bench loads
the model in each of its two invocations (35-41 s) and prefills the depth again for decode.

    python3 tools/bench/vs_llamacpp.py --lily build/lily --model FULL_DIR \\
        --llama-bench LLAMA/build/bin/llama-bench --gguf synth.gguf \\
        --threads 2 --contexts 256,4096 --rounds 2 --out OUT_DIR

Python 3.11 standard library only. Writes OUT_DIR/{runs/, results.json, table.md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True


class BenchError(Exception):
    """A run that failed or printed something this script cannot read."""


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def preread(paths: list[Path]) -> float:
    """Reads every file once (64 MiB at a time) so that the engine about to run finds its
    model in the page cache, as the other engine's run may have pushed it out. Seconds."""
    start = time.monotonic()
    for path in paths:
        with path.open("rb") as f:
            while f.read(64 << 20):
                pass
    return time.monotonic() - start


def model_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file())


def run(cmd: list[str], log_stem: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout or None)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{cmd[0]} ran past {timeout:.0f} s: {' '.join(cmd)}") from e
    log_stem.with_suffix(".stdout.log").write_text(done.stdout)
    log_stem.with_suffix(".stderr.log").write_text(done.stderr)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise BenchError(f"{' '.join(cmd)} exited {done.returncode}:\n{tail}")
    return done


def run_lily(args: argparse.Namespace, ctx: int, stem: Path) -> dict[str, Any]:
    report = stem.with_suffix(".json")
    cmd = [str(args.lily), "bench", "--model", str(args.model), "--prompt-len", str(ctx),
           "--decode-steps", str(args.decode_steps), "--device", "cpu",
           "--threads", str(args.threads), "--json-out", str(report)]
    if args.cpu_precision is not None:
        cmd += ["--cpu-precision", args.cpu_precision]
    if args.kv_cache is not None:
        cmd += ["--kv-cache", args.kv_cache]
    run(cmd, stem, args.timeout)
    try:
        data = json.loads(report.read_text())
        return {
            "command": " ".join(cmd),
            "prefill_tok_s": float(data["results"]["prefill"]["tok_s"]),
            "decode_tok_s": float(data["results"]["decode"]["tok_s"]),
            "digest": data["results"]["decode"].get("token_digest"),
            "bytes_per_token": float(data["bandwidth"]["bytes_per_step_at_mid_context"]["total"]),
            "copy_bytes_per_s": float(data["bandwidth"]["copy_bytes_per_s"]),
            "commit": data.get("meta", {}).get("commit"),
            "dirty": data.get("meta", {}).get("dirty"),
            "code_path": data.get("device", {}).get("code_path", ""),
        }
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BenchError(f"{report}: not a lily-bench report with results and bandwidth ({e})") from e


def llama_avg_ts(stdout: str, what: str, n_prompt: int, n_gen: int, n_depth: int,
                 threads: int) -> tuple[float, str]:
    """The avg_ts of the one llama-bench test that matches, and its build_commit."""
    try:
        tests = json.loads(stdout)
    except ValueError as e:
        raise BenchError(f"llama-bench {what}: stdout is not JSON (-o json): {e}") from e
    if not isinstance(tests, list):
        raise BenchError(f"llama-bench {what}: expected a JSON array of tests")
    for t in tests:
        if not isinstance(t, dict):
            continue
        if (t.get("n_prompt"), t.get("n_gen"), t.get("n_depth")) == (n_prompt, n_gen, n_depth):
            if t.get("n_threads") not in (None, threads):
                raise BenchError(f"llama-bench {what}: ran {t.get('n_threads')} threads, asked {threads}")
            try:
                return float(t["avg_ts"]), str(t.get("build_commit", "unknown"))
            except (KeyError, TypeError, ValueError) as e:
                raise BenchError(f"llama-bench {what}: test without a numeric avg_ts ({e})") from e
    raise BenchError(f"llama-bench {what}: no test with n_prompt={n_prompt} n_gen={n_gen} "
                     f"n_depth={n_depth} in its output")


def run_llama(args: argparse.Namespace, ctx: int, stem: Path) -> dict[str, Any]:
    base = [str(args.llama_bench), "-m", str(args.gguf), "-t", str(args.threads), "-r", "1",
            "-o", "json"]
    prefill_cmd = base + ["-p", str(ctx), "-n", "0", "-d", "0"]
    decode_cmd = base + ["-p", "0", "-n", str(args.decode_steps), "-d", str(ctx)]
    prefill = run(prefill_cmd, stem.with_name(stem.name + "_prefill"), args.timeout)
    decode = run(decode_cmd, stem.with_name(stem.name + "_decode"), args.timeout)
    prefill_ts, commit = llama_avg_ts(prefill.stdout, "prefill", ctx, 0, 0, args.threads)
    decode_ts, _ = llama_avg_ts(decode.stdout, "decode", 0, args.decode_steps, ctx, args.threads)
    return {"prefill_command": " ".join(prefill_cmd), "decode_command": " ".join(decode_cmd),
            "prefill_tok_s": prefill_ts, "decode_tok_s": decode_ts, "commit": commit}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(runs: list[dict[str, Any]], contexts: list[int]) -> list[dict[str, Any]]:
    rows = []
    for ctx in contexts:
        lily = [r["lily"] for r in runs if r["context"] == ctx]
        llama = [r["llama"] for r in runs if r["context"] == ctx]
        row: dict[str, Any] = {"context": ctx, "rounds": len(lily)}
        for phase in ("prefill", "decode"):
            a = median([r[f"{phase}_tok_s"] for r in lily])
            b = median([r[f"{phase}_tok_s"] for r in llama])
            row[f"lily_{phase}_tok_s"] = a
            row[f"llama_{phase}_tok_s"] = b
            row[f"{phase}_ratio"] = a / b if b > 0 else float("nan")
        bytes_per_token = median([r["bytes_per_token"] for r in lily])
        copy = median([r["copy_bytes_per_s"] for r in lily])
        row["bytes_per_token"] = bytes_per_token
        row["copy_bytes_per_s"] = copy
        for engine in ("lily", "llama"):
            row[f"{engine}_bandwidth_used"] = (row[f"{engine}_decode_tok_s"] * bytes_per_token / copy
                                               if copy > 0 else float("nan"))
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"# lily vs llama.cpp, CPU, {meta['threads']} threads",
        "",
        f"* Machine: {meta['cpu']}; {meta['started']} to {meta['finished']}",
        f"* lily {meta['lily_commit']}{' (dirty)' if meta['lily_dirty'] else ''}, "
        f"llama.cpp {meta['llama_commit']}; {meta['rounds']} rounds, engine order alternating",
        f"* lily's CPU path: {meta['lily_code_path'] or 'unknown'}; KV cache: lily "
        f"{meta['lily_kv_cache']}, llama.cpp f16 (llama-bench's default)",
        f"* Command: `{meta['command']}`",
        "",
        "| context | lily prefill tok/s | llama.cpp prefill tok/s | ratio | lily decode tok/s "
        "| llama.cpp decode tok/s | ratio | bandwidth used lily / llama.cpp |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['context']:,} | {r['lily_prefill_tok_s']:.2f} | {r['llama_prefill_tok_s']:.2f} "
            f"| **{r['prefill_ratio']:.2f}** | {r['lily_decode_tok_s']:.2f} | {r['llama_decode_tok_s']:.2f} "
            f"| **{r['decode_ratio']:.2f}** | {100 * r['lily_bandwidth_used']:.0f}% / "
            f"{100 * r['llama_bandwidth_used']:.0f}% |")
    lines += ["", "Medians over rounds; bandwidth used: decode tok/s x lily's bytes per token "
              "(the same shape for both) / lily's same-run copy probe."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lily", required=True, type=Path, help="the lily binary")
    p.add_argument("--model", required=True, type=Path, help="lily checkpoint directory")
    p.add_argument("--llama-bench", required=True, type=Path, help="llama.cpp's llama-bench binary")
    p.add_argument("--gguf", required=True, type=Path, help="the GGUF of the same shape")
    p.add_argument("--out", required=True, type=Path, help="output directory (must be empty or absent)")
    p.add_argument("--threads", type=int, default=2, help="threads for both engines (default 2)")
    p.add_argument("--contexts", default="256,4096", help="comma-separated contexts (default 256,4096)")
    p.add_argument("--rounds", type=int, default=2, help="rounds, >= 1 (default 2)")
    p.add_argument("--decode-steps", type=int, default=32, help="decode tokens per run (default 32)")
    p.add_argument("--cpu-precision", choices=("exact", "fast", "q8"), default=None,
                   help="lily's --cpu-precision (default: lily's default, exact)")
    p.add_argument("--kv-cache", choices=("f32", "bf16", "int8"), default=None,
                   help="lily's --kv-cache (default: lily's default, f32). llama-bench keeps its "
                        "default f16 cache, so bf16 compares caches of the same bytes")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="seconds one engine invocation may run (default 0: no limit)")
    p.add_argument("--no-preread", action="store_true",
                   help="do not read each model into the page cache before its engine runs")
    args = p.parse_args(argv)
    try:
        args.contexts_list = [int(c) for c in args.contexts.split(",")]
    except ValueError:
        p.error(f"--contexts is {args.contexts!r}, expected comma-separated positive integers")
    if any(c <= 0 for c in args.contexts_list):
        p.error(f"--contexts is {args.contexts!r}, expected comma-separated positive integers")
    if args.rounds < 1 or args.threads < 1 or args.decode_steps < 1:
        p.error("--rounds, --threads and --decode-steps must be at least 1")
    for name in ("lily", "llama_bench"):
        path = getattr(args, name)
        if not (path.is_file() and os.access(path, os.X_OK)):
            p.error(f"--{name.replace('_', '-')} {path}: not an executable file")
    if not (args.model / "config.json").is_file():
        p.error(f"--model {args.model}: no config.json (a `lily make-checkpoint` directory?)")
    if not args.gguf.is_file():
        p.error(f"--gguf {args.gguf}: not a file")
    if args.out.exists() and any(args.out.iterdir()):
        p.error(f"--out {args.out}: exists and is not empty")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    runs_dir = args.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    started = now_iso()
    runs: list[dict[str, Any]] = []
    try:
        for rnd in range(args.rounds):
            for ctx in args.contexts_list:
                order = ("lily", "llama") if rnd % 2 == 0 else ("llama", "lily")
                entry: dict[str, Any] = {"round": rnd, "context": ctx, "order": list(order)}
                for engine in order:
                    stem = runs_dir / f"{engine}_ctx{ctx}_round{rnd}"
                    if not args.no_preread:
                        files = model_files(args.model) if engine == "lily" else [args.gguf]
                        entry[f"{engine}_preread_s"] = round(preread(files), 1)
                    print(f"round {rnd} context {ctx}: {engine} ...", file=sys.stderr, flush=True)
                    entry[engine] = run_lily(args, ctx, stem) if engine == "lily" else run_llama(args, ctx, stem)
                    print(f"  prefill {entry[engine]['prefill_tok_s']:.2f} tok/s, decode "
                          f"{entry[engine]['decode_tok_s']:.2f} tok/s", file=sys.stderr, flush=True)
                runs.append(entry)
    except BenchError as e:
        print(f"vs_llamacpp: {e}", file=sys.stderr)
        (args.out / "results.json").write_text(json.dumps({"error": str(e), "runs": runs}, indent=2) + "\n")
        return 1
    rows = summarise(runs, args.contexts_list)
    meta = {
        "threads": args.threads, "cpu": cpu_model(), "started": started, "finished": now_iso(),
        "rounds": args.rounds, "decode_steps": args.decode_steps,
        "lily_commit": runs[0]["lily"]["commit"], "lily_dirty": bool(runs[0]["lily"]["dirty"]),
        "llama_commit": runs[0]["llama"]["commit"],
        "lily_code_path": runs[0]["lily"].get("code_path", ""),
        "lily_kv_cache": args.kv_cache or "f32 (lily's default)",
        "command": " ".join([Path(sys.argv[0]).name] + argv),
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows, "runs": runs},
                                                      indent=2) + "\n")
    text = table(rows, meta)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

# Fail-closed benchmark matrix: `lily bench` over many contexts and rounds -> JSON reports, summary, markdown table, SVG plot.
"""Benchmark matrix runner for `lily bench` (issue 6; docs/bench.md, "The matrix").

Runs `lily bench` once per (context, round) arm, each arm in a fresh process. Round 0 runs the
contexts ascending, round 1 descending, and so on alternately. Every report is validated as it
arrives; after the last arm the rounds are compared per context. The runner is fail-closed:
any doubt about the numbers is a refusal, and a refused matrix writes no table and no plot.

Exit status:
  0  every check passed: <out>/summary.json (status "ok"), <out>/table.md and <out>/plot.svg
     are written and the last line on stdout is `MATRIX_COMPLETE <out>`.
  1  an arm failed: non-zero exit, timeout, or a report that is missing, not JSON or not a
     well-formed lily-bench/1 report for the arm that was asked for (summary status "failed").
  2  refused: bad arguments, output directory not empty, dirty tree (untracked files count,
     ignored files do not), a report whose meta.commit is not HEAD or whose meta.dirty is
     true, HEAD, the tree or the binary changed during the run, arms that disagree on
     device, threads, checkpoint or build, a tok/s that is not finite and > 0, a
     token digest that differs between rounds, or a round-to-round drift (last round / first
     round) of prefill or decode tok/s beyond --drift-limit (summary status "refused").

--allow-dirty (development only) accepts a dirty tree and reports with meta.dirty true; it is
recorded in summary.json and manifest.json and the table and the plot say so in capitals.
The commit check stays: a binary not built from HEAD is always refused.

Layout of <out>: manifest.json (rewritten atomically before and after every arm),
reports/ctx<N>_round<R>.json with .stdout.log and .stderr.log beside it, summary.json, and
on success table.md and plot.svg. See docs/bench.md.

Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

DEFAULT_CONTEXTS = "256,512,1024,2048,4096,8192,16384,32768,65536,131072"
PROMPT_KIND = "u32_golden_ratio_hash_mod_vocab"
SCHEMA = "lily-bench/1"
STATE_LIMIT = 262144  # lily bench: prompt_len + decode_steps + 1 must fit

EXIT_OK = 0
EXIT_ARM_FAILED = 1
EXIT_REFUSED = 2


class Stop(Exception):
    """Ends the run: `code` is the exit status, `reasons` say why (one line each)."""

    def __init__(self, code: int, reasons: list[str] | str):
        self.code = code
        self.reasons = [reasons] if isinstance(reasons, str) else list(reasons)
        super().__init__("; ".join(self.reasons))


def refuse(reasons: list[str] | str) -> Stop:
    return Stop(EXIT_REFUSED, reasons)


def arm_failed(reasons: list[str] | str) -> Stop:
    return Stop(EXIT_ARM_FAILED, reasons)


# ----------------------------------------------------------------------------- small helpers


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(value, indent=2, allow_nan=False) + "\n")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fnv1a64(ids: list[int]) -> str:
    """lily's token digest: FNV-1a-64 over the ids as whole u32 values, 16 hex digits."""
    h = 0xCBF29CE484222325
    for token in ids:
        h ^= token & 0xFFFFFFFF
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def finite_positive(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=False)


# ----------------------------------------------------------------------------- arguments


def parse_contexts(text: str) -> list[int]:
    contexts = []
    for part in text.split(","):
        part = part.strip()
        if not re.fullmatch(r"[0-9]+", part) or int(part) <= 0:
            raise refuse(f"--contexts: {part!r} is not a positive integer (got {text!r})")
        contexts.append(int(part))
    if len(set(contexts)) != len(contexts):
        raise refuse(f"--contexts: {text!r} lists a context twice")
    return sorted(contexts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Fail-closed `lily bench` matrix: contexts x rounds, a fresh process per arm.",
        epilog="Exit 0: complete; 1: an arm failed; 2: refused (reason on stderr and in "
               "summary.json). See docs/bench.md.")
    p.add_argument("--lily", required=True, help="the lily binary")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--out", required=True, help="output directory (must be empty or absent)")
    p.add_argument("--contexts", default=DEFAULT_CONTEXTS,
                   help=f"comma-separated prompt lengths (default {DEFAULT_CONTEXTS})")
    p.add_argument("--rounds", type=int, default=2, help="rounds, >= 2 (default 2)")
    p.add_argument("--decode-steps", type=int, default=64, help="measured decode steps (default 64)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                   help="backend passed to lily bench (default: lily's default, auto)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads passed to lily bench (default: lily's default, all cores)")
    p.add_argument("--kv-cache", choices=("f32", "bf16", "int8"), default=None,
                   help="KV cache dtype passed to lily bench (default: lily's default for the device)")
    p.add_argument("--copy-probe-mib", type=int, default=None,
                   help="copy-bandwidth probe size passed to lily bench (default: lily's, 512)")
    p.add_argument("--drift-limit", type=float, default=0.03,
                   help="refuse when |last round / first round - 1| exceeds this for prefill or "
                        "decode tok/s (default 0.03)")
    p.add_argument("--cooldown", type=float, default=0.0,
                   help="seconds to sleep before each arm (default 0)")
    p.add_argument("--arm-timeout", type=float, default=0.0,
                   help="seconds one arm may run before it counts as failed (default 0: no limit)")
    p.add_argument("--repo", default=None,
                   help="git checkout the binary was built from (default: the repository "
                        "containing this script)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="DEVELOPMENT ONLY: accept a dirty tree; recorded and shown loudly")
    return p


def check_arguments(args: argparse.Namespace) -> list[int]:
    contexts = parse_contexts(args.contexts)
    if args.rounds < 2:
        raise refuse(f"--rounds is {args.rounds}: at least 2 rounds are needed to check "
                     "the digest and the drift")
    if args.decode_steps <= 0:
        raise refuse(f"--decode-steps is {args.decode_steps}, expected > 0")
    if args.threads is not None and args.threads < 0:
        raise refuse(f"--threads is {args.threads}, expected >= 0")
    if args.copy_probe_mib is not None and args.copy_probe_mib < 256:
        raise refuse(f"--copy-probe-mib is {args.copy_probe_mib}, expected >= 256 (larger than the caches)")
    if not (math.isfinite(args.drift_limit) and args.drift_limit > 0):
        raise refuse(f"--drift-limit is {args.drift_limit}, expected a finite value > 0")
    if not (math.isfinite(args.cooldown) and args.cooldown >= 0):
        raise refuse(f"--cooldown is {args.cooldown}, expected >= 0")
    if not (math.isfinite(args.arm_timeout) and args.arm_timeout >= 0):
        raise refuse(f"--arm-timeout is {args.arm_timeout}, expected >= 0")
    for ctx in contexts:
        if ctx + args.decode_steps + 1 > STATE_LIMIT:
            raise refuse(f"context {ctx} + --decode-steps {args.decode_steps} + 1 exceeds "
                         f"lily's state limit {STATE_LIMIT}")
    return contexts


# ----------------------------------------------------------------------------- the repository


def repo_root(start: Path) -> Path:
    r = git(start, "rev-parse", "--show-toplevel")
    if r.returncode != 0:
        raise refuse(f"{start} is not inside a git checkout (git rev-parse: "
                     f"{r.stderr.strip() or 'failed'}); the runner needs the source tree to "
                     "check provenance (--repo)")
    return Path(r.stdout.strip()).resolve()


def repo_head(repo: Path) -> str:
    r = git(repo, "rev-parse", "HEAD")
    head = r.stdout.strip()
    if r.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", head):
        raise refuse(f"git rev-parse HEAD in {repo} failed ({r.stderr.strip()!r}); a commit "
                     "is needed for provenance")
    return head


def repo_changes(repo: Path) -> list[str]:
    """`git status --porcelain` lines: modified, staged, deleted and untracked (not ignored)."""
    r = git(repo, "status", "--porcelain", "--untracked-files=all")
    if r.returncode != 0:
        raise refuse(f"git status in {repo} failed: {r.stderr.strip()}")
    return [line for line in r.stdout.splitlines() if line.strip()]


def dirty_reason(repo: Path, changes: list[str]) -> str:
    shown = ", ".join(repr(c) for c in changes[:8])
    more = f" and {len(changes) - 8} more" if len(changes) > 8 else ""
    return (f"dirty tree: {repo} has {len(changes)} uncommitted change(s) (git status "
            f"--porcelain, untracked files count): {shown}{more}; commit or stash them, "
            "rebuild, and run again (--allow-dirty is for development only)")


def inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


# ----------------------------------------------------------------------------- report checks


def get(report: dict, dotted: str) -> Any:
    value: Any = report
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise KeyError(dotted)
        value = value[key]
    return value


def validate_report(report: Any, ctx: int, steps: int, threads: int | None) -> list[str]:
    """Structural checks of one report for the arm that asked for it (failures -> exit 1)."""
    if not isinstance(report, dict):
        return ["the report is not a JSON object"]
    problems: list[str] = []

    def expect(dotted: str, check, what: str) -> Any:
        try:
            value = get(report, dotted)
        except KeyError:
            problems.append(f"{dotted} is missing")
            return None
        if not check(value):
            problems.append(f"{dotted} is {value!r}, expected {what}")
        return value

    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    is_num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    expect("schema", lambda v: v == SCHEMA, repr(SCHEMA))
    expect("schema_version", lambda v: v == 1, "1")
    expect("meta.engine", lambda v: v == "lily", "'lily'")
    expect("meta.commit", lambda v: isinstance(v, str), "a string")
    expect("meta.dirty", lambda v: isinstance(v, bool), "true or false")
    expect("device.backend", lambda v: isinstance(v, str) and v, "a backend name")
    expect("device.name", lambda v: isinstance(v, str), "a device name")
    expect("device.threads", lambda v: is_int(v) and v > 0 and (not threads or v == threads),
           f"{threads}" if threads else "a positive integer")
    expect("workload.prompt_len", lambda v: v == ctx, f"{ctx} (the arm's context)")
    expect("workload.prompt_kind", lambda v: v == PROMPT_KIND, repr(PROMPT_KIND))
    expect("workload.decode_steps", lambda v: v == steps, f"{steps} (--decode-steps)")
    expect("workload.decode_mode", lambda v: isinstance(v, str) and v, "a decode mode")
    expect("workload.checkpoint_bytes", lambda v: is_int(v) and v > 0, "a positive integer")
    pre_wall = expect("results.prefill.wall_secs", is_num, "a number")
    # tok/s may be null (nlohmann writes a non-finite double as null): the aggregation refuses
    # it (exit 2) like any tok/s that is not finite and > 0.
    num_or_null = lambda v: v is None or is_num(v)  # noqa: E731
    pre_tok = expect("results.prefill.tok_s", num_or_null, "a number")
    expect("results.prefill.first_token_id", lambda v: is_int(v) and v >= 0, "a token id")
    dec_wall = expect("results.decode.wall_secs", is_num, "a number")
    dec_tok = expect("results.decode.tok_s", num_or_null, "a number")
    step_walls = expect("results.decode.step_wall_secs",
                        lambda v: isinstance(v, list) and len(v) == steps
                        and all(is_num(x) and math.isfinite(x) and x >= 0 for x in v),
                        f"a list of {steps} finite non-negative numbers")
    ids = expect("results.decode.token_ids",
                 lambda v: isinstance(v, list) and len(v) == steps
                 and all(is_int(x) and 0 <= x < 2**32 for x in v),
                 f"a list of {steps} token ids")
    digest = expect("results.decode.token_digest",
                    lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{16}", v),
                    "16 lower-case hex digits")
    for key in ("achieved_bytes_per_s", "copy_bytes_per_s", "utilisation", "floor_tok_s",
                "decode_bytes_total", "bytes_per_step_at_mid_context.total"):
        expect("bandwidth." + key, is_num, "a number")
    for key in ("prefill_flops", "prefill_flop_s", "matmul_flop_s", "utilisation"):
        expect("compute." + key, is_num, "a number")
    if problems:
        return problems
    # Internal consistency: the digest is over the ids, tok/s = tokens / wall.
    if fnv1a64(ids) != digest:
        problems.append(f"results.decode.token_digest {digest} is not the FNV-1a-64 of "
                        f"token_ids ({fnv1a64(ids)})")
    for name, tokens, wall, rate in (("prefill", ctx, pre_wall, pre_tok),
                                     ("decode", steps, dec_wall, dec_tok)):
        if finite_positive(wall) and finite_positive(rate):
            if abs(tokens / wall - rate) > 1e-6 * rate:
                problems.append(f"results.{name}.tok_s {rate} is not {tokens} / wall_secs "
                                f"{wall} = {tokens / wall}")
    if finite_positive(dec_wall) and abs(sum(step_walls) - dec_wall) > 1e-3 * dec_wall + 1e-6:
        problems.append(f"results.decode.step_wall_secs sum to {sum(step_walls)}, "
                        f"not wall_secs {dec_wall}")
    return problems


# ----------------------------------------------------------------------------- the runner


class Matrix:
    def __init__(self, args: argparse.Namespace, argv: list[str]):
        self.args = args
        self.argv = argv
        self.out = Path(args.out).resolve()
        self.reports_dir = self.out / "reports"
        self.can_write = False  # set once the output directory is known to be ours
        self.manifest: dict[str, Any] = {}
        self.reports: dict[tuple[int, int], dict] = {}
        self.contexts: list[int] = []
        self.head = ""
        self.repo = Path(".")

    # -- pre-flight ------------------------------------------------------------------------

    def preflight(self) -> None:
        args = self.args
        self.contexts = check_arguments(args)
        if self.out.exists():
            if not self.out.is_dir():
                raise refuse(f"--out {self.out} exists and is not a directory")
            if any(self.out.iterdir()):
                raise refuse(f"--out {self.out} is not empty; the runner never mixes runs "
                             "(give a new directory)")
        lily = Path(args.lily)
        if not (lily.is_file() and os.access(lily, os.X_OK)):
            raise refuse(f"--lily {lily} is not an executable file")
        model = Path(args.model)
        if not model.is_dir():
            raise refuse(f"--model {model} is not a directory")
        start = Path(args.repo) if args.repo else Path(__file__).resolve().parent
        self.repo = repo_root(start)
        if inside(self.out, self.repo):
            ignored = git(self.repo, "check-ignore", "-q", str(self.out) + "/").returncode == 0
            if not ignored:
                raise refuse(f"--out {self.out} is inside the checkout {self.repo} and not "
                             "ignored by git: its files would dirty the tree; put it outside "
                             "the checkout or under an ignored path")
        self.out.mkdir(parents=True, exist_ok=True)
        self.can_write = True
        self.reports_dir.mkdir()
        self.head = repo_head(self.repo)
        changes = repo_changes(self.repo)
        self.manifest = {
            "schema": "lily-bench-matrix/1",
            "status": "running",
            "started": now_iso(),
            "command_line": shlex.join([sys.executable, *self.argv]),
            "protocol": {
                "contexts": self.contexts,
                "rounds": args.rounds,
                "decode_steps": args.decode_steps,
                "threads": args.threads,
                "device": args.device,
                "copy_probe_mib": args.copy_probe_mib,
                "drift_limit": args.drift_limit,
                "cooldown_secs": args.cooldown,
                "arm_timeout_secs": args.arm_timeout,
                "schedule": "even rounds ascending, odd rounds descending; fresh process per arm",
            },
            "source": {
                "repo": str(self.repo),
                "head": self.head,
                "clean": not changes,
                "changes": changes,
                "allow_dirty": args.allow_dirty,
            },
            "binary": {"path": str(lily.resolve()), "sha256": sha256_file(lily)},
            "model": {"dir": str(model.resolve()), "files": model_files(model)},
            "host": host_info(),
            "arms": [],
        }
        self.save_manifest()
        if changes and not args.allow_dirty:
            raise refuse(dirty_reason(self.repo, changes))

    def save_manifest(self) -> None:
        if self.can_write:
            write_json(self.out / "manifest.json", self.manifest)

    # -- arms ------------------------------------------------------------------------------

    def schedule(self) -> list[tuple[int, int]]:
        arms = []
        for rnd in range(self.args.rounds):
            order = self.contexts if rnd % 2 == 0 else list(reversed(self.contexts))
            arms.extend((rnd, ctx) for ctx in order)
        return arms

    def run_arm(self, rnd: int, ctx: int) -> None:
        args = self.args
        stem = f"ctx{ctx}_round{rnd}"
        json_path = self.reports_dir / f"{stem}.json"
        cmd = [str(Path(args.lily).resolve()), "bench", "--model", str(Path(args.model).resolve()),
               "--prompt-len", str(ctx), "--decode-steps", str(args.decode_steps),
               "--json-out", str(json_path)]
        if args.device is not None:
            cmd += ["--device", args.device]
        if args.threads is not None:
            cmd += ["--threads", str(args.threads)]
        if args.kv_cache is not None:
            cmd += ["--kv-cache", args.kv_cache]
        if args.copy_probe_mib is not None:
            cmd += ["--copy-probe-mib", str(args.copy_probe_mib)]
        # The child sees no LILY_* variables: nothing but the command line steers the arm.
        env = {k: v for k, v in os.environ.items() if not k.startswith("LILY_")}
        if args.cooldown > 0:
            time.sleep(args.cooldown)
        arm: dict[str, Any] = {"round": rnd, "context": ctx, "command": shlex.join(cmd),
                               "report": str(json_path.relative_to(self.out)),
                               "stdout": f"reports/{stem}.stdout.log",
                               "stderr": f"reports/{stem}.stderr.log",
                               "status": "running", "started": now_iso(),
                               "load_average_before": load_average()}
        self.manifest["arms"].append(arm)
        self.save_manifest()
        print(f"[matrix] round {rnd} context {ctx}: {shlex.join(cmd)}", file=sys.stderr,
              flush=True)
        started = time.monotonic()
        timed_out = False
        with (self.out / arm["stdout"]).open("wb") as so, (self.out / arm["stderr"]).open("wb") as se:
            try:
                proc = subprocess.run(cmd, stdout=so, stderr=se, env=env, check=False,
                                      stdin=subprocess.DEVNULL,
                                      timeout=args.arm_timeout if args.arm_timeout > 0 else None)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                timed_out, rc = True, None
            except OSError as e:
                arm.update(status="failed", error=str(e))
                self.save_manifest()
                raise arm_failed(f"round {rnd} context {ctx}: cannot start {cmd[0]}: {e}")
        arm["wall_secs"] = round(time.monotonic() - started, 3)
        arm["exit_status"] = rc
        arm["load_average_after"] = load_average()
        err_text = (self.out / arm["stderr"]).read_text(encoding="utf-8", errors="replace")
        err_lines = [line for line in err_text.splitlines() if line.strip()]
        arm["summary_line"] = err_lines[-1] if err_lines else ""
        if timed_out or rc != 0:
            why = (f"timed out after {args.arm_timeout} s" if timed_out
                   else f"exited with status {rc}")
            arm["status"] = "failed"
            self.save_manifest()
            tail = " | ".join(err_lines[-3:]) or "(no stderr)"
            raise arm_failed(f"round {rnd} context {ctx}: lily bench {why}; stderr: {tail} "
                             f"(log: {self.out / arm['stderr']})")
        try:
            report = json.loads(json_path.read_text(encoding="utf-8"),
                                parse_constant=reject_constant)
        except (OSError, ValueError) as e:
            arm["status"] = "failed"
            self.save_manifest()
            raise arm_failed(f"round {rnd} context {ctx}: report {json_path} is missing or not "
                             f"strict JSON: {e}")
        problems = validate_report(report, ctx, args.decode_steps, args.threads)
        if problems:
            arm["status"] = "failed"
            arm["problems"] = problems
            self.save_manifest()
            raise arm_failed([f"round {rnd} context {ctx}: report {json_path}: {p}"
                              for p in problems])
        # Provenance: the binary must be built from HEAD of a clean tree.
        commit, dirty = report["meta"]["commit"], report["meta"]["dirty"]
        provenance = []
        if commit != self.head:
            provenance.append(f"round {rnd} context {ctx}: the report's meta.commit {commit} "
                              f"is not HEAD {self.head} of {self.repo}: the binary was not "
                              "built from this checkout's HEAD (rebuild it)")
        if dirty and not args.allow_dirty:
            provenance.append(f"round {rnd} context {ctx}: the report's meta.dirty is true: "
                              "the binary was built from a dirty tree (commit, rebuild, rerun)")
        if self.reports:
            first = next(iter(self.reports.values()))
            for key in ("device.backend", "device.name", "device.threads",
                        "workload.checkpoint_bytes", "workload.profile", "workload.decode_mode",
                        "meta.build_type", "meta.compiler", "meta.build_flags"):
                a, b = get_or_none(first, key), get_or_none(report, key)
                if a != b:
                    provenance.append(f"round {rnd} context {ctx}: {key} is {b!r} but "
                                      f"{a!r} in an earlier arm: the arms are not comparable")
        arm["commit"], arm["dirty"] = commit, dirty
        arm["digest"] = report["results"]["decode"]["token_digest"]
        arm["prefill_tok_s"] = report["results"]["prefill"]["tok_s"]
        arm["decode_tok_s"] = report["results"]["decode"]["tok_s"]
        if provenance:
            arm["status"] = "refused"
            self.save_manifest()
            raise refuse(provenance)
        arm["status"] = "ok"
        self.save_manifest()
        self.reports[(ctx, rnd)] = report

    # -- after the arms --------------------------------------------------------------------

    def postflight(self) -> None:
        head = repo_head(self.repo)
        if head != self.head:
            raise refuse(f"HEAD of {self.repo} moved during the run: {self.head} -> {head}")
        changes = repo_changes(self.repo)
        if changes and not self.args.allow_dirty:
            raise refuse("the tree changed during the run; " + dirty_reason(self.repo, changes))
        binary = self.manifest["binary"]
        now = sha256_file(Path(binary["path"]))
        if now != binary["sha256"]:
            raise refuse(f"the binary {binary['path']} changed during the run (SHA-256 "
                         f"{binary['sha256'][:16]}… -> {now[:16]}…): the arms may not have run "
                         "the same build")

    def aggregate(self) -> list[dict]:
        rounds = self.args.rounds
        limit = self.args.drift_limit
        problems: list[str] = []
        rows: list[dict] = []
        for ctx in self.contexts:
            reps = [self.reports.get((ctx, r)) for r in range(rounds)]
            if any(r is None for r in reps):
                problems.append(f"context {ctx}: {sum(r is not None for r in reps)} of "
                                f"{rounds} reports")
                continue
            prefill = [r["results"]["prefill"]["tok_s"] for r in reps]
            decode = [r["results"]["decode"]["tok_s"] for r in reps]
            digests = [r["results"]["decode"]["token_digest"] for r in reps]
            bad = False
            for name, values in (("prefill", prefill), ("decode", decode)):
                for rnd, v in enumerate(values):
                    if not finite_positive(v):
                        problems.append(f"context {ctx}: {name} tok/s in round {rnd} is {v!r}, "
                                        "expected finite and > 0")
                        bad = True
            if len(set(digests)) != 1:
                shown = ", ".join(f"round {i}: {d}" for i, d in enumerate(digests))
                problems.append(f"context {ctx}: token digest changed between rounds ({shown}): "
                                "decode is not deterministic")
            drifts = {}
            if not bad:
                for name, values in (("prefill", prefill), ("decode", decode)):
                    drift = values[-1] / values[0]
                    drifts[name] = drift
                    if abs(drift - 1) > limit:
                        problems.append(
                            f"context {ctx}: {name} tok/s drifted {100 * (drift - 1):+.2f}% from "
                            f"round 0 ({values[0]:.4g}) to round {rounds - 1} ({values[-1]:.4g}), "
                            f"limit {100 * limit:g}%")
            if bad:
                continue

            def median(path: str) -> float:
                return statistics.median(get(r, path) for r in reps)

            rows.append({
                "context": ctx,
                "prefill_tok_s": statistics.median(prefill),
                "decode_tok_s": statistics.median(decode),
                "prefill_tok_s_rounds": prefill,
                "decode_tok_s_rounds": decode,
                "prefill_drift": drifts["prefill"],
                "decode_drift": drifts["decode"],
                "digest": digests[0],
                "digest_rounds": digests,
                "first_token_id": reps[0]["results"]["prefill"]["first_token_id"],
                "achieved_bytes_per_s": median("bandwidth.achieved_bytes_per_s"),
                "achieved_gb_s": median("bandwidth.achieved_bytes_per_s") / 1e9,
                "copy_bytes_per_s": median("bandwidth.copy_bytes_per_s"),
                "bandwidth_utilisation": median("bandwidth.utilisation"),
                "floor_tok_s": median("bandwidth.floor_tok_s"),
                "bytes_per_step_at_mid_context": median(
                    "bandwidth.bytes_per_step_at_mid_context.total"),
                "prefill_flop_s": median("compute.prefill_flop_s"),
                "matmul_flop_s": median("compute.matmul_flop_s"),
                "compute_utilisation": median("compute.utilisation"),
                "reports": [f"reports/ctx{ctx}_round{r}.json" for r in range(rounds)],
            })
        if problems:
            raise refuse(problems)
        return rows

    # -- outputs ---------------------------------------------------------------------------

    def header_facts(self) -> dict[str, Any]:
        first = self.reports[(self.contexts[0], 0)]
        dirty_reports = any(r["meta"]["dirty"] for r in self.reports.values())
        return {
            "date": now_iso(),
            "device": first["device"]["name"],
            "backend": first["device"]["backend"],
            "threads": first["device"]["threads"],
            "commit": self.head,
            "tree_clean": self.manifest["source"]["clean"],
            "binary_built_dirty": dirty_reports,
            "allow_dirty": self.args.allow_dirty,
            "build_type": first["meta"].get("build_type"),
            "compiler": first["meta"].get("compiler"),
            "profile": first["workload"].get("profile"),
            "checkpoint_bytes": first["workload"]["checkpoint_bytes"],
            "decode_mode": first["workload"]["decode_mode"],
            "model_dir": str(Path(self.args.model).resolve()),
            "command_line": self.manifest["command_line"],
            "load_average_1min": self.load_range(),
            "cpus": os.cpu_count(),
        }

    def load_range(self) -> tuple[float, float] | None:
        """The 1-minute load average seen before and after the arms: (min, max)."""
        seen = [a[key][0] for a in self.manifest.get("arms", [])
                for key in ("load_average_before", "load_average_after") if a.get(key)]
        return (min(seen), max(seen)) if seen else None

    def busy_note(self) -> str | None:
        load = self.load_range()
        cpus = os.cpu_count() or 1
        if load and load[1] > 0.75 * cpus:
            return (f"the machine was busy: the 1-minute load average reached {load[1]:.2f} on "
                    f"{cpus} CPUs during the arms (timings drift on a shared machine; run the "
                    "matrix on an idle one)")
        return None

    def summary_base(self, status: str) -> dict[str, Any]:
        return {
            "schema": "lily-bench-matrix-summary/1",
            "status": status,
            "commit": self.head or None,
            "allow_dirty": self.args.allow_dirty,
            "tree_clean": self.manifest.get("source", {}).get("clean"),
            "command_line": shlex.join([sys.executable, *self.argv]),
            "protocol": self.manifest.get("protocol"),
            "finished": now_iso(),
        }

    def write_success(self, rows: list[dict]) -> None:
        facts = self.header_facts()
        summary = self.summary_base("ok")
        summary.update(header=facts, contexts=rows)
        write_json(self.out / "summary.json", summary)
        write_atomic(self.out / "table.md", render_table(facts, rows, self.args))
        write_atomic(self.out / "plot.svg", render_svg(facts, rows, self.args))
        self.manifest["status"] = "ok"
        self.manifest["finished"] = summary["finished"]
        self.save_manifest()

    def write_stop(self, stop: Stop) -> None:
        if not self.can_write:
            return
        status = "refused" if stop.code == EXIT_REFUSED else "failed"
        summary = self.summary_base(status)
        note = self.busy_note()
        if note:
            print(f"run_matrix: note: {note}", file=sys.stderr)
            summary["notes"] = [note]
        summary.update(exit_status=stop.code, reason=stop.reasons[0] if len(stop.reasons) == 1
                       else f"{len(stop.reasons)} problems: " + "; ".join(stop.reasons),
                       reasons=stop.reasons,
                       arms_completed=len(self.reports))
        write_json(self.out / "summary.json", summary)
        if self.manifest:
            self.manifest.update(status=status, reasons=stop.reasons, finished=summary["finished"])
            self.save_manifest()

    def run(self) -> int:
        try:
            self.preflight()
            for rnd, ctx in self.schedule():
                self.run_arm(rnd, ctx)
            self.postflight()
            rows = self.aggregate()
            self.write_success(rows)
        except Stop as stop:
            word = "REFUSED" if stop.code == EXIT_REFUSED else "FAILED"
            for reason in stop.reasons:
                print(f"run_matrix: {word}: {reason}", file=sys.stderr)
            self.write_stop(stop)
            return stop.code
        except KeyboardInterrupt:
            self.write_stop(arm_failed("interrupted"))
            print("run_matrix: FAILED: interrupted", file=sys.stderr)
            return 130
        print(f"MATRIX_COMPLETE {self.out}", flush=True)
        return EXIT_OK


def reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def get_or_none(report: dict, dotted: str) -> Any:
    try:
        return get(report, dotted)
    except KeyError:
        return None


def model_files(model: Path) -> list[dict]:
    files = []
    for path in sorted(model.iterdir()):
        if path.is_file():
            entry: dict[str, Any] = {"name": path.name, "bytes": path.stat().st_size}
            # Small files (config, index, tokenizer, template) are hashed; weight shards are
            # recorded by size only (hashing 20 GB would take longer than a small matrix).
            if entry["bytes"] <= 64 << 20:
                entry["sha256"] = sha256_file(path)
            files.append(entry)
    return files


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {"uname": " ".join(os.uname()), "cpus": os.cpu_count(),
                            "python": sys.version.split()[0]}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_total"] = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return info


# ----------------------------------------------------------------------------- table and plot


def fmt_num(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def short_context(ctx: int) -> str:
    if ctx >= 1024 and ctx % 1024 == 0:
        return f"{ctx // 1024}K"
    return str(ctx)


def threads_text(facts: dict) -> str:
    return f"{facts['threads']} thread" + ("" if facts["threads"] == 1 else "s")


def dirty_banner(facts: dict) -> tuple[str, str] | None:
    """(headline, detail) for a run with --allow-dirty, else None."""
    if not facts["allow_dirty"]:
        return None
    state = [] if facts["tree_clean"] else ["the tree had uncommitted changes"]
    if facts["binary_built_dirty"]:
        state.append("the binary was built from a dirty tree")
    detail = "; ".join(state) if state else "no changes were seen, but the checks were off"
    return (f"DIRTY TREE ALLOWED (--allow-dirty, development only): these numbers are NOT "
            f"reproducible from commit {facts['commit'][:12]}", detail[0].upper() + detail[1:] + ".")


def render_table(facts: dict, rows: list[dict], args: argparse.Namespace) -> str:
    lines = ["# lily bench matrix", ""]
    banner = dirty_banner(facts)
    if banner:
        lines += [f"> **{banner[0]}.** {banner[1]}", ""]
    copy = statistics.median(r["copy_bytes_per_s"] for r in rows) / 1e9
    lines += [
        f"- date: {facts['date']}",
        f"- device: {facts['device']} (backend {facts['backend']}, {threads_text(facts)})",
        f"- commit: {facts['commit']}" + (" (tree dirty, --allow-dirty)"
                                         if facts["allow_dirty"] and not facts["tree_clean"]
                                         else ""),
        f"- build: {facts['build_type']}, {facts['compiler']}",
        f"- model: {facts['model_dir']} (profile {facts['profile']}, "
        f"{facts['checkpoint_bytes']:,} bytes)",
        f"- protocol: {args.rounds} rounds (ascending, then descending), fresh process per arm, "
        f"{args.decode_steps} decode steps ({facts['decode_mode']}), median of rounds, "
        f"drift limit {100 * args.drift_limit:g}%",
        f"- measured copy bandwidth (median): {copy:.2f} GB/s",
        f"- 1-minute load average around the arms: "
        + (f"{facts['load_average_1min'][0]:.2f} … {facts['load_average_1min'][1]:.2f}"
           if facts["load_average_1min"] else "unknown") + f" ({facts['cpus']} CPUs)",
        f"- command: `{facts['command_line']}`",
        "",
        "| context | prefill tok/s | decode tok/s | decode GB/s achieved | % of copy bandwidth "
        "| floor tok/s | digest |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['context']:,} | {fmt_num(r['prefill_tok_s'])} | {fmt_num(r['decode_tok_s'])} "
            f"| {r['achieved_gb_s']:.2f} | {100 * r['bandwidth_utilisation']:.1f}% "
            f"| {fmt_num(r['floor_tok_s'])} | `{r['digest']}` |")
    lines += ["", "Prefill tok/s = prompt tokens / time to the first token (with decode step 1 "
              "submitted); decode tok/s = decode steps / decode time; GB/s = the bytes a decode "
              "step must move (docs/bench.md) / decode time; floor = copy bandwidth / bytes per "
              "step at mid context.", ""]
    return "\n".join(lines)


def nice_ceiling(value: float) -> tuple[float, float]:
    """A round axis maximum >= value and its tick step (1, 2, 2.5 or 5 times a power of 10)."""
    if value <= 0:
        return 1.0, 0.25
    raw = value / 4
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        step = m * power
        if step * 4 >= value * 1.0001:
            break
    top = step * math.ceil(value * 1.0001 / step)
    return top, step


def tick_label(value: float) -> str:
    if value >= 10000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def render_svg(facts: dict, rows: list[dict], args: argparse.Namespace) -> str:
    banner = dirty_banner(facts)
    width = 920
    left, right = 90, 30
    top0 = 92 + (36 if banner else 0)  # title, subtitle, legend, then the dirty banner
    panel_h, gap = 205, 70
    height = top0 + 2 * panel_h + gap + 62
    plot_w = width - left - right
    contexts = [r["context"] for r in rows]
    lo, hi = math.log2(min(contexts)), math.log2(max(contexts))
    if hi - lo < 1e-9:
        lo, hi = lo - 1, hi + 1
    pad = 0.04 * (hi - lo)
    lo, hi = lo - pad, hi + pad

    def x_of(ctx: float) -> float:
        return left + (math.log2(ctx) - lo) / (hi - lo) * plot_w

    colors = {"prefill": "#1f77b4", "decode": "#d62728"}
    title = (f"lily bench on {facts['device']} ({facts['backend']}, {threads_text(facts)}), "
             f"commit {facts['commit'][:12]}")
    sub = (f"prefill and decode tok/s against context | {args.decode_steps} decode steps, "
           f"median of {args.rounds} rounds | profile {facts['profile']}")
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="15" '
        f'font-weight="bold">{escape(title)}</text>',
        f'<text x="{width / 2}" y="44" text-anchor="middle" font-size="12">{escape(sub)}</text>',
    ]
    # Legend: one row under the subtitle.
    ly = 66
    for i, (name, label) in enumerate((("prefill", "prefill tok/s (top panel)"),
                                       ("decode", "decode tok/s (bottom panel)"))):
        x = width / 2 - 220 + i * 230
        out.append(f'<g class="legend"><line x1="{x}" y1="{ly}" x2="{x + 24}" y2="{ly}" '
                   f'stroke="{colors[name]}" stroke-width="2.5"/>'
                   f'<circle cx="{x + 12}" cy="{ly}" r="3.5" fill="{colors[name]}"/>'
                   f'<text x="{x + 32}" y="{ly + 4}">{escape(label)}</text></g>')
    if banner:
        for i, line in enumerate(banner):
            out.append(f'<text x="{width / 2}" y="{88 + 16 * i}" text-anchor="middle" '
                       f'font-size="12" font-weight="bold" fill="#c00000">{escape(line)}</text>')
    for index, (name, ylabel) in enumerate((("prefill", "prefill tok/s"),
                                            ("decode", "decode tok/s"))):
        top = top0 + index * (panel_h + gap)
        bottom = top + panel_h
        values = [r[f"{name}_tok_s"] for r in rows]
        rounds_values = [v for r in rows for v in r[f"{name}_tok_s_rounds"]]
        ymax, step = nice_ceiling(max(values + rounds_values))

        def y_of(v: float) -> float:
            return bottom - v / ymax * panel_h

        out.append(f'<g class="panel" id="panel-{name}">')
        out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{panel_h}" '
                   'fill="none" stroke="#444"/>')
        tick = 0.0
        while tick <= ymax * 1.0001:
            y = y_of(tick)
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                       'stroke="#e4e4e4"/>')
            out.append(f'<line x1="{left - 5}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="#444"/>')
            out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">'
                       f"{tick_label(tick)}</text>")
            tick += step
        for ctx in contexts:
            x = x_of(ctx)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#f0f0f0"/>')
            out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 5}" '
                       'stroke="#444"/>')
            out.append(f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="middle">'
                       f"{short_context(ctx)}</text>")
        out.append(f'<text x="{left + plot_w / 2}" y="{bottom + 36}" text-anchor="middle">'
                   "context (prompt tokens, log2 scale)</text>")
        cy = top + panel_h / 2
        out.append(f'<text x="22" y="{cy}" text-anchor="middle" transform="rotate(-90 22 {cy})">'
                   f"{escape(ylabel)}</text>")
        points = " ".join(f"{x_of(r['context']):.1f},{y_of(r[f'{name}_tok_s']):.1f}" for r in rows)
        out.append(f'<polyline class="curve {name}" id="curve-{name}" fill="none" '
                   f'stroke="{colors[name]}" stroke-width="2.5" points="{points}"/>')
        for r in rows:
            x = x_of(r["context"])
            for v in r[f"{name}_tok_s_rounds"]:
                out.append(f'<circle cx="{x:.1f}" cy="{y_of(v):.1f}" r="2.5" fill="none" '
                           f'stroke="{colors[name]}"/>')
            out.append(f'<circle cx="{x:.1f}" cy="{y_of(r[f"{name}_tok_s"]):.1f}" r="3.5" '
                       f'fill="{colors[name]}"><title>context {r["context"]}: '
                       f'{r[f"{name}_tok_s"]:.1f} {name} tok/s</title></circle>')
        out.append("</g>")
    out.append(f'<text x="{left}" y="{height - 10}" font-size="10" fill="#666">filled: median '
               "of rounds; hollow: each round. Generated by tools/bench/run_matrix.py.</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv[1:])
    except SystemExit as e:  # argparse: usage errors exit 2 with the reason printed
        return int(e.code) if isinstance(e.code, int) else EXIT_REFUSED
    return Matrix(args, argv).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))

# Tests of tools/bench/run_matrix.py: refusals and outputs with a fake `lily bench`, and one real run on a tiny checkpoint.
"""Tests of the benchmark matrix runner (issue 6).

Group "fake": a temporary git repository (so the dirty-tree check has a tree to look at) and
a fake `lily bench` written by the test: a small Python script that writes a lily-bench/1
report whose meta.commit is that repository's HEAD, with tok/s, digest, exit status and
fields steered per (context, round) by a JSON file beside it (the runner strips LILY_*
variables from the child's environment, so the fake cannot be steered through them).

Group "real": the actual lily binary on a tiny checkpoint (contexts 16 and 32, 8 decode
steps, one thread) against the real checkout. On a clean checkout the run is a normal one;
on a dirty development tree it uses --allow-dirty and checks that the table says so.

    python3 tests/bench/test_run_matrix.py --lily build/lily [--group fake|real|all] [-v]

Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

sys.dont_write_bytecode = True  # leave no __pycache__ behind in the checkout

SOURCE_DIR = Path(__file__).resolve().parents[2]
RUNNER = SOURCE_DIR / "tools" / "bench" / "run_matrix.py"
SVG_NS = "{http://www.w3.org/2000/svg}"
LILY: Path | None = None  # set by main() from --lily

FAKE_BENCH = textwrap.dedent('''\
    #!/usr/bin/env python3
    # Fake `lily bench` for the matrix runner tests: behaviour from fake_config.json beside it.
    import json, os, sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    config = json.loads((here / "fake_config.json").read_text())
    argv = sys.argv[1:]
    assert argv[0] == "bench", argv
    opts = dict(zip(argv[1::2], argv[2::2]))
    ctx = int(opts["--prompt-len"])
    steps = int(opts["--decode-steps"])
    calls = here / "calls.jsonl"
    previous = [json.loads(l) for l in calls.read_text().splitlines()] if calls.exists() else []
    rnd = sum(1 for c in previous if c["context"] == ctx)
    with calls.open("a") as f:
        f.write(json.dumps({"context": ctx, "round": rnd, "argv": argv,
                            "lily_env": sorted(k for k in os.environ if k.startswith("LILY_"))})
                + "\\n")

    def pick(name, default):
        table = config.get(name, {})
        value = table.get(f"{ctx}:{rnd}", table.get(str(ctx), table.get("*", default)))
        return value

    if pick("git_during", None):  # change the checkout while the matrix runs
        import subprocess
        action = pick("git_during", None)
        repo = config["repo"]
        if action == "commit":
            subprocess.run(["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t",
                            "commit", "-q", "--allow-empty", "-m", "moved"], check=True)
        else:
            Path(repo, action).write_text("appeared during the run\\n")
    if pick("rewrite_self", False):  # the binary is rebuilt while the matrix runs
        with open(__file__, "a") as f:
            f.write("# rebuilt\\n")
    fail = pick("fail", None)
    if fail is not None:
        print("error: injected failure", file=sys.stderr)
        sys.exit(fail)
    ids = [(ctx * 31 + i * 7) % 1000 for i in range(steps)]
    if pick("change_tokens", False):
        ids[0] = (ids[0] + 1) % 1000
    if pick("short_tokens", False):
        ids = ids[:-1]
    h = 0xcbf29ce484222325
    for t in ids:
        h = ((h ^ t) * 0x100000001b3) & 0xffffffffffffffff
    prefill_tok_s = pick("prefill_tok_s", 1000.0)
    decode_tok_s = pick("decode_tok_s", 200.0)
    prefill_wall = ctx / prefill_tok_s
    decode_wall = steps / decode_tok_s
    copy = 20e9
    mid_total = 4_000_000 + 1000 * ctx
    report = {
        "schema_version": 1, "schema": "lily-bench/1",
        "meta": {"engine": "lily", "commit": config["commit"], "dirty": config.get("dirty", False),
                 "build_type": "RelWithDebInfo", "compiler": "Fake 1.0", "build_flags": "-O2",
                 "harness": "lily bench"},
        "device": {"backend": "cpu", "name": "Fake CPU <&>", "threads": int(opts.get("--threads", "2")) or 2},
        "workload": {"prompt_len": ctx, "prompt_kind": "u32_golden_ratio_hash_mod_vocab",
                     "decode_steps": steps, "decode_mode": "production_depth2_pipelined",
                     "model_dir": opts["--model"], "profile": "tiny", "checkpoint_bytes": 12345},
        "results": {
            "prefill": {"wall_secs": prefill_wall, "tok_s": ctx / prefill_wall,
                        "first_token_id": 5},
            "decode": {"wall_secs": decode_wall, "tok_s": steps / decode_wall,
                       "step_wall_secs": [decode_wall / steps] * steps,
                       "token_digest": f"{h:016x}", "token_ids": ids}},
        "bandwidth": {"bytes_per_step_at_mid_context": {"total": mid_total},
                      "decode_bytes_total": mid_total * steps,
                      "achieved_bytes_per_s": mid_total * steps / decode_wall,
                      "copy_bytes_per_s": copy,
                      "utilisation": mid_total * steps / decode_wall / copy,
                      "floor_tok_s": copy / mid_total},
        "compute": {"prefill_flops": 1e9, "prefill_flop_s": 1e9 / prefill_wall,
                    "matmul_flop_s": 1e11, "utilisation": 1e9 / prefill_wall / 1e11},
    }
    if pick("null_decode_tok_s", False):  # what nlohmann writes for a non-finite double
        report["results"]["decode"]["tok_s"] = None
    if not pick("no_report", False):
        Path(opts["--json-out"]).write_text(json.dumps(report, indent=2))
    print(f"prefill: {ctx} tok | decode: {steps} steps | digest={h:016x}", file=sys.stderr)
''')


def run_git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=matrix-test",
                           "-c", "user.email=matrix-test@example.invalid",
                           "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def fnv1a64(ids: list[int]) -> str:
    h = 0xCBF29CE484222325
    for t in ids:
        h = ((h ^ (t & 0xFFFFFFFF)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def run_runner(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", LILY_SHOULD_NOT_LEAK="1")
    return subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def parse_svg(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == SVG_NS + "svg", root.tag
    return root


class FakeBenchTests(unittest.TestCase):
    """The runner's rules, against a fake `lily bench` and a temporary clean repository."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="lily-matrix-test-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.repo = self.tmp / "repo"
        self.repo.mkdir()
        run_git(self.repo, "init", "-q")
        (self.repo / "source.txt").write_text("lily\n")
        (self.repo / ".gitignore").write_text("*.ignored\n/out/\n")
        run_git(self.repo, "add", "source.txt", ".gitignore")
        run_git(self.repo, "commit", "-q", "-m", "initial")
        # An ignored file must not make the tree dirty.
        (self.repo / "scratch.ignored").write_text("ignored\n")
        self.head = run_git(self.repo, "rev-parse", "HEAD")
        self.fake_dir = self.tmp / "fake"
        self.fake_dir.mkdir()
        self.fake = self.fake_dir / "lily"
        self.fake.write_text(FAKE_BENCH)
        self.fake.chmod(self.fake.stat().st_mode | stat.S_IXUSR)
        self.model = self.tmp / "model"
        self.model.mkdir()
        (self.model / "config.json").write_text("{}\n")
        self.out = self.tmp / "out"
        self.configure()

    def configure(self, **overrides):
        config = {"commit": self.head, "dirty": False, "repo": str(self.repo)}
        config.update(overrides)
        (self.fake_dir / "fake_config.json").write_text(json.dumps(config))

    def calls(self) -> list[dict]:
        path = self.fake_dir / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def matrix(self, *extra: str, contexts: str = "16,32,64") -> subprocess.CompletedProcess[str]:
        return run_runner("--lily", str(self.fake), "--model", str(self.model),
                          "--out", str(self.out), "--repo", str(self.repo),
                          "--contexts", contexts, "--decode-steps", "8", *extra, timeout=120)

    def summary(self) -> dict:
        return json.loads((self.out / "summary.json").read_text())

    def assert_refused(self, proc, *needles: str, code: int = 2) -> None:
        detail = f"\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        self.assertEqual(proc.returncode, code, detail)
        self.assertNotIn("MATRIX_COMPLETE", proc.stdout, detail)
        for needle in needles:
            self.assertIn(needle, proc.stderr, detail)
        self.assertFalse((self.out / "table.md").exists(), "a refused run wrote a table")
        self.assertFalse((self.out / "plot.svg").exists(), "a refused run wrote a plot")

    # -- success ---------------------------------------------------------------------------

    def test_success_writes_reports_summary_table_and_plot(self):
        self.configure(prefill_tok_s={"16:0": 1000.0, "16:1": 1010.0, "32:0": 900.0,
                                      "32:1": 890.0, "64": 800.0},
                       decode_tok_s={"16:0": 200.0, "16:1": 204.0, "*": 150.0})
        proc = self.matrix()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.strip().splitlines()[-1], f"MATRIX_COMPLETE {self.out}")
        # Schedule: round 0 ascending, round 1 descending, one fresh process per arm, and no
        # LILY_* variable reaches the child.
        calls = self.calls()
        self.assertEqual([(c["context"], c["round"]) for c in calls],
                         [(16, 0), (32, 0), (64, 0), (64, 1), (32, 1), (16, 1)])
        self.assertTrue(all(c["lily_env"] == [] for c in calls), calls)
        self.assertTrue(all(c["argv"][c["argv"].index("--decode-steps") + 1] == "8"
                            for c in calls))
        for ctx in (16, 32, 64):
            for rnd in (0, 1):
                stem = self.out / "reports" / f"ctx{ctx}_round{rnd}"
                self.assertTrue(stem.with_suffix(".json").is_file())
                self.assertTrue(Path(f"{stem}.stdout.log").is_file())
                self.assertIn("digest=", Path(f"{stem}.stderr.log").read_text())
        summary = self.summary()
        self.assertEqual(summary["status"], "ok")
        self.assertEqual(summary["commit"], self.head)
        self.assertFalse(summary["allow_dirty"])
        self.assertTrue(summary["tree_clean"])
        rows = {r["context"]: r for r in summary["contexts"]}
        self.assertEqual(sorted(rows), [16, 32, 64])
        self.assertAlmostEqual(rows[16]["prefill_tok_s"], 1005.0, places=6)
        self.assertAlmostEqual(rows[16]["decode_tok_s"], 202.0, places=6)
        self.assertAlmostEqual(rows[16]["decode_drift"], 1.02, places=9)
        self.assertAlmostEqual(rows[32]["prefill_tok_s"], 895.0, places=6)
        self.assertAlmostEqual(rows[64]["decode_tok_s"], 150.0, places=6)
        ids16 = [(16 * 31 + i * 7) % 1000 for i in range(8)]
        self.assertEqual(rows[16]["digest"], fnv1a64(ids16))
        self.assertAlmostEqual(rows[64]["floor_tok_s"], 20e9 / (4_000_000 + 64_000), places=3)
        mid = 4_000_000 + 1000 * 64
        self.assertAlmostEqual(rows[64]["achieved_gb_s"], mid * 150.0 / 1e9, places=6)
        self.assertAlmostEqual(rows[64]["bandwidth_utilisation"], mid * 150.0 / 20e9, places=9)
        self.assertAlmostEqual(rows[64]["compute_utilisation"], 1e9 / (64 / 800.0) / 1e11,
                               places=9)
        manifest = json.loads((self.out / "manifest.json").read_text())
        self.assertEqual(manifest["status"], "ok")
        self.assertEqual(len(manifest["arms"]), 6)
        self.assertTrue(all(a["status"] == "ok" and a["exit_status"] == 0
                            for a in manifest["arms"]))
        self.assertFalse(list(self.out.glob("*.tmp")), "temporary files left behind")

        table = (self.out / "table.md").read_text()
        self.assertNotIn("DIRTY", table)
        for needle in ("Fake CPU <&>", "backend cpu", "2 threads", self.head, "command: `",
                       "--contexts 16,32,64", "- date: "):
            self.assertIn(needle, table)
        header = ("| context | prefill tok/s | decode tok/s | decode GB/s achieved | "
                  "% of copy bandwidth | floor tok/s | digest |")
        self.assertIn(header, table)
        data = [line for line in table.splitlines() if line.startswith("| ") and
                line[2].isdigit()]
        self.assertEqual(len(data), 3, table)
        self.assertTrue(data[0].startswith("| 16 | 1,005.0 | 202.0 |"), data[0])
        self.assertIn(f"`{fnv1a64(ids16)}`", data[0])

        root = parse_svg(self.out / "plot.svg")
        curves = [e for e in root.iter() if e.tag in (SVG_NS + "polyline", SVG_NS + "path")]
        self.assertEqual(len(curves), 2)
        self.assertEqual({c.get("id") for c in curves}, {"curve-prefill", "curve-decode"})
        for curve in curves:
            self.assertEqual(len(curve.get("points").split()), 3)
        text = " ".join("".join(e.itertext()) for e in root.iter(SVG_NS + "text"))
        for needle in ("prefill tok/s", "decode tok/s", "context", "Fake CPU <&>",
                       self.head[:12], "16", "32", "64"):
            self.assertIn(needle, text)
        title = root.find(SVG_NS + "title")
        self.assertIn("Fake CPU", title.text)
        self.assertIn(self.head[:12], title.text)
        # x grows with log2(context): 16 -> 32 -> 64 are equally spaced.
        xs = [float(p.split(",")[0]) for p in curves[0].get("points").split()]
        self.assertAlmostEqual(xs[1] - xs[0], xs[2] - xs[1], delta=0.2)
        self.assertLess(xs[0], xs[1])

    def test_three_rounds_alternate_direction(self):
        proc = self.matrix("--rounds", "3", contexts="64,16,32")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual([c["context"] for c in self.calls()],
                         [16, 32, 64, 64, 32, 16, 16, 32, 64])
        self.assertEqual(self.summary()["status"], "ok")

    def test_drift_within_limit_is_accepted(self):
        self.configure(decode_tok_s={"32:0": 100.0, "32:1": 102.9})
        proc = self.matrix()
        self.assertEqual(proc.returncode, 0, proc.stderr)

    # -- dirty tree and provenance ---------------------------------------------------------

    def test_untracked_file_is_a_dirty_tree(self):
        (self.repo / "new_file.cpp").write_text("int x;\n")
        proc = self.matrix()
        self.assert_refused(proc, "dirty", "new_file.cpp")
        self.assertEqual(self.calls(), [], "arms ran on a dirty tree")
        summary = self.summary()
        self.assertEqual(summary["status"], "refused")
        self.assertIn("dirty", summary["reason"])

    def test_modified_file_is_a_dirty_tree(self):
        (self.repo / "source.txt").write_text("changed\n")
        proc = self.matrix()
        self.assert_refused(proc, "dirty", "source.txt")
        self.assertEqual(self.calls(), [])
        self.assertEqual(self.summary()["status"], "refused")

    def test_staged_file_is_a_dirty_tree(self):
        (self.repo / "staged.txt").write_text("x\n")
        run_git(self.repo, "add", "staged.txt")
        self.assert_refused(self.matrix(), "dirty", "staged.txt")

    def test_head_moving_during_the_run_is_refused(self):
        self.configure(git_during={"32:1": "commit"})
        proc = self.matrix()
        self.assert_refused(proc, "HEAD", "moved during the run", self.head)
        self.assertEqual(len(self.calls()), 6)
        self.assertEqual(self.summary()["status"], "refused")

    def test_tree_changing_during_the_run_is_refused(self):
        self.configure(git_during={"64:0": "late_file.txt"})
        proc = self.matrix()
        self.assert_refused(proc, "changed during the run", "dirty", "late_file.txt")

    def test_binary_changing_during_the_run_is_refused(self):
        self.configure(rewrite_self={"16:0": True})
        proc = self.matrix()
        self.assert_refused(proc, "changed during the run", "SHA-256")

    def test_allow_dirty_runs_and_says_so_loudly(self):
        (self.repo / "new_file.cpp").write_text("int x;\n")
        self.configure(dirty=True)
        proc = self.matrix("--allow-dirty", contexts="16,32")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        summary = self.summary()
        self.assertEqual(summary["status"], "ok")
        self.assertTrue(summary["allow_dirty"])
        self.assertFalse(summary["tree_clean"])
        manifest = json.loads((self.out / "manifest.json").read_text())
        self.assertTrue(manifest["source"]["allow_dirty"])
        self.assertIn("?? new_file.cpp", manifest["source"]["changes"])
        table = (self.out / "table.md").read_text()
        self.assertIn("DIRTY TREE ALLOWED", table)
        self.assertIn("NOT reproducible", table)
        self.assertLess(table.index("DIRTY TREE ALLOWED"), table.index("| context |"))
        root = parse_svg(self.out / "plot.svg")
        self.assertIn("DIRTY TREE ALLOWED", "".join(root.itertext()))

    def test_report_built_dirty_is_refused(self):
        self.configure(dirty=True)
        proc = self.matrix()
        self.assert_refused(proc, "meta.dirty is true")
        self.assertEqual(len(self.calls()), 1, "the runner should stop at the first bad arm")
        self.assertEqual(self.summary()["status"], "refused")

    def test_report_from_another_commit_is_refused(self):
        self.configure(commit="0123456789abcdef0123456789abcdef01234567")
        proc = self.matrix()
        self.assert_refused(proc, "0123456789abcdef0123456789abcdef01234567", self.head,
                            "not HEAD")
        self.assertEqual(self.summary()["status"], "refused")

    def test_commit_check_stays_with_allow_dirty(self):
        self.configure(commit="0123456789abcdef0123456789abcdef01234567")
        self.assert_refused(self.matrix("--allow-dirty"), "not HEAD")

    # -- digest and drift ------------------------------------------------------------------

    def test_digest_change_between_rounds_is_refused(self):
        self.configure(change_tokens={"32:1": True})
        proc = self.matrix()
        ids = [(32 * 31 + i * 7) % 1000 for i in range(8)]
        changed = list(ids)
        changed[0] += 1
        self.assert_refused(proc, "context 32", "digest", fnv1a64(ids), fnv1a64(changed))
        refusals = [line for line in proc.stderr.splitlines() if "REFUSED" in line]
        self.assertEqual(len(refusals), 1, proc.stderr)
        self.assertIn("context 32", refusals[0])
        summary = self.summary()
        self.assertEqual(summary["status"], "refused")
        self.assertIn("context 32", summary["reason"])
        self.assertEqual(summary["exit_status"], 2)

    def test_decode_drift_over_limit_is_refused(self):
        self.configure(decode_tok_s={"64:0": 100.0, "64:1": 110.0})
        proc = self.matrix()
        self.assert_refused(proc, "context 64", "decode", "+10.00%", "100", "110", "limit 3%")
        self.assertNotIn("prefill tok/s drifted", proc.stderr)
        self.assertEqual(self.summary()["status"], "refused")

    def test_prefill_drift_over_limit_is_refused(self):
        self.configure(prefill_tok_s={"16:0": 1000.0, "16:1": 960.0})
        proc = self.matrix()
        self.assert_refused(proc, "context 16", "prefill", "-4.00%")

    def test_non_finite_tok_s_is_refused(self):
        self.configure(null_decode_tok_s={"32:1": True})
        proc = self.matrix()
        self.assert_refused(proc, "context 32", "decode tok/s in round 1 is None",
                            "expected finite and > 0")

    def test_drift_limit_is_configurable(self):
        self.configure(decode_tok_s={"64:0": 100.0, "64:1": 110.0})
        self.assertEqual(self.matrix("--drift-limit", "0.15").returncode, 0)

    # -- arm failures and bad reports ------------------------------------------------------

    def test_arm_failure_exits_1(self):
        self.configure(fail={"32:0": 3})
        proc = self.matrix()
        self.assert_refused(proc, "context 32", "status 3", "injected failure", code=1)
        self.assertEqual([c["context"] for c in self.calls()], [16, 32])
        summary = self.summary()
        self.assertEqual(summary["status"], "failed")
        self.assertEqual(summary["exit_status"], 1)

    def test_malformed_report_exits_1(self):
        self.configure(short_tokens={"16:1": True})
        proc = self.matrix()
        self.assert_refused(proc, "context 16", "token_ids", code=1)
        self.assertEqual(self.summary()["status"], "failed")

    def test_exit_0_without_report_exits_1(self):
        self.configure(no_report={"64:0": True})
        proc = self.matrix()
        self.assert_refused(proc, "context 64", "missing or not strict JSON", code=1)
        self.assertEqual(self.summary()["status"], "failed")

    def test_missing_binary_is_refused(self):
        proc = run_runner("--lily", str(self.tmp / "missing"), "--model", str(self.model),
                          "--out", str(self.out), "--repo", str(self.repo))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("not an executable file", proc.stderr)

    # -- arguments and output directory ----------------------------------------------------

    def test_output_directory_must_be_empty(self):
        self.out.mkdir()
        (self.out / "old.txt").write_text("previous run\n")
        proc = self.matrix()
        self.assert_refused(proc, "not empty")
        self.assertEqual(sorted(p.name for p in self.out.iterdir()), ["old.txt"])
        self.assertEqual(self.calls(), [])

    def test_output_inside_the_checkout_must_be_ignored(self):
        self.out = self.repo / "results"
        self.assert_refused(self.matrix(), "inside the checkout")
        self.assertFalse(self.out.exists())
        self.out = self.repo / "out"  # ignored by /out/
        self.assertEqual(self.matrix().returncode, 0)

    def test_one_round_is_refused(self):
        self.assert_refused(self.matrix("--rounds", "1"), "--rounds is 1")
        self.assertEqual(self.calls(), [])

    def test_bad_contexts_are_refused(self):
        self.assert_refused(self.matrix(contexts="16,abc"), "'abc'")
        self.assert_refused(self.matrix(contexts="16,16"), "twice")
        self.assert_refused(self.matrix(contexts="262144"), "state limit")
        self.assertEqual(self.calls(), [])

    def test_not_a_git_checkout_is_refused(self):
        plain = self.tmp / "plain"
        plain.mkdir()
        proc = run_runner("--lily", str(self.fake), "--model", str(self.model),
                          "--out", str(self.out), "--repo", str(plain), "--contexts", "16")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("not inside a git checkout", proc.stderr)


class RealLilyTest(unittest.TestCase):
    """The actual `lily bench` binary on a tiny checkpoint: same digest in both rounds."""

    def test_real_matrix_on_tiny_checkpoint(self):
        if LILY is None:
            self.skipTest("SKIPPED: no --lily binary given")
        tmp = Path(tempfile.mkdtemp(prefix="lily-matrix-real-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        model = tmp / "tiny"
        subprocess.run([str(LILY), "make-checkpoint", "--profile", "tiny", "--seed", "1",
                        "--out", str(model)], check=True, capture_output=True, timeout=300)
        changes = subprocess.run(["git", "-C", str(SOURCE_DIR), "status", "--porcelain"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        head = subprocess.run(["git", "-C", str(SOURCE_DIR), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        allow_dirty = bool(changes)
        out = tmp / "matrix"
        # Timing on a shared machine with 8 decode steps is noise; drift refusals are covered
        # by the fake tests, so the limit is opened wide here.
        args = ["--lily", str(LILY), "--model", str(model), "--out", str(out),
                "--repo", str(SOURCE_DIR), "--contexts", "16,32", "--decode-steps", "8",
                "--threads", "1", "--copy-probe-mib", "256", "--drift-limit", "1000"]
        if allow_dirty:
            args.append("--allow-dirty")
        proc = run_runner(*args, timeout=600)
        self.assertEqual(proc.returncode, 0,
                         f"\nallow_dirty={allow_dirty}\nstdout:\n{proc.stdout}\n"
                         f"stderr:\n{proc.stderr}")
        self.assertEqual(proc.stdout.strip().splitlines()[-1], f"MATRIX_COMPLETE {out}")
        summary = json.loads((out / "summary.json").read_text())
        self.assertEqual(summary["status"], "ok")
        self.assertEqual(summary["commit"], head)
        self.assertEqual(summary["allow_dirty"], allow_dirty)
        for ctx in (16, 32):
            reports = [json.loads((out / "reports" / f"ctx{ctx}_round{r}.json").read_text())
                       for r in (0, 1)]
            for rep in reports:
                self.check_report(rep, ctx, head, allow_dirty)
            decode = [r["results"]["decode"] for r in reports]
            self.assertEqual(decode[0]["token_digest"], decode[1]["token_digest"])
            self.assertEqual(decode[0]["token_ids"], decode[1]["token_ids"])
            self.assertEqual(reports[0]["results"]["prefill"]["first_token_id"],
                             reports[1]["results"]["prefill"]["first_token_id"])
            row = next(r for r in summary["contexts"] if r["context"] == ctx)
            self.assertEqual(row["digest"], decode[0]["token_digest"])
        # Different prompts give different decode tokens (the digest says something).
        rows = {r["context"]: r["digest"] for r in summary["contexts"]}
        self.assertNotEqual(rows[16], rows[32])
        table = (out / "table.md").read_text()
        self.assertEqual("DIRTY TREE ALLOWED" in table, allow_dirty, table)
        self.assertIn(head, table)
        root = parse_svg(out / "plot.svg")
        self.assertEqual(len([e for e in root.iter(SVG_NS + "polyline")]), 2)

    def check_report(self, rep: dict, ctx: int, head: str, allow_dirty: bool) -> None:
        self.assertEqual(rep["schema"], "lily-bench/1")
        self.assertEqual(rep["schema_version"], 1)
        meta = rep["meta"]
        self.assertEqual(meta["engine"], "lily")
        self.assertEqual(meta["commit"], head)
        if not allow_dirty:
            self.assertFalse(meta["dirty"])
        for key in ("build_type", "compiler", "build_flags", "harness"):
            self.assertIsInstance(meta[key], str)
        self.assertEqual(rep["device"]["backend"], "cpu")
        self.assertEqual(rep["device"]["threads"], 1)
        self.assertTrue(rep["device"]["name"])
        wl = rep["workload"]
        self.assertEqual((wl["prompt_len"], wl["decode_steps"]), (ctx, 8))
        self.assertEqual(wl["prompt_kind"], "u32_golden_ratio_hash_mod_vocab")
        self.assertEqual(wl["decode_mode"], "production_depth2_pipelined")
        self.assertEqual(wl["profile"], "tiny")
        self.assertGreater(wl["checkpoint_bytes"], 0)
        pre, dec = rep["results"]["prefill"], rep["results"]["decode"]
        self.assertAlmostEqual(pre["tok_s"], ctx / pre["wall_secs"], delta=1e-6 * pre["tok_s"])
        self.assertAlmostEqual(dec["tok_s"], 8 / dec["wall_secs"], delta=1e-6 * dec["tok_s"])
        self.assertEqual(len(dec["step_wall_secs"]), 8)
        self.assertEqual(len(dec["token_ids"]), 8)
        self.assertEqual(dec["token_digest"], fnv1a64(dec["token_ids"]))
        bw = rep["bandwidth"]
        parts = bw["bytes_per_step_at_mid_context"]
        self.assertEqual(parts["total"], sum(v for k, v in parts.items() if k != "total"))
        self.assertGreater(bw["copy_bytes_per_s"], 0)
        self.assertAlmostEqual(bw["achieved_bytes_per_s"],
                               bw["decode_bytes_total"] / dec["wall_secs"],
                               delta=1e-9 * bw["achieved_bytes_per_s"])
        self.assertAlmostEqual(bw["utilisation"], bw["achieved_bytes_per_s"] / bw["copy_bytes_per_s"],
                               delta=1e-12)
        self.assertAlmostEqual(bw["floor_tok_s"], bw["copy_bytes_per_s"] / parts["total"],
                               delta=1e-9 * bw["floor_tok_s"])
        comp = rep["compute"]
        self.assertGreater(comp["prefill_flops"], 0)
        self.assertAlmostEqual(comp["prefill_flop_s"], comp["prefill_flops"] / pre["wall_secs"],
                               delta=1e-9 * comp["prefill_flop_s"])
        self.assertGreater(comp["matmul_flop_s"], 0)


def main() -> None:
    global LILY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lily", help="the lily binary (needed by the real group)")
    parser.add_argument("--group", choices=("fake", "real", "all"), default="all")
    args, rest = parser.parse_known_args()
    if args.lily:
        LILY = Path(args.lily).resolve()
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    if args.group in ("fake", "all"):
        suite.addTests(loader.loadTestsFromTestCase(FakeBenchTests))
    if args.group in ("real", "all"):
        suite.addTests(loader.loadTestsFromTestCase(RealLilyTest))
    verbosity = 2 if "-v" in rest else 1
    result = unittest.TextTestRunner(verbosity=verbosity).run(suite)
    for test, reason in result.skipped:
        print(f"SKIPPED {test.id()}: {reason}", file=sys.stderr)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()

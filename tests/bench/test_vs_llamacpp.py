# Tests of tools/bench/vs_llamacpp.py against a fake `lily bench` and a fake `llama-bench`: commands, alternation, ratios, refusals.
"""Tests of the side-by-side CPU benchmark (issue 19).

Both engines are fakes written by the test (small Python scripts): the fake `lily bench`
writes a lily-bench/1-shaped report, the fake `llama-bench` prints a JSON array of tests as
`llama-bench -o json` does (fields n_prompt, n_gen, n_depth, n_threads, avg_ts,
build_commit; tools/llama-bench/llama-bench.cpp at llama.cpp 82bb485). Their speeds are
fixed per context, so the expected medians and ratios are known in advance; both append
their argv to calls.jsonl, so the order of the runs and the flags are checked too.

    python3 tests/bench/test_vs_llamacpp.py [-v]

Python 3.11 standard library only.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

sys.dont_write_bytecode = True

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "bench" / "vs_llamacpp.py"

FAKE_LILY = textwrap.dedent('''\
    #!/usr/bin/env python3
    import json, sys
    from pathlib import Path
    here = Path(__file__).resolve().parent
    argv = sys.argv[1:]
    opts = dict(zip(argv[1::2], argv[2::2]))
    with (here / "calls.jsonl").open("a") as f:
        f.write(json.dumps({"engine": "lily", "argv": argv}) + "\\n")
    mode = (here / "lily_mode").read_text().strip() if (here / "lily_mode").exists() else "ok"
    if mode == "fail":
        print("error: something broke", file=sys.stderr)
        sys.exit(3)
    ctx = int(opts["--prompt-len"])
    report = {"schema": "lily-bench/1", "meta": {"commit": "abc123", "dirty": False},
              "results": {"prefill": {"tok_s": 1000.0 / ctx}, "decode": {"tok_s": 3.0, "token_digest": "d"}},
              "bandwidth": {"bytes_per_step_at_mid_context": {"total": 1.0e9}, "copy_bytes_per_s": 20.0e9}}
    Path(opts["--json-out"]).write_text(json.dumps(report))
''')

FAKE_LLAMA = textwrap.dedent('''\
    #!/usr/bin/env python3
    import json, sys
    from pathlib import Path
    here = Path(__file__).resolve().parent
    argv = sys.argv[1:]
    opts = dict(zip(argv[0::2], argv[1::2]))
    with (here / "calls.jsonl").open("a") as f:
        f.write(json.dumps({"engine": "llama", "argv": argv}) + "\\n")
    mode = (here / "llama_mode").read_text().strip() if (here / "llama_mode").exists() else "ok"
    if mode == "garbage":
        print("not json")
        sys.exit(0)
    p, n, d, t = int(opts["-p"]), int(opts["-n"]), int(opts["-d"]), int(opts["-t"])
    if mode == "threads":
        t += 1
    ts = 4000.0 / p if p > 0 else 2.0
    print(json.dumps([{"build_commit": "82bb485", "n_threads": t, "n_prompt": p, "n_gen": n,
                       "n_depth": d, "avg_ts": ts, "stddev_ts": 0.0}]))
''')


def write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


class VsLlamaCpp(unittest.TestCase):
    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self._tmp.name)
        self.fakes = self.dir / "fakes"
        self.fakes.mkdir()
        write_exe(self.fakes / "lily", FAKE_LILY)
        write_exe(self.fakes / "llama-bench", FAKE_LLAMA)
        self.model = self.dir / "model"
        self.model.mkdir()
        (self.model / "config.json").write_text("{}")
        (self.model / "model.safetensors").write_bytes(b"\0" * 1024)
        self.gguf = self.dir / "synth.gguf"
        self.gguf.write_bytes(b"\0" * 1024)

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def run_script(self, *extra: str, out: str = "out") -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(SCRIPT), "--lily", str(self.fakes / "lily"), "--model",
               str(self.model), "--llama-bench", str(self.fakes / "llama-bench"), "--gguf",
               str(self.gguf), "--out", str(self.dir / out), *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})

    def calls(self) -> list[dict]:
        path = self.fakes / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def test_two_rounds_alternate_and_give_the_ratios(self) -> None:
        r = self.run_script("--threads", "3", "--contexts", "16,32", "--rounds", "2",
                            "--decode-steps", "5", "--kv-cache", "bf16", "--cpu-precision", "q8")
        self.assertEqual(r.returncode, 0, r.stderr)
        calls = self.calls()
        # Per (round, context): lily once, llama-bench twice (prefill, decode).
        self.assertEqual(len(calls), 2 * 2 * 3)
        engines = [c["engine"] for c in calls]
        self.assertEqual(engines[:6], ["lily", "llama", "llama", "lily", "llama", "llama"])
        self.assertEqual(engines[6:], ["llama", "llama", "lily", "llama", "llama", "lily"])
        for c in calls:
            argv = c["argv"]
            if c["engine"] == "lily":
                opts = dict(zip(argv[1::2], argv[2::2]))
                self.assertEqual((argv[0], opts["--threads"], opts["--device"], opts["--decode-steps"],
                                  opts["--kv-cache"], opts["--cpu-precision"]),
                                 ("bench", "3", "cpu", "5", "bf16", "q8"))
            else:
                opts = dict(zip(argv[0::2], argv[1::2]))
                self.assertEqual((opts["-t"], opts["-o"], opts["-m"]), ("3", "json", str(self.gguf)))
                self.assertTrue((opts["-n"], opts["-d"]) == ("0", "0") or
                                (opts["-p"], opts["-n"]) == ("0", "5"), argv)
        results = json.loads((self.dir / "out" / "results.json").read_text())
        rows = {row["context"]: row for row in results["rows"]}
        # lily prefill 1000 / C, llama 4000 / C: ratio 0.25; decode 3.0 against 2.0: 1.5.
        for ctx in (16, 32):
            self.assertAlmostEqual(rows[ctx]["prefill_ratio"], 0.25)
            self.assertAlmostEqual(rows[ctx]["decode_ratio"], 1.5)
            self.assertAlmostEqual(rows[ctx]["lily_bandwidth_used"], 3.0 * 1e9 / 20e9)
            self.assertAlmostEqual(rows[ctx]["llama_bandwidth_used"], 2.0 * 1e9 / 20e9)
        table = (self.dir / "out" / "table.md").read_text()
        self.assertIn("| 16 | 62.50 | 250.00 | **0.25** | 3.00 | 2.00 | **1.50** | 15% / 10% |", table)
        self.assertIn("llama.cpp 82bb485", table)
        self.assertIn("KV cache: lily bf16, llama.cpp f16", table)
        self.assertIn("lily abc123", table)
        # The llama decode runs at depth C with -p 0.
        decode_depths = sorted({dict(zip(c["argv"][0::2], c["argv"][1::2]))["-d"] for c in calls
                                if c["engine"] == "llama" and "-n" in c["argv"]
                                and dict(zip(c["argv"][0::2], c["argv"][1::2]))["-p"] == "0"})
        self.assertEqual(decode_depths, ["16", "32"])

    def test_a_failed_engine_stops_the_run_and_names_the_command(self) -> None:
        (self.fakes / "lily_mode").write_text("fail")
        r = self.run_script("--contexts", "16", "--rounds", "1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("exited 3", r.stderr)
        self.assertIn("error: something broke", r.stderr)
        self.assertIn("error", json.loads((self.dir / "out" / "results.json").read_text()))

    def test_unreadable_or_mismatched_llama_output_is_refused(self) -> None:
        (self.fakes / "llama_mode").write_text("garbage")
        r = self.run_script("--contexts", "16", "--rounds", "1", out="a")
        self.assertEqual(r.returncode, 1)
        self.assertIn("stdout is not JSON", r.stderr)
        (self.fakes / "llama_mode").write_text("threads")
        r = self.run_script("--contexts", "16", "--rounds", "1", "--threads", "2", out="b")
        self.assertEqual(r.returncode, 1)
        self.assertIn("ran 3 threads, asked 2", r.stderr)

    def test_bad_arguments_are_refused_before_anything_runs(self) -> None:
        for extra, message in ((["--contexts", "abc"], "expected comma-separated positive integers"),
                               (["--contexts", "0"], "expected comma-separated positive integers"),
                               (["--rounds", "0"], "must be at least 1")):
            r = self.run_script(*extra)
            self.assertEqual(r.returncode, 2, extra)
            self.assertIn(message, r.stderr)
        (self.dir / "full").mkdir()
        (self.dir / "full" / "x").write_text("x")
        r = self.run_script(out="full")
        self.assertEqual(r.returncode, 2)
        self.assertIn("exists and is not empty", r.stderr)
        (self.model / "config.json").unlink()
        r = self.run_script(out="c")
        self.assertEqual(r.returncode, 2)
        self.assertIn("no config.json", r.stderr)
        self.assertEqual(self.calls(), [])


if __name__ == "__main__":
    unittest.main()

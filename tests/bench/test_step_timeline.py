#!/usr/bin/env python3
"""tools/gpu/step_timeline.py against traces written here with known timings: the step span,
each kernel's advance and gap, the summary by kernel name, demangled names shortened, and the
refusals (no graph kernels, too few replays)."""

import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "tools", "gpu", "step_timeline.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import step_timeline  # noqa: E402

# One step of the fake decode graph, in ns from the step's start: (node, start, end, name).
# Node 2 starts 100 ns before node 1 ends (programmatic dependent launch), node 3 300 ns
# after node 2 ends (a launch gap).
STEP = [
    (11, 0, 1000, "void lily::cuda::(anonymous namespace)::embed_kernel<4>(float const*, int)"),
    (12, 900, 3000, "void lily::cuda::gemv_kernel<8, 4>(lily::cuda::QuantMatrix, float const*, \"x\")"),
    (13, 3300, 4000, "void lily::cuda::gemv_kernel<8, 4>(lily::cuda::QuantMatrix, float const*, \"x\")"),
]
PERIOD = 5000  # a new step every 5 us: 1 us between one step's last end and the next's first start


def write_trace(path, replays, extra_rows=()):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["start_ns", "end_ns", "graph_id", "graph_node", "stream", "grid", "block", "name"])
        # A kernel outside the graph (the prefill), which the tool must ignore.
        w.writerow([10, 500000, 0, 0, 7, "64x1x1", "128x1x1", "void lily::cuda::prefill_kernel<256, float>()"])
        base = 1_000_000
        for i in range(replays):
            # The graph's nodes in an order other than their launch order.
            for node, start, end, name in reversed(STEP):
                w.writerow([base + i * PERIOD + start, base + i * PERIOD + end, 3, node, 7, "1x1x1", "32x1x1", name])
        for row in extra_rows:
            w.writerow(row)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


class StepTimeline(unittest.TestCase):
    def test_advances_gaps_and_span(self):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "t.csv")
            tsv = os.path.join(d, "k.tsv")
            write_trace(trace, 10)
            r = run(trace, "--skip", "2", "--per-kernel", tsv)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("10 replays of 3 kernels; 8 used", r.stdout)
            self.assertIn("median 5.0 us (200000.0 steps/s)", r.stdout)
            with open(tsv) as f:
                rows = list(csv.DictReader(f, delimiter="\t"))
            self.assertEqual([row["kernel"] for row in rows],
                             ["embed_kernel<4>", "gemv_kernel<8, 4>", "gemv_kernel<8, 4>"])
            # Advances from the previous step's last end (at 4000 - 5000 = -1000 ns).
            self.assertEqual([float(row["advance_us"]) for row in rows], [2.0, 2.0, 1.0])
            self.assertEqual([float(row["gap_us"]) for row in rows], [1.0, -0.1, 0.3])
            self.assertEqual([float(row["duration_us"]) for row in rows], [1.0, 2.1, 0.7])
            # The summary adds the two GEMV positions: 3.0 us of the 5.0, 60%.
            line = next(l for l in r.stdout.splitlines() if l.startswith("gemv_kernel<8, 4>"))
            self.assertEqual(line.split()[2:5], ["2", "3.0", "60.0%"])

    def test_short_names(self):
        self.assertEqual(step_timeline.short_name(
            "void lily::cuda::(anonymous namespace)::decode_tc_int8_kernel<2, 1>(float const*, int)"),
            "decode_tc_int8_kernel<2, 1>")
        self.assertEqual(step_timeline.short_name("void lily::cuda::moe_layer_kernel<8, 4>(lily::cuda::MoeLayerParams)"),
                         "moe_layer_kernel<8, 4>")
        self.assertEqual(step_timeline.short_name("plain_kernel"), "plain_kernel")

    def test_refusals(self):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "t.csv")
            write_trace(trace, 0)
            r = run(trace)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no kernel was launched from a graph", r.stderr)
            write_trace(trace, 3)
            r = run(trace, "--skip", "4")
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("only 3 replays of graph 3", r.stderr)
            empty = os.path.join(d, "empty.csv")
            with open(empty, "w") as f:
                f.write("start_ns,end_ns,graph_id,graph_node,stream,grid,block,name\n")
            r = run(empty)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no kernels recorded", r.stderr)


if __name__ == "__main__":
    unittest.main()

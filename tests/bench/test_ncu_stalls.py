#!/usr/bin/env python3
"""tools/gpu/ncu_stalls.py against source pages written here with known samples: the stall
reasons' shares, the executed footprint, the per-span table with its phase marks, and the
refusals (not a source page, columns missing, no samples)."""

import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "tools", "gpu", "ncu_stalls.py")

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
          "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed",
          "stall_barrier", "stall_long_sb", "stall_no_inst", "stall_no_inst (Not Issued)"]


def row(address, source, executed, barrier=0, long_sb=0, no_inst=0):
    total = barrier + long_sb + no_inst
    # The "(Not Issued)" column must not be counted as a reason of its own.
    return [hex(address), source, total, total, executed, barrier, long_sb, no_inst, 999]


def write_page(path, rows, header=HEADER, title=True):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if title:
            w.writerow(["Kernel Name", "void lily::cuda::moe_layer_kernel<(int)8, (int)4>(p)"])
        w.writerow(header)
        w.writerows(rows)


def run(path, *args):
    return subprocess.run([sys.executable, SCRIPT, path, *args], capture_output=True, text=True)


class NcuStallsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "page.csv")

    def tearDown(self):
        self.dir.cleanup()

    def test_shares_footprint_and_spans(self):
        # Span 0 (instructions 0-3): a stamp, 6 samples (4 no_inst); span 1 (4-7): a grid
        # atomic, 4 samples (all barrier); instruction 6 never ran; span 2 (8-9) never ran.
        rows = [row(0, "CS2R R4, SR_GLOBALTIMERLO", 32, no_inst=4),
                row(16, "FFMA R1, R2, R3, R4", 32, long_sb=2),
                row(32, "FADD R1, R2, R3", 32),
                row(48, "BRA 0x40", 32),
                row(64, "ATOMG.E.ADD.64.STRONG.GPU PT, R4, desc[UR16]", 1, barrier=3),
                row(80, "BAR.SYNC.DEFER_BLOCKING 0x0", 32, barrier=1),
                row(96, "EXIT", 0),
                row(112, "NOP", 32),
                row(128, "FFMA R1, R2, R3, R4", 0),
                row(144, "FFMA R1, R2, R3, R4", 0)]
        write_page(self.path, rows)
        r = run(self.path, "--span", "4")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn("moe_layer_kernel", out.splitlines()[0])
        self.assertIn("SASS instructions 10, executed at least once 7 (0 KB of code), warp stall "
                      "samples 10", out)
        # 4 + 2 + 3 + 1 = 10 samples: no_inst 40%, barrier 40%, long_sb 20%; no "(Not Issued)".
        self.assertRegex(out, r"stall_no_inst\s+40\.0%")
        self.assertRegex(out, r"stall_barrier\s+40\.0%")
        self.assertRegex(out, r"stall_long_sb\s+20\.0%")
        self.assertNotIn("Not Issued", out)
        self.assertRegex(out, r"\[\s*0,\s*4\) executed\s+4\s+samples\s+6 \(60\.0%\)\s+no_inst\s+4\s+stamp")
        self.assertRegex(out, r"\[\s*4,\s*8\) executed\s+3\s+samples\s+4 \(40\.0%\)\s+no_inst\s+0\s+grid-arrive")
        self.assertNotRegex(out, r"\[\s*8,")  # a span that never ran is left out

    def test_refuses_a_file_that_is_not_a_source_page(self):
        with open(self.path, "w") as f:
            f.write("==PROF== Connected to process 1\n")
        r = run(self.path)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no header row with 'Address' and 'Source'", r.stderr)

    def test_refuses_a_page_without_the_stall_columns(self):
        write_page(self.path, [["0x0", "NOP"]], header=["Address", "Source"])
        r = run(self.path)
        self.assertEqual(r.returncode, 2)
        self.assertIn("missing columns", r.stderr)
        self.assertIn("--section SourceCounters", r.stderr)

    def test_refuses_a_page_without_samples(self):
        write_page(self.path, [row(0, "NOP", 32)])
        r = run(self.path)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no warp stall samples", r.stderr)


if __name__ == "__main__":
    unittest.main()

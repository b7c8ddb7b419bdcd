#!/usr/bin/env python3
"""Per-kernel time of the last decode step in an ncu CSV (run.sh stage `profile`).

Usage: ncu_step.py ncu-decode.csv[.gz]
The step is the kernels from the last embedding gather to the end. Prints, per
kernel name and grid, the launches, the mean and total microseconds, largest total first.
"""
import collections
import csv
import gzip
import re
import sys


def main(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = [r for r in csv.DictReader(lines) if r["Metric Name"] == "gpu__time_duration.sum"]
    embeds = [i for i, r in enumerate(rows) if "embed_kernel" in r["Kernel Name"]]
    if len(embeds) < 2:
        sys.exit("no decode step in this profile (fewer than two embedding gathers)")
    step = rows[embeds[-1]:]
    groups = collections.defaultdict(list)
    for r in step:
        name = re.sub(r"\(.*", "", r["Kernel Name"]).replace("cuda::<unnamed>::", "")
        name = re.sub(r"^void ", "", name)
        groups[(name[:70], r["Grid Size"])].append(float(r["Metric Value"].replace(",", "")) / 1000)
    total = sum(sum(v) for v in groups.values())
    print(f"{len(step)} kernels, {total:.1f} us of kernel time in the step")
    for (name, grid), v in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(v):8.1f} us {len(v):4d} x {sum(v) / len(v):6.2f}  {grid:>14}  {name}")


if __name__ == "__main__":
    main(sys.argv[1])

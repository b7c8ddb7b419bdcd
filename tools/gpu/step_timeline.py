#!/usr/bin/env python3
"""Where a decode step's time goes as the step runs: reads the CSV that tools/lab/step_trace.cpp
(a CUPTI injection library) wrote for a `lily bench` run, takes the decode graph's replays and
prints, per kernel of the step, when it started and ended relative to the kernel before it.

Nsight Compute replays kernels one at a time, so its durations add up to more than the step
(programmatic dependent launch overlaps a kernel's start with its predecessor's end); here the
kernels ran as the bench runs them. The measure of a kernel's cost in the step is its
*advance*: how much later it ended than the kernel before it (completion is ordered along the
stream, so the advances of one step add up to the step). *Gap* is its start minus the previous
kernel's end: negative when it started early (overlap), positive when the GPU waited for it.

  python3 tools/gpu/step_timeline.py trace.csv [--skip 4] [--per-kernel out.tsv]
"""

import argparse
import csv
import re
import statistics
import sys
from collections import defaultdict


def short_name(name):
    """A kernel's demangled name without namespaces and its parameter list."""
    name = name.replace("(anonymous namespace)::", "")
    depth = 0
    for i, c in enumerate(name):  # cut the parameter list: the first '(' outside template args
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            name = name[:i]
            break
    name = re.sub(r"\blily::(cuda::)?", "", name)
    return re.sub(r"^void ", "", name)


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{path}: no kernels recorded")
    for r in rows:
        r["start"] = int(r["start_ns"])
        r["end"] = int(r["end_ns"])
        r["short"] = short_name(r["name"])
    return rows


def replays(rows):
    """The decode graph's replays, each a list of its kernels in launch order: the graph with the
    most kernel records; its i-th replay holds the i-th launch of every graph node."""
    by_graph = defaultdict(list)
    for r in rows:
        if r["graph_id"] != "0":
            by_graph[r["graph_id"]].append(r)
    if not by_graph:
        sys.exit("no kernel was launched from a graph (was the decode graph captured?)")
    graph = max(by_graph, key=lambda g: len(by_graph[g]))
    by_node = defaultdict(list)
    for r in by_graph[graph]:
        by_node[r["graph_node"]].append(r)
    for launches in by_node.values():
        launches.sort(key=lambda r: r["start"])
    count = min(len(v) for v in by_node.values())
    if count != max(len(v) for v in by_node.values()):
        print(f"note: graph nodes launched {count} to {max(len(v) for v in by_node.values())} times; "
              f"using the first {count} replays", file=sys.stderr)
    steps = [sorted((v[i] for v in by_node.values()), key=lambda r: r["start"]) for i in range(count)]
    return graph, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="CSV written by step_trace (LILY_TRACE_OUT)")
    ap.add_argument("--skip", type=int, default=4, help="replays left out at the start (default 4)")
    ap.add_argument("--per-kernel", help="also write every kernel position's medians to this TSV file")
    args = ap.parse_args()

    rows = load(args.trace)
    graph, steps = replays(rows)
    if len(steps) <= args.skip + 1:
        sys.exit(f"only {len(steps)} replays of graph {graph}; need more than {args.skip + 1}")
    kernels = len(steps[0])
    # Replay i's advances are measured from replay i - 1's last end, so replay 0 is never used.
    used = range(max(args.skip, 1), len(steps))
    per_pos = [defaultdict(list) for _ in range(kernels)]
    spans = []
    for i in used:
        prev_end = steps[i - 1][-1]["end"]
        spans.append(steps[i][-1]["end"] - prev_end)
        for j, r in enumerate(steps[i]):
            per_pos[j]["advance"].append(r["end"] - prev_end)
            per_pos[j]["gap"].append(r["start"] - prev_end)
            per_pos[j]["duration"].append(r["end"] - r["start"])
            prev_end = max(prev_end, r["end"])

    span = statistics.median(spans) / 1e3
    print(f"graph {graph}: {len(steps)} replays of {kernels} kernels; {len(spans)} used")
    print(f"step (last kernel's end to the next step's): median {span:.1f} us "
          f"({1e6 / span:.1f} steps/s), min {min(spans) / 1e3:.1f}, max {max(spans) / 1e3:.1f}")

    def med(j, key):
        return statistics.median(per_pos[j][key]) / 1e3

    summary = defaultdict(lambda: [0, 0.0, 0.0, 0.0])  # count, advance, duration, gap (us per step)
    for j in range(kernels):
        s = summary[steps[used[0]][j]["short"]]
        s[0] += 1
        s[1] += med(j, "advance")
        s[2] += med(j, "duration")
        s[3] += med(j, "gap")
    total_adv = sum(s[1] for s in summary.values())
    total_dur = sum(s[2] for s in summary.values())
    print(f"sum of median advances {total_adv:.1f} us, of median durations {total_dur:.1f} us "
          f"(durations overlap where gaps are negative)\n")
    print(f"{'kernel':<60} {'per step':>8} {'advance us':>10} {'share':>6} {'duration us':>11} {'gap us':>8}")
    for name, (n, adv, dur, gap) in sorted(summary.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:60]:<60} {n:>8} {adv:>10.1f} {100 * adv / total_adv:>5.1f}% {dur:>11.1f} {gap:>8.1f}")

    if args.per_kernel:
        with open(args.per_kernel, "w") as f:
            f.write("position\tkernel\tgrid\tblock\tgap_us\tduration_us\tadvance_us\n")
            for j in range(kernels):
                r = steps[used[0]][j]
                f.write(f"{j}\t{r['short']}\t{r['grid']}\t{r['block']}\t{med(j, 'gap'):.2f}\t"
                        f"{med(j, 'duration'):.2f}\t{med(j, 'advance'):.2f}\n")
        print(f"\nper kernel: {args.per_kernel}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where a kernel's warps stall, from Nsight Compute's source page: the stall reasons' shares and
the samples per span of SASS, with the phase marks (%globaltimer stamps, grid-barrier atomics).

Input: `ncu -i REPORT --page source --csv --print-source sass > FILE.csv` of a report collected
with `--section SourceCounters --section WarpStateStats`.
Usage: ncu_stalls.py FILE.csv [--span 512]
"""
import argparse
import csv
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--span", type=int, default=512, help="SASS instructions per row of the table")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel, row 1 is the header, then one row per SASS instruction.
    header = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if header is None:
        print(f"error: {args.csv}: no header row with 'Address' and 'Source' (expected ncu's "
              "source page as CSV)", file=sys.stderr)
        return 2
    hdr, data = rows[header], rows[header + 1:]
    need = ["Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_no_inst"]
    missing = [c for c in need if c not in hdr]
    if missing:
        print(f"error: {args.csv}: missing columns {missing} (collect with --section SourceCounters "
              "--section WarpStateStats)", file=sys.stderr)
        return 2
    src, samples, executed, no_inst = (hdr.index(c) for c in need)
    reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, i):
        try:
            return float(r[i] or 0)
        except (ValueError, IndexError):
            return 0.0

    total = sum(num(r, samples) for r in data)
    if total == 0:
        print(f"error: {args.csv}: no warp stall samples", file=sys.stderr)
        return 2
    ran = sum(1 for r in data if num(r, executed) > 0)
    print(f"{rows[0][1] if len(rows[0]) > 1 else rows[0][0]}")
    print(f"SASS instructions {len(data)}, executed at least once {ran} ({ran * 16 / 1024:.0f} KB of "
          f"code), warp stall samples {int(total)}")
    print("stall reasons, share of samples:")
    by_reason = {hdr[i]: sum(num(r, i) for r in data) for i in reasons}
    for name, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {name:24s} {100 * v / total:5.1f}%")
    print(f"by span of {args.span} SASS instructions (marks: stamp = %globaltimer read, "
          "grid-arrive = global atomic):")
    for b in range(0, len(data), args.span):
        seg = data[b:b + args.span]
        ex = sum(1 for r in seg if num(r, executed) > 0)
        if ex == 0:
            continue
        sm = sum(num(r, samples) for r in seg)
        ni = sum(num(r, no_inst) for r in seg)
        marks = []
        for r in seg:
            if "GLOBALTIMER" in r[src]:
                marks.append("stamp")
            if "ATOMG" in r[src]:
                marks.append("grid-arrive")
        print(f"  [{b:5d},{b + args.span:5d}) executed {ex:3d}  samples {int(sm):4d} "
              f"({100 * sm / total:4.1f}%)  no_inst {int(ni):4d}  {' '.join(marks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

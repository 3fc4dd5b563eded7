#!/usr/bin/env python3
"""The medians of workload.py's results, one markdown row per workload and allocator.

    python3 tools/torch_bench/torch_summary.py OUT/torch_<workload>_<allocator>_<run>.json...

The allocator is taken from the file name (so that devrt-posted, devrt with every request sent to
the device thread, is kept apart from devrt). Per row: the median wall seconds of the measured part
and every run's, in run order; the median peak reserved (GB, 10^9 bytes) and its range; the median
of the device allocations counted (PyTorch: cudaMalloc calls; devrt: driver allocations and maps).
Runs that failed are counted and left out of the medians.
"""
import json
import re
import statistics
import sys
from collections import defaultdict

NAME = re.compile(r"torch_(?P<workload>.+)_(?P<allocator>default|expandable|devrt|devrt-posted)_(?P<run>\d+)\.json$")


def main(paths: list[str]) -> int:
    rows: dict[tuple[str, str], list[tuple[int, dict]]] = defaultdict(list)
    for path in paths:
        m = NAME.search(path)
        if m is None:
            print(f"torch_summary: {path}: not a torch_<workload>_<allocator>_<run>.json file", file=sys.stderr)
            continue
        try:
            with open(path) as f:
                result = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"torch_summary: {path}: {e}", file=sys.stderr)
            continue
        rows[(m["workload"], m["allocator"])].append((int(m["run"]), result))
    if not rows:
        print("torch_summary: no results", file=sys.stderr)
        return 1
    print("| workload | allocator | runs ok | wall s, median (each run) | peak reserved GB, median (range) |"
          " device allocations, median |")
    print("|---|---|---|---|---|---|")
    for (workload, allocator), runs in sorted(rows.items()):
        runs.sort(key=lambda x: x[0])
        ok = [r for _, r in runs if r.get("ok") and r.get("wall_s") is not None]
        if not ok:
            print(f"| {workload} | {allocator} | 0 of {len(runs)} | - | - | - |")
            continue
        walls = [r["wall_s"] for r in ok]
        peaks = [r["peak_reserved_bytes"] / 1e9 for r in ok if r.get("peak_reserved_bytes") is not None]
        allocs = [r["num_device_alloc"] for r in ok if r.get("num_device_alloc") is not None]
        each = ", ".join(f"{w:.3f}" for w in walls)
        peak = f"{statistics.median(peaks):.3f} ({min(peaks):.3f}-{max(peaks):.3f})" if peaks else "-"
        alloc = f"{statistics.median(allocs):.0f}" if allocs else "-"
        print(f"| {workload} | {allocator} | {len(ok)} of {len(runs)} | {statistics.median(walls):.3f} ({each}) |"
              f" {peak} | {alloc} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

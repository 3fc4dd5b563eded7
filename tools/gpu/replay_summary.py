#!/usr/bin/env python3
"""The table of replays that tools/gpu/run.sh compare and tools/gpu/ab.sh write as JSON lines.

    python3 tools/gpu/replay_summary.py RUNS.jsonl ALLOCATOR...

Each line: {"trace": T, "allocator": A, "run": devrt-replay's (or the PyTorch baseline's) JSON}.
Per trace (in the order of the file) and allocator (in the order given): the best and median
ns/event and their range, then peak reserved / peak live, maps and unmaps of the best run, and the
most failed allocations of any run.
"""
import json
import statistics
import sys


def main(path: str, allocators: list[str]) -> int:
    rows: dict[tuple[str, str], list[dict]] = {}
    for line in open(path):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        rows.setdefault((d["trace"], d["allocator"]), []).append(d["run"])
    print("trace            allocator          best  median  range          ratio  maps  unmaps  failures")
    for t in dict.fromkeys(k[0] for k in rows):
        for a in allocators:
            runs = rows.get((t, a), [])
            if not runs:
                continue
            ns = sorted(r["ns_per_event"] for r in runs)
            best = min(runs, key=lambda r: r["ns_per_event"])
            print(f"{t:16s} {a:16s} {ns[0]:6.0f} {statistics.median(ns):7.0f}  {ns[0]:6.0f}-{ns[-1]:<6.0f} "
                  f"{best.get('ratio', 0):6.3f}  {best.get('maps', '-')}  {best.get('unmaps', '-')}  "
                  f"{max(r.get('failures', 0) for r in runs)}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2:]))

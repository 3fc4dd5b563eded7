#!/usr/bin/env python3
"""Writes synthetic allocation traces (devrt's trace format: `a ID BYTES` / `f ID`, gzip'd), for
checking the allocator on patterns its recorded traces lack.

    python3 tools/replay/synth_trace.py OUT_DIR [--patterns P,...] [--seeds N]

writes OUT_DIR/<pattern><seed>.trace.gz for seeds 0..N-1 (3 by default). The patterns:

  serving    requests of 3-20 buffers (512 B - 64 MiB, log-uniform), some freed while the request
             runs, 8 requests live at once, each finished whole in a random order
  training   40 weights, then steps of a random batch (1-16): per layer a temporary and an
             activation forward, a gradient per activation backward, freed in reverse
  kvgrow     40 sequences whose caches grow: a larger buffer allocated, then the old one freed
  adversary  small long-lived buffers among large short-lived ones (at most 12 large live)
  huge       up to 5 live buffers of 1 MiB - 24 GiB
  pairs      one buffer of 1 MiB allocated and freed in turn, 20,000 times: the least work an
             allocator can have (no search, no split, no merge), so its time per event is the
             allocator's fixed cost; the same for every seed, and not among the default patterns

Every trace frees everything it allocates. The same seed gives the same trace.
"""
import argparse
import gzip
import json
import math
import random
import sys
from pathlib import Path


def log_uniform(r, lo, hi):
    return int(math.exp(r.uniform(math.log(lo), math.log(hi))))


class Trace:
    def __init__(self):
        self.events = []
        self.next_id = 0

    def alloc(self, size):
        i = self.next_id
        self.next_id += 1
        self.events.append(("a", i, max(1, size)))
        return i

    def free(self, i):
        self.events.append(("f", i))


def serving(r, t):
    active = []
    for _ in range(3000):
        ids = []
        for _ in range(r.randint(3, 20)):
            ids.append(t.alloc(log_uniform(r, 512, 64 << 20)))
            if r.random() < 0.3:
                t.free(ids.pop(r.randrange(len(ids))))
        active.append(ids)
        if len(active) > 8:
            done = active.pop(r.randrange(len(active)))
            r.shuffle(done)
            for i in done:
                t.free(i)
    for ids in active:
        for i in ids:
            t.free(i)


def training(r, t):
    layers = 40
    weights = [t.alloc(log_uniform(r, 1 << 16, 256 << 20)) for _ in range(layers)]
    for _ in range(30):
        batch = r.choice([1, 2, 4, 8, 16])
        acts = []
        for _ in range(layers):
            tmp = t.alloc(log_uniform(r, 1 << 12, 1 << 22) * batch)
            acts.append(t.alloc(log_uniform(r, 1 << 14, 1 << 24) * batch))
            t.free(tmp)
        for a in reversed(acts):
            g = t.alloc(log_uniform(r, 1 << 14, 1 << 24) * batch)
            t.free(a)
            t.free(g)
    for w in weights:
        t.free(w)


def kvgrow(r, t):
    caches = {}
    for _ in range(4000):
        s = r.randrange(40)
        if s not in caches:
            size = log_uniform(r, 4096, 4 << 20)
            caches[s] = (t.alloc(size), size)
            continue
        old, size = caches[s]
        if r.random() < 0.05:
            t.free(old)
            del caches[s]
            continue
        size += log_uniform(r, 4096, 1 << 20)
        caches[s] = (t.alloc(size), size)
        t.free(old)
    for i, _ in caches.values():
        t.free(i)


def adversary(r, t):
    small, large = [], []
    for _ in range(6000):
        x = r.random()
        if x < 0.4:
            small.append(t.alloc(log_uniform(r, 512, 64 << 10)))
        elif x < 0.75:
            large.append(t.alloc(log_uniform(r, 1 << 20, 512 << 20)))
        elif x < 0.9 and large:
            t.free(large.pop(r.randrange(len(large))))
        elif small:
            t.free(small.pop(r.randrange(len(small))))
        while len(large) > 12:
            t.free(large.pop(0))
    for i in small + large:
        t.free(i)


def huge(r, t):
    live = []
    for _ in range(300):
        if live and r.random() < 0.5:
            t.free(live.pop(r.randrange(len(live))))
        else:
            live.append(t.alloc(log_uniform(r, 1 << 20, 24 << 30)))
        while len(live) > 5:
            t.free(live.pop(0))
    for i in live:
        t.free(i)


def pairs(r, t):
    for _ in range(20000):
        t.free(t.alloc(1 << 20))


PATTERNS = {"serving": serving, "training": training, "kvgrow": kvgrow, "adversary": adversary, "huge": huge,
            "pairs": pairs}
OPT_IN_PATTERNS = ("pairs",)  # written only when asked for by name
DEFAULT_PATTERNS = [n for n in PATTERNS if n not in OPT_IN_PATTERNS]


def write(path, pattern, seed, t):
    live = peak = 0
    sizes = {}
    for e in t.events:
        if e[0] == "a":
            sizes[e[1]] = e[2]
            live += e[2]
            peak = max(peak, live)
        else:
            live -= sizes[e[1]]
    header = {"source": "synthetic", "pattern": pattern, "seed": seed, "events": len(t.events),
              "allocs": t.next_id, "peak_live_bytes": peak}
    with gzip.open(path, "wt") as f:
        f.write("# " + json.dumps(header) + "\n")
        for e in t.events:
            f.write(f"a {e[1]} {e[2]}\n" if e[0] == "a" else f"f {e[1]}\n")


def main():
    p = argparse.ArgumentParser(description="Writes synthetic allocation traces.")
    p.add_argument("out_dir")
    p.add_argument("--patterns", default=",".join(DEFAULT_PATTERNS),
                   help="comma-separated, of: " + ", ".join(PATTERNS) + " (default: all but " + ", ".join(OPT_IN_PATTERNS) + ")")
    p.add_argument("--seeds", type=int, default=3)
    a = p.parse_args()
    names = [n for n in a.patterns.split(",") if n]
    unknown = [n for n in names if n not in PATTERNS]
    if unknown:
        sys.exit(f"synth_trace.py: unknown pattern {', '.join(unknown)} (known: {', '.join(PATTERNS)})")
    if a.seeds < 1:
        sys.exit("synth_trace.py: --seeds must be at least 1")
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        for seed in range(a.seeds):
            t = Trace()
            PATTERNS[name](random.Random(seed), t)
            path = out / f"{name}{seed}.trace.gz"
            write(path, name, seed, t)
            print(path)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How fast devrt sleeps and wakes, through Python and PyTorch under devrt.torch.install(), on a GPU.

    PYTHONPATH=python python3 tools/gpu/sleep_bench.py [--keep-gib 16] [--discard-gib 64] [--runs 3]

(i)  --keep-gib tensors of 1 GiB under tag "bench_keep", filled: devrt.sleep(keep=True) (copies to
     pinned host memory, then unmaps) and devrt.wake() (maps, copies back), beside a plain pinned
     cudaMemcpyAsync of as many bytes each way (torch.empty(pin_memory=True), copy_(non_blocking=True),
     then synchronize): GB/s of each and devrt's / memcpy's ratio; the contents are checked after
     each wake. The first sleep pins the host memory (printed apart); later ones copy into the
     pinned memory devrt kept (host_cached_bytes), as the memcpy reuses its pinned buffer.
(ii) --discard-gib tensors of 1 GiB under tag "bench_discard": sleep(keep=False) and wake: GiB/s of
     address space unmapped and mapped again.
Each is run --runs times; the medians are printed (the runs beside them), with devrt's statistics
deltas (maps, unmaps, sleeps, wakes) of one sleep and wake. One line per figure, "sleep_bench: ...".
Needs about keep-gib + discard-gib of GPU memory and 2 x keep-gib of host memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402

import devrt  # noqa: E402
import devrt.torch as dt  # noqa: E402

dt.install()  # before the first CUDA tensor

GiB = 1 << 30


def line(text: str) -> None:
    print(f"sleep_bench: {text}", flush=True)


def med(xs):
    return statistics.median(xs)


def runs(xs, unit="s"):
    return ", ".join(f"{x:.3f}" for x in xs) + f" {unit}"


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def delta(a, b, keys=("maps", "unmaps", "sleeps", "wakes", "driver_allocs", "driver_frees")):
    return ", ".join(f"{k} +{b[k] - a[k]}" for k in keys)


def alloc_tagged(tag: str, n: int, dev):
    with dt.tag(tag):
        ts = [torch.empty(GiB, dtype=torch.uint8, device=dev) for _ in range(n)]
    for i, t in enumerate(ts):
        t.fill_(i % 251 + 1)
    torch.cuda.synchronize()
    return ts


def contents_ok(ts) -> bool:
    return all(bool(t[:: 1 << 20].eq(i % 251 + 1).all().item()) and int(t[-1].item()) == i % 251 + 1
               for i, t in enumerate(ts))


def bench_keep(n: int, reps: int, dev, d: int) -> bool:
    nbytes = n * GiB
    ts = alloc_tagged("bench_keep", n, dev)
    sleeps, wakes, ok = [], [], True
    st_a = st_b = st_c = None
    first_sleep = first_wake = None
    for r in range(reps + 1):
        a = devrt.stats(d)
        sleeps.append(timed(lambda: devrt.sleep("bench_keep", d, keep=True)))
        b = devrt.stats(d)
        wakes.append(timed(lambda: devrt.wake("bench_keep", d)))
        c = devrt.stats(d)
        if r == 0:
            first_sleep, first_wake = sleeps.pop(), wakes.pop()
            line(f"keep {n} GiB: first sleep (pins {b['offloaded_bytes'] / GiB:.2f} GiB of host memory) "
                 f"{first_sleep:.3f} s, first wake {first_wake:.3f} s; host_cached_bytes after the wake "
                 f"{c['host_cached_bytes'] / GiB:.2f} GiB")
        if r == 1:
            st_a, st_b, st_c = a, b, c
            line(f"keep {n} GiB: while asleep sleeping_bytes {b['sleeping_bytes'] / GiB:.2f} GiB, offloaded_bytes "
                 f"{b['offloaded_bytes'] / GiB:.2f} GiB, reserved {a['reserved_bytes'] / GiB:.2f} -> "
                 f"{b['reserved_bytes'] / GiB:.2f} GiB")
        if not contents_ok(ts):
            ok = False
            line(f"keep {n} GiB: FAIL contents differ after wake {r + 1}")
    line(f"keep {n} GiB: later sleeps, into the pinned memory kept:")
    line(f"keep {n} GiB: devrt.sleep(keep=True) median {med(sleeps):.3f} s ({runs(sleeps)}), "
         f"{nbytes / med(sleeps) / 1e9:.2f} GB/s")
    line(f"keep {n} GiB: devrt.wake median {med(wakes):.3f} s ({runs(wakes)}), {nbytes / med(wakes) / 1e9:.2f} GB/s")
    line(f"keep {n} GiB: stats of one sleep: {delta(st_a, st_b)}; of one wake: {delta(st_b, st_c)}")

    # The same bytes through a plain pinned copy.
    host = [torch.empty(GiB, dtype=torch.uint8, pin_memory=True) for _ in range(n)]

    def d2h():
        for h, t in zip(host, ts):
            h.copy_(t, non_blocking=True)
        torch.cuda.synchronize()

    def h2d():
        for h, t in zip(host, ts):
            t.copy_(h, non_blocking=True)
        torch.cuda.synchronize()

    d2h()  # first touch of the pinned pages
    downs = [timed(d2h) for _ in range(reps)]
    ups = [timed(h2d) for _ in range(reps)]
    if not contents_ok(ts):
        ok = False
        line("keep: FAIL contents differ after the pinned round trip")
    line(f"keep {n} GiB: pinned memcpy D2H median {med(downs):.3f} s ({runs(downs)}), "
         f"{nbytes / med(downs) / 1e9:.2f} GB/s")
    line(f"keep {n} GiB: pinned memcpy H2D median {med(ups):.3f} s ({runs(ups)}), {nbytes / med(ups) / 1e9:.2f} GB/s")
    line(f"keep {n} GiB: ratio devrt/memcpy: sleep {med(downs) / med(sleeps):.2f}x the D2H copy's GB/s, "
         f"wake {med(ups) / med(wakes):.2f}x the H2D copy's")
    line(f"keep {n} GiB: contents after every wake {'PASS' if ok else 'FAIL'}")
    del host, ts
    torch.cuda.synchronize()
    dt.empty_cache()
    released = devrt.release_host_copies(d)
    left = devrt.stats(d)["host_cached_bytes"]
    line(f"keep {n} GiB: release_host_copies freed {released / GiB:.2f} GiB, {left} bytes left")
    ok = ok and released >= nbytes and left == 0
    return ok


def bench_discard(n: int, reps: int, dev, d: int) -> bool:
    ts = alloc_tagged("bench_discard", n, dev)
    sleeps, wakes, ok = [], [], True
    for r in range(reps):
        a = devrt.stats(d)
        free_a, _ = torch.cuda.mem_get_info(d)
        sleeps.append(timed(lambda: devrt.sleep("bench_discard", d, keep=False)))
        b = devrt.stats(d)
        free_b, _ = torch.cuda.mem_get_info(d)
        wakes.append(timed(lambda: devrt.wake("bench_discard", d)))
        c = devrt.stats(d)
        if r == 0:
            line(f"discard {n} GiB: while asleep sleeping_bytes {b['sleeping_bytes'] / GiB:.2f} GiB, offloaded "
                 f"{b['offloaded_bytes'] / GiB:.2f} GiB, mem_get_info +{(free_b - free_a) / GiB:.2f} GiB")
            line(f"discard {n} GiB: stats of one sleep: {delta(a, b)}; of one wake: {delta(b, c)}")
        if b["offloaded_bytes"] != 0 or free_b - free_a < 0.95 * n * GiB:
            ok = False
    # The memory is usable after the last wake.
    for i, t in enumerate(ts):
        t.fill_(i % 251 + 1)
    ok = ok and contents_ok(ts)
    line(f"discard {n} GiB: devrt.sleep(keep=False) median {med(sleeps) * 1e3:.1f} ms "
         f"({runs([x * 1e3 for x in sleeps], 'ms')}), {n / med(sleeps):.1f} GiB/s unmapped")
    line(f"discard {n} GiB: devrt.wake median {med(wakes) * 1e3:.1f} ms ({runs([x * 1e3 for x in wakes], 'ms')}), "
         f"{n / med(wakes):.1f} GiB/s mapped")
    line(f"discard {n} GiB: memory given back and usable after wake {'PASS' if ok else 'FAIL'}")
    del ts
    torch.cuda.synchronize()
    dt.empty_cache()
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep-gib", type=int, default=16)
    ap.add_argument("--discard-gib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        line("FAIL no CUDA device")
        return 1
    d = torch.cuda.current_device()
    dev = torch.device("cuda", d)
    x = torch.ones(16, device=dev)  # CUDA and devrt's device started before timing
    x.sum().item()
    free, total = torch.cuda.mem_get_info(d)
    line(f"{torch.cuda.get_device_name(d)}, {free / GiB:.1f} of {total / GiB:.1f} GiB free, torch {torch.__version__}, "
         f"library {devrt.library_path()}")
    ok = bench_keep(args.keep_gib, args.runs, dev, d)
    ok = bench_discard(args.discard_gib, args.runs, dev, d) and ok
    line("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The cupy_two_streams workload under one allocator, in this process; writes a JSON result.

    PYTHONPATH=python python3 tools/torch_bench/cupy_workload.py --allocator devrt \\
        --lib build/release/runtime/libdevrt_c.so --out /tmp/cupy.devrt.json

Allocators: ``default`` (CuPy's default MemoryPool) and ``devrt`` (``devrt.cupy.install()``).

Two ``cupy.cuda.Stream(non_blocking=True)`` streams. Each iteration makes an int32 array on stream A,
queues a spin kernel (slow work) and an elementwise kernel behind it, drops the input at once and
writes a new array of the same size on A (in stream order: that may reuse the memory); then stream
B waits for A, spins, reads A's result, and the result is released while B's kernels are queued;
a new array is written on A right after. A kernel on B compares every element against the formula
(recomputed from the index, no memory) and counts the wrong ones; the per-iteration sums are
checked against numpy at the end.

Releasing an array read on another stream: devrt frees it in the order of the stream current when
the last reference goes (so it is dropped under ``with B:`` at once). CuPy's own pool has no
record_stream: memory goes back to the stream it was allocated on and may be reused there at once,
so the correct code for it keeps the array until an event recorded on B after the read has passed;
this script does that for ``default`` (what a correct CuPy program must do), and counts how many
arrays it had to hold back.

Exit status: 0 ok, 1 a wrong result, 2 could not run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as common  # noqa: E402

SEED = 20261201
OPS = ((3, 7), (2, -11))  # y = x * a + b on stream A, then z = y * a2 + b2 on stream B


def config(small: bool) -> dict:
    import random

    rng = random.Random(SEED + 3)
    iters = 60 if small else 400
    sizes = [rng.choice([1 << 12, 1 << 14, 3 << 14, 1 << 16, 5 << 16, 1 << 18, 3 << 18, 1 << 20, 1 << 22])
             for _ in range(iters)]
    return dict(iters=iters, sizes=sizes, spin_cycles=200_000 if small else 500_000)


def expected_sum(n: int, m: int) -> int:
    """Sum over i < n of ((i*m % 1000) * a + b) * a2 + b2, in Python integers (exact)."""
    return common.affine_sum(n, m, OPS)


SPIN_SRC = r"""
extern "C" __global__ void torch_bench_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allocator", required=True, choices=common.CUPY_ALLOCATORS)
    p.add_argument("--lib", default=None, help="libdevrt_c.so (allocator devrt; default build/release/runtime/)")
    p.add_argument("--out", default=None, help="the JSON result file")
    p.add_argument("--small", action="store_true", help="fewer iterations (a quick pass)")
    p.add_argument("--workload", default="cupy_two_streams", choices=common.CUPY_WORKLOADS)
    args = p.parse_args(argv)

    result = common.new_result("cupy_two_streams", args.allocator, "cupy", args.small)
    lib_path = common.check_library(args.lib) if args.allocator == "devrt" else None
    try:
        import cupy  # noqa: PLC0415
        import numpy  # noqa: PLC0415,F401
    except ImportError as e:
        common.fail(f"CuPy is not installed for {sys.executable} ({e}); this workload needs a GPU machine with cupy")
    try:
        ndev = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        common.fail(f"no CUDA device for CuPy: {e}")
    if ndev == 0:
        common.fail("no CUDA device for CuPy")
    devrt = None
    if args.allocator == "devrt":
        common.prepare_devrt_import(lib_path)
        try:
            import devrt  # noqa: PLC0415
            import devrt.cupy  # noqa: PLC0415

            devrt.cupy.install()
        except Exception as e:  # noqa: BLE001
            common.fail(f"devrt.cupy.install() failed with {lib_path}: {type(e).__name__}: {e}"
                        + common.load_hint(e))
    pool = cupy.get_default_memory_pool()

    c = config(args.small)
    result["config"] = {k: v for k, v in c.items() if not isinstance(v, list)}
    result["info"].update({"cupy": cupy.__version__, "lib": lib_path, "pid": os.getpid(),
                           "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(errors="replace")})

    spin = cupy.RawKernel(SPIN_SRC, "torch_bench_spin")
    make = cupy.ElementwiseKernel("int32 m", "int32 x", "x = (int)(((long long)i * m) % 1000)", "torch_bench_make")
    axpb = cupy.ElementwiseKernel("int32 x, int32 a, int32 b", "int32 y", "y = x * a + b", "torch_bench_axpb")
    check = cupy.ElementwiseKernel(
        "int32 z, int32 m, int32 a, int32 b, int32 a2, int32 b2", "raw uint64 wrong",
        "int v0 = (int)(((long long)i * m) % 1000); int want = (v0 * a + b) * a2 + b2;"
        " if (z != want) atomicAdd(&wrong[0], 1ULL);",
        "torch_bench_check")
    (a1, b1), (a2, b2) = OPS
    i32 = cupy.int32
    streams = [cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)]
    wrong = cupy.zeros(1, dtype=cupy.uint64)
    cupy.cuda.Device().synchronize()
    held = []  # default pool only: (event on the consuming stream, array) until the event has passed
    stats = {"held_back": 0, "peak_sampled_used": 0}

    def sample():
        if devrt is None:
            stats["peak_sampled_used"] = max(stats["peak_sampled_used"], pool.used_bytes())

    def iteration(it, n, sums):
        m = it % 13 + 1
        sa, sb = streams[it % 2], streams[(it + 1) % 2]
        with sa:
            x = cupy.empty(n, dtype=cupy.int32)
            make(i32(m), x)
            spin((1,), (1,), (cupy.int64(c["spin_cycles"]),))
            y = axpb(x, i32(a1), i32(b1))
            del x  # freed while queued on sa, in sa's order
            junk = cupy.empty(n, dtype=cupy.int32)
            junk.fill(-77777)
            del junk
            ready = sa.record()
        sb.wait_event(ready)
        with sb:
            spin((1,), (1,), (cupy.int64(c["spin_cycles"]),))
            z = axpb(y, i32(a2), i32(b2))
            sample()
            if devrt is not None:
                del y  # devrt: freed in sb's order, reused elsewhere only once sb's queued work is done
            else:
                held.append((sb.record(), y))  # CuPy's pool: keep it until sb has read it
                del y
                stats["held_back"] += 1
            check(z, i32(m), i32(a1), i32(b1), i32(a2), i32(b2), wrong)
            sums.append(z.sum(dtype=cupy.int64))
            del z
        with sa:  # new memory on the other stream, written at once
            junk = cupy.empty(n, dtype=cupy.int32)
            junk.fill(-55555)
            del junk
        while held and held[0][0].done:
            held.pop(0)

    # Warm-up: compiles the kernels.
    t0 = time.perf_counter()
    warm = []
    for it in range(2):
        iteration(it, 1 << 12, warm)
    cupy.cuda.Device().synchronize()
    held.clear()
    wrong.fill(0)  # on the legacy stream, which the non-blocking streams do not wait for:
    cupy.cuda.Device().synchronize()
    del warm
    result["warmup_s"] = time.perf_counter() - t0
    if devrt is not None:
        devrt.reset_peak_stats(0)
    else:
        stats["peak_sampled_used"] = pool.used_bytes()

    code = common.EXIT_OK
    try:
        sums = []
        t0 = time.perf_counter()
        for it, n in enumerate(c["sizes"]):
            iteration(it, n, sums)
        cupy.cuda.Device().synchronize()
        result["wall_s"] = time.perf_counter() - t0
        held.clear()

        sums_host = [int(s.get()) for s in sums]
        wrong_sums = sum(1 for it, (n, v) in enumerate(zip(c["sizes"], sums_host)) if v != expected_sum(n, it % 13 + 1))
        wrong_elements = int(wrong.get()[0])
        result["checks"] = {"wrong_elements": wrong_elements, "wrong_sums_vs_numpy": wrong_sums}
        result["outputs"] = [common.group("sums", sums_host, "exact")]
        if devrt is not None:
            s = devrt.stats(0)
            result.update({"peak_reserved_bytes": s["peak_reserved_bytes"], "peak_live_bytes": s["peak_in_use_bytes"],
                           "allocations": s["allocations"], "peak_method": "devrt statistics"})
        else:
            # CuPy's pool keeps what it took from the driver until free_all_blocks (never called here),
            # so total_bytes() at the end is its peak; its live bytes are sampled at each iteration's
            # busiest point.
            result.update({"peak_reserved_bytes": pool.total_bytes(), "peak_live_bytes": stats["peak_sampled_used"],
                           "peak_method": "pool.total_bytes() at the end; used_bytes() sampled"})
        result["info"].update({"iters": c["iters"], "elements": sum(c["sizes"]), "held_back": stats["held_back"]})
        free_b, total_b = cupy.cuda.runtime.memGetInfo()
        result["info"]["device_used_bytes_end"] = total_b - free_b
        ok = wrong_elements == 0 and wrong_sums == 0
        result["check_ok"] = ok
        if devrt is not None and not result.get("allocations"):
            result["check_ok"] = False
            result["error"] = "devrt served no allocation: devrt.cupy.install() did not take effect"
            code = common.EXIT_WRONG
        elif not ok:
            result["error"] = f"wrong result: {result['checks']}"
            code = common.EXIT_WRONG
        else:
            result["ok"] = True
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        code = common.EXIT_SETUP
    common.write_result(args.out, result)
    status = "ok" if code == 0 else f"FAILED ({result['error']})"
    wall = f"{result['wall_s']:.3f} s" if result.get("wall_s") is not None else "-"
    print(f"cupy_two_streams [{args.allocator}]: {status}; wall {wall}, peak reserved "
          f"{result.get('peak_reserved_bytes')}, peak live {result.get('peak_live_bytes')}; checks {result['checks']}",
          flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

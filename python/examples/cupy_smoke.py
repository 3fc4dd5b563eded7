"""CuPy on devrt, on a GPU: installs devrt as CuPy's allocator, runs kernels on two streams and
checks the data.

    cmake --build build/release --target devrt_c
    PYTHONPATH=python python3 python/examples/cupy_smoke.py       # prints "cupy smoke: ok"
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import cupy  # noqa: E402

import devrt  # noqa: E402
import devrt.cupy  # noqa: E402

devrt.cupy.install()

scale = cupy.ElementwiseKernel("float64 x, float64 k", "float64 y", "y = x * k + 1.0", "devrt_scale")


def main() -> int:
    if cupy.cuda.runtime.getDeviceCount() == 0:
        print("cupy smoke: skipped: no CUDA device")
        return 0
    failures = []
    streams = [cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)]
    before = devrt.stats(0)["allocations"]
    for step in range(40):
        s = streams[step % 2]
        n = 1 << (12 + step % 8)
        with s:
            x = cupy.arange(n, dtype=cupy.float64)
            y = scale(x, cupy.float64(3.0))
            total = float(y.sum())  # synchronizes s
        expected = 3.0 * n * (n - 1) / 2 + n
        if abs(total - expected) > 1e-3 * expected:
            failures.append(f"step {step}: sum {total} != {expected}")
        with s:
            del x, y  # freed in stream order on s
    # One array made on a stream and read on the other.
    with streams[0]:
        a = cupy.full(1 << 20, 7, dtype=cupy.int32)
        done = streams[0].record()
    streams[1].wait_event(done)
    with streams[1]:
        b = a + 1
        ok = bool((b == 8).all())
    if not ok:
        failures.append("the array read on the second stream differs")
    del a, b
    for s in streams:
        s.synchronize()

    stats = devrt.stats(0)
    print({k: stats[k] for k in ("in_use_bytes", "peak_in_use_bytes", "reserved_bytes", "allocations", "frees")})
    if stats["allocations"] == before:
        failures.append("devrt served no allocation: the allocator was not installed")
    for f in failures:
        print(f"cupy smoke: FAILED: {f}")
    if failures:
        return 1
    print("cupy smoke: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

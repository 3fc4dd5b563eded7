"""PyTorch on devrt, on a GPU: installs devrt as PyTorch's CUDA allocator, runs tensor work on two
streams with record_stream, checks every result and prints devrt's memory statistics.

    cmake --build build/release --target devrt_c
    PYTHONPATH=python python3 python/examples/torch_smoke.py      # prints "torch smoke: ok"
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import devrt.torch  # noqa: E402

devrt.torch.install()  # before the first CUDA tensor


def main() -> int:
    if not torch.cuda.is_available():
        print("torch smoke: skipped: no CUDA device")
        return 0
    dev = torch.device("cuda", 0)
    side = torch.cuda.Stream(device=dev)
    failures = []

    for step in range(20):
        n = 1 << (10 + step % 10)
        a = torch.arange(n, device=dev, dtype=torch.float64)
        b = a * 2 + 1
        # Work on a second stream, using memory allocated on the current one.
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            c = b.sum()
            d = torch.empty_like(b)
            d.copy_(b)
        b.record_stream(side)  # b is freed below while side may still read it
        d.record_stream(torch.cuda.current_stream(dev))
        torch.cuda.current_stream(dev).wait_stream(side)
        del b
        e = d - 1
        expected_sum = float(n) * float(n - 1) + n  # sum of 2i+1 for i < n
        if abs(c.item() - expected_sum) > 1e-3 * expected_sum:
            failures.append(f"step {step}: sum {c.item()} != {expected_sum}")
        if not torch.equal(e, a * 2):
            failures.append(f"step {step}: the copy made on the side stream differs")
        del a, c, d, e

    # A matrix product and a reduction, checked against the CPU.
    x = torch.randn(512, 512, device=dev)
    y = torch.randn(512, 512, device=dev)
    z = (x @ y).cpu()
    if not torch.allclose(z, x.cpu() @ y.cpu(), rtol=1e-3, atol=1e-3):
        failures.append("matmul differs from the CPU's")
    del x, y, z
    torch.cuda.synchronize()

    stats = devrt.torch.memory_stats(0)
    for k in sorted(stats):
        print(f"{k}: {stats[k]}")
    if stats["allocation.all.allocated"] == 0:
        failures.append("devrt served no allocation: the allocator was not installed")
    devrt.torch.reset_peak_memory_stats(0)
    torch.cuda.empty_cache()  # reaches devrt (set_reset_fn)
    after = devrt.torch.memory_stats(0)
    print(f"after empty_cache: reserved {after['reserved_bytes.all.current']} bytes, "
          f"allocated {after['allocated_bytes.all.current']} bytes")

    # Out of memory: a RuntimeError from PyTorch, a torch.OutOfMemoryError through oom_errors().
    try:
        with devrt.torch.oom_errors():
            torch.empty(1 << 50, dtype=torch.uint8, device=dev)
        failures.append("a 1 PiB tensor was allocated")
    except torch.cuda.OutOfMemoryError as err:
        print(f"out of memory, as expected: {str(err).splitlines()[0]}")

    for f in failures:
        print(f"torch smoke: FAILED: {f}")
    if failures:
        return 1
    print("torch smoke: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

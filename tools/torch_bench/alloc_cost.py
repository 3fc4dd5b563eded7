#!/usr/bin/env python3
"""The cost of one tensor allocation and free under an allocator, from Python, on a GPU.

    PYTHONPATH=python python3 tools/torch_bench/alloc_cost.py default|expandable|devrt [--lib LIB]

Three loops of 100,000 iterations each, best of three, printed in microseconds per iteration:
``torch.empty`` of 4 KiB to 16 MiB and its ``del`` at once; the same with 8 tensors held (each
freed 8 allocations later); and a tensor of 0 bytes (PyTorch's own cost of a tensor, plus what
the allocator does for a size of 0). Each allocator in a fresh process; timings on a shared
machine vary between runs, so compare runs of one call, with the order rotated.
"""

import argparse
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("allocator", choices=("default", "expandable", "devrt"))
    p.add_argument("--lib", default=None, help="libdevrt_c.so for devrt (else DEVRT_LIBRARY or the package's)")
    args = p.parse_args(argv)
    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        print("alloc_cost: unset PYTORCH_CUDA_ALLOC_CONF for this allocator", file=sys.stderr)
        return 2
    if args.lib is not None:
        os.environ["DEVRT_LIBRARY"] = args.lib
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        print(f"alloc_cost: PyTorch is not installed for {sys.executable} ({e}); this needs a GPU machine "
              "with torch", file=sys.stderr)
        return 2
    if args.allocator == "devrt":
        try:
            import devrt.torch  # noqa: PLC0415
        except ImportError as e:
            print(f"alloc_cost: cannot import the devrt package ({e}); run with PYTHONPATH=python", file=sys.stderr)
            return 2
        devrt.torch.install()
    if not torch.cuda.is_available():
        print("alloc_cost: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.empty(1, device=dev)
    sizes = [4096, 65536, 1 << 20, 3 << 20, 16 << 20]

    def at_once(n, sizes):
        t = time.perf_counter()
        for i in range(n):
            a = torch.empty(sizes[i % len(sizes)], dtype=torch.uint8, device=dev)
            del a
        return (time.perf_counter() - t) / n * 1e6

    def held(n, sizes, k=8):
        live = []
        t = time.perf_counter()
        for i in range(n):
            live.append(torch.empty(sizes[i % len(sizes)], dtype=torch.uint8, device=dev))
            if len(live) > k:
                live.pop(0)
        live.clear()
        return (time.perf_counter() - t) / n * 1e6

    at_once(20000, sizes)  # warm: the allocator's memory is in place
    a = min(at_once(100000, sizes) for _ in range(3))
    b = min(held(100000, sizes) for _ in range(3))
    c = min(at_once(100000, [0]) for _ in range(3))
    torch.cuda.synchronize()
    print(f"{args.allocator}: empty+del {a:.2f} us, 8 held {b:.2f} us, size-0 tensor {c:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The cost of one tensor allocation and free under an allocator, from Python, on a GPU.

    PYTHONPATH=python python3 tools/torch_bench/alloc_cost.py ALLOCATOR [--lib LIB] [--busy] [--side-stream]

ALLOCATOR: default, expandable (PyTorch's with expandable segments), devrt, async (PyTorch's
cudaMallocAsync backend) or plugin-async (the same two CUDA calls through PyTorch's pluggable
interface: plugin_async.c, built here with cc; what async and plugin-async differ by is the
interface's own cost, which devrt pays as every pluggable allocator does).

Three loops of 100,000 iterations each, best of three, printed in microseconds per iteration:
``torch.empty`` of 4 KiB to 16 MiB and its ``del`` at once; the same with 8 tensors held (each
freed 8 allocations later); and a tensor of 0 bytes (PyTorch's own cost of a tensor, plus what
the allocator does for a size of 0). Each allocator in a fresh process; timings on a shared
machine vary between runs, so compare runs of one call, with the order rotated.

--busy: each loop runs while the GPU is still busy with a kernel queued before it (about a
second of ``torch.cuda._sleep``), as in a real workload whose host runs ahead of the GPU: the frees
of the loop are not yet reached by the stream when the next allocations come. --side-stream: the
loops allocate on a stream the script creates (a request's stream, a framework's side stream)
rather than the default stream.
"""

import argparse
import os
import sys
import time


def build_plugin():
    """Builds plugin_async.c next to a temporary file; the library's path, or None (with why)."""
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin_async.c")
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    out = os.path.join(tempfile.mkdtemp(prefix="alloc_cost_"), "plugin_async.so")
    cmd = ["cc", "-O2", "-shared", "-fPIC", f"-I{cuda}/include", src, "-o", out, f"-L{cuda}/lib64", "-lcudart",
           f"-Wl,-rpath,{cuda}/lib64"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        print(f"alloc_cost: cannot build {src} ({' '.join(cmd)}):\n{r.stderr}", file=sys.stderr)
        return None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("allocator", choices=("default", "expandable", "devrt", "async", "plugin-async"))
    p.add_argument("--lib", default=None, help="libdevrt_c.so for devrt (else DEVRT_LIBRARY or the package's)")
    p.add_argument("--busy", action="store_true", help="keep the GPU busy behind each loop")
    p.add_argument("--side-stream", action="store_true",
                   help="allocate on a stream of the script's own (torch.cuda.Stream) instead of the default one")
    args = p.parse_args(argv)
    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif args.allocator == "async":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
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
    elif args.allocator == "plugin-async":
        lib = build_plugin()
        if lib is None:
            return 2
        plugin = torch.cuda.memory.CUDAPluggableAllocator(lib, "plugin_async_malloc", "plugin_async_free")
        torch.cuda.memory.change_current_allocator(plugin)
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

    def timed(loop, sizes):
        if args.busy:
            torch.cuda._sleep(2_000_000_000)  # about a second on a 2 GHz GPU, longer than a loop
        us = loop(100000, sizes)
        torch.cuda.synchronize()  # not timed
        return us

    import contextlib  # noqa: PLC0415

    where = torch.cuda.stream(torch.cuda.Stream()) if args.side_stream else contextlib.nullcontext()
    with where:
        at_once(20000, sizes)  # warm: the allocator's memory is in place
        a = min(timed(at_once, sizes) for _ in range(3))
        b = min(timed(held, sizes) for _ in range(3))
        c = min(timed(at_once, [0]) for _ in range(3))
    busy = (" (GPU busy)" if args.busy else "") + (" (side stream)" if args.side_stream else "")
    print(f"{args.allocator}{busy}: empty+del {a:.2f} us, 8 held {b:.2f} us, size-0 tensor {c:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())

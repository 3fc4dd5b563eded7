"""Stream order under PyTorch with devrt as its allocator, on a GPU (the review's t1, and more).

    CUDA_MODULE_LOADING=EAGER DEVRT_LIBRARY=build/release/runtime/libdevrt_c.so PYTHONPATH=python \
        python3 tests/cuda/torch_stream_order.py

Each case prints one line with its counts and the program exits 1 if any element is wrong:
- empty_cache: a side stream's kernel still writes a freed tensor when torch.cuda.empty_cache()
  runs; the next tensor on the default stream must not see that write (review finding B1);
- control: the same without empty_cache;
- record_stream: a tensor made on the default stream and used on a side stream, freed with
  Tensor.record_stream: the next tensor must not see the side stream's late write.
Skips (exit 0, with the reason) without torch or a GPU.
"""

import os
import sys

os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")

try:
    import torch
except ImportError as e:  # pragma: no cover - the GPU machine has torch
    print(f"skipped: no torch ({e})")
    sys.exit(0)
if not torch.cuda.is_available():
    print("skipped: no GPU")
    sys.exit(0)

import devrt.torch  # noqa: E402

devrt.torch.install()

N = 16 << 20  # floats
SPIN = 1_500_000_000  # cycles: about a second on an H200


def empty_cache_case(with_empty_cache: bool) -> tuple:
    anchor = torch.empty(1024, device="cuda")  # the default (legacy) stream is in use first
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.empty(N, device="cuda")
        torch.cuda._sleep(SPIN)
        x.fill_(1.0)
        ptr = x.data_ptr()
        del x
    if with_empty_cache:
        torch.cuda.empty_cache()
    y = torch.empty(N, device="cuda")
    y.fill_(2.0)
    torch.cuda.synchronize()
    wrong = int((y != 2).sum())
    same = y.data_ptr() == ptr
    del y, anchor
    return same, wrong


def record_stream_case() -> tuple:
    side = torch.cuda.Stream()
    x = torch.zeros(N, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN)
        x.fill_(3.0)
    x.record_stream(side)
    ptr = x.data_ptr()
    del x
    y = torch.empty(N, device="cuda")
    y.fill_(4.0)
    torch.cuda.synchronize()
    wrong = int((y != 4).sum())
    return y.data_ptr() == ptr, wrong


def main() -> int:
    failed = 0
    for name, run in (("empty_cache", lambda: empty_cache_case(True)), ("control", lambda: empty_cache_case(False)),
                      ("record_stream", record_stream_case)):
        same, wrong = run()
        print(f"[ t1 ] {name}: same address {same}; wrong elements {wrong} of {N}")
        failed += wrong != 0
    stats = devrt.torch.memory_stats()
    print(f"[ t1 ] devrt: {stats.get('num_alloc_retries', 0)} alloc retries, "
          f"{stats.get('reserved_bytes.all.current', 0)} bytes reserved")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

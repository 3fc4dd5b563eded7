"""devrt as PyTorch's CUDA allocator.

    import devrt.torch
    devrt.torch.install()            # before the first CUDA tensor
    x = torch.empty(1 << 20, device="cuda")
    print(devrt.torch.memory_stats()["reserved_bytes.all.current"])

``install`` swaps PyTorch's caching allocator for devrt through
``torch.cuda.memory.CUDAPluggableAllocator`` (``devrt_torch_malloc``/``devrt_torch_free`` of
libdevrt_c.so), routes ``Tensor.record_stream`` to ``devrt_torch_record_stream`` and
``torch.cuda.empty_cache`` to devrt. PyTorch's own statistics functions do not work with a
pluggable allocator; use ``memory_stats``, ``reset_peak_memory_stats`` and ``empty_cache`` here.

Out of memory: PyTorch's pluggable allocator does not check the pointer its malloc function
returns (with PyTorch 2.11 a NULL becomes a tensor whose data_ptr() is 0, and the fault comes
later, far from its cause), and its only error channel is a C++ exception, which PyTorch turns into
a ``RuntimeError`` (pytorch/pytorch#133280) with the exception's message as is. So
``devrt_torch_malloc`` throws, and the user gets devrt's message ("devrt_torch_malloc: 4294967296
bytes on cuda:0: out of device memory: the device refused ..."). ``torch.OutOfMemoryError`` itself
can only come from C++ code linked against c10, which this pure-Python package is not. So: wrap
the code that may run out of memory in ``with devrt.torch.oom_errors():`` to get a
``torch.OutOfMemoryError`` with devrt's message (sizes included), or catch ``RuntimeError`` and call
``is_out_of_memory(e)``.
"""

from __future__ import annotations

import contextlib
import ctypes
import warnings
from typing import Dict, Optional

import devrt as _devrt

_installed = None  # the CUDAPluggableAllocator: PyTorch keeps only a raw pointer to its functions

_OOM_MARKER = "devrt_torch_malloc:"


def _torch():
    try:
        import torch  # noqa: PLC0415 (imported late: devrt does not need torch to load)
    except ImportError as e:
        raise ImportError("devrt.torch needs PyTorch (import torch failed: %s)" % e) from e
    return torch


def install() -> None:
    """Makes devrt PyTorch's CUDA allocator. Call it before the first CUDA allocation: PyTorch's
    allocator cannot be swapped once it has handed out memory. Raises RuntimeError if it is too
    late, with what PyTorch holds already."""
    global _installed
    torch = _torch()
    if _installed is not None:
        return
    if torch.cuda.is_initialized():
        held = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
        raise RuntimeError(
            "devrt.torch.install() came too late: CUDA is initialised in this process already "
            f"(PyTorch's allocator holds {held} bytes on the current device), and PyTorch cannot swap its "
            "allocator then. Call devrt.torch.install() first, right after `import torch`.")
    path = _devrt.library_path()
    lib = _devrt.lib()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "devrt_torch_malloc", "devrt_torch_free")
    inner = allocator.allocator()
    record = getattr(inner, "set_record_stream_fn", None)
    if record is not None:
        record(ctypes.cast(lib.devrt_torch_record_stream, ctypes.c_void_p).value)
    else:
        warnings.warn(
            "devrt.torch.install(): this PyTorch cannot route Tensor.record_stream to a pluggable allocator "
            "(no set_record_stream_fn): memory a side stream uses may be reused before that stream is done. "
            "Synchronize the side streams before freeing their tensors, or use a PyTorch that has it.",
            RuntimeWarning, stacklevel=2)
    reset = getattr(inner, "set_reset_fn", None)
    if reset is not None:
        reset(ctypes.cast(lib.devrt_torch_empty_cache, ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(allocator)
    _installed = allocator


def installed() -> bool:
    return _installed is not None


def is_out_of_memory(error: BaseException) -> bool:
    """Whether an exception PyTorch raised is devrt's out-of-memory (or refused-size) failure."""
    return _OOM_MARKER in str(error)


@contextlib.contextmanager
def oom_errors():
    """Turns devrt's allocation failures inside the block into ``torch.OutOfMemoryError`` (see the
    module's docstring for why PyTorch alone raises RuntimeError)."""
    torch = _torch()
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if not is_out_of_memory(e) or isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
        raise oom(str(e)) from e


def _device(device) -> int:
    torch = _torch()
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, torch.device):
        return device.index if device.index is not None else torch.cuda.current_device()
    if isinstance(device, str):
        return _device(torch.device(device))
    return int(device)


def memory_stats(device=None) -> Dict[str, int]:
    """The keys of ``torch.cuda.memory_stats()`` that devrt's statistics answer. Bytes "allocated"
    are the sizes requested (devrt does not round them up to blocks as PyTorch does); "reserved"
    is what devrt holds from the driver; ``num_alloc_retries`` counts the cleanups devrt ran after
    an out-of-memory before its one retry."""
    s = _devrt.stats(_device(device))
    return {
        "allocated_bytes.all.current": s["in_use_bytes"],
        "allocated_bytes.all.peak": s["peak_in_use_bytes"],
        "requested_bytes.all.current": s["in_use_bytes"],
        "requested_bytes.all.peak": s["peak_in_use_bytes"],
        "active_bytes.all.current": s["in_use_bytes"],
        "active_bytes.all.peak": s["peak_in_use_bytes"],
        "reserved_bytes.all.current": s["reserved_bytes"],
        "reserved_bytes.all.peak": s["peak_reserved_bytes"],
        "allocation.all.current": s["live_allocations"],
        "allocation.all.allocated": s["allocations"],
        "allocation.all.freed": s["frees"],
        "active.all.current": s["live_allocations"],
        "active.all.allocated": s["allocations"],
        "active.all.freed": s["frees"],
        "num_ooms": s["out_of_memory_errors"],
        "num_alloc_retries": s["reclaims"],
        "num_device_alloc": s["driver_allocs"],
        "num_device_free": s["driver_frees"],
    }


def memory_allocated(device=None) -> int:
    return _devrt.stats(_device(device))["in_use_bytes"]


def memory_reserved(device=None) -> int:
    return _devrt.stats(_device(device))["reserved_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    _devrt.reset_peak_stats(_device(device))


def empty_cache(device: Optional[int] = None) -> None:
    """Returns devrt's unused memory to the driver: on ``device``, or on every CUDA device."""
    if device is not None:
        _devrt.empty_cache(_device(device))
        return
    for d in range(_devrt.device_count()):
        _devrt.empty_cache(d)


def record_memory_history(enabled: bool = True, max_entries: int = 100000) -> None:
    """As ``torch.cuda.memory._record_memory_history``, for the memory devrt serves (no stack
    frames: devrt records addresses, sizes, streams and times)."""
    _devrt.record_memory_history(enabled, max_entries)


def memory_snapshot() -> dict:
    """What ``torch.cuda.memory._snapshot()`` gives, for the memory devrt serves on every CUDA
    device it uses: open it with ``torch.cuda._memory_viz`` (see ``dump_snapshot``)."""
    return _devrt.merge_snapshots([_devrt.memory_snapshot(d) for d in range(_devrt.device_count())])


def dump_snapshot(path: str) -> None:
    """Writes ``memory_snapshot()`` to ``path`` as a pickle, as
    ``torch.cuda.memory._dump_snapshot``: ``python -m torch.cuda._memory_viz trace_plot path -o
    out.html``."""
    import pickle

    with open(path, "wb") as f:
        pickle.dump(memory_snapshot(), f)

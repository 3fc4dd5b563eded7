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

Sleep and wake (as vLLM's sleep mode): allocate under tags, then give their memory back to the
GPU while every tensor keeps its address (CUDA graphs captured over them stay valid)::

    devrt.torch.install()
    with devrt.torch.tag("weights"):
        model = build_model().cuda()
    with devrt.torch.tag("kv_cache"):
        cache = torch.empty(..., device="cuda")
    devrt.torch.sleep(("weights", "kv_cache"), keep=("weights",))  # vLLM's level 1; keep=() level 2
    ...                                                             # the GPU memory is free
    devrt.torch.wake_up()                                           # weights back, the cache to refill

Without ``install()`` (PyTorch's own allocator, CUDA initialised already), ``use_mem_pool(tag)``
serves the block's allocations from a ``torch.cuda.MemPool`` whose memory devrt provides under
that tag; ``sleep`` and ``wake_up`` work the same on it.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import warnings
from typing import Dict, Iterable, Optional, Union

import devrt as _devrt

_installed = None  # the CUDAPluggableAllocator: PyTorch keeps only a raw pointer to its functions

_OOM_MARKER = "devrt_torch_malloc:"

_state_lock = threading.Lock()
_pool_allocator = None  # the CUDAPluggableAllocator the MemPools take memory from (kept alive)
_pools: Dict[str, object] = {}  # tag -> torch.cuda.MemPool
_asleep: Dict[int, Dict[str, bool]] = {}  # device -> {tag: contents kept}, what sleep() put to sleep


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


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """As ``torch.cuda.set_per_process_memory_fraction``, for the memory devrt serves: devrt may
    hold at most ``fraction`` (0 to 1) of the GPU's memory on ``device`` (None: the current one);
    allocations past it raise the out-of-memory ``RuntimeError`` (see ``oom_errors``)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"set_per_process_memory_fraction: fraction is between 0 and 1, not {fraction!r}")
    torch = _torch()
    d = _device(device)
    total = torch.cuda.get_device_properties(d).total_memory
    _devrt.set_memory_limit(d, int(total * fraction) if fraction < 1 else 0)


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


# ---- Tags, sleep and wake ----

tag = _devrt.tag  # with devrt.torch.tag("weights"): the CUDA tensors made in the block carry the tag
set_tag = _devrt.set_tag
get_tag = _devrt.get_tag


def _tag_list(tags, what: str) -> list:
    if isinstance(tags, (str, bytes, bytearray)):
        tags = [tags]
    if tags is None:
        raise TypeError(f"devrt.torch.{what}: name the tags (a str, or a list or tuple of them)")
    out = []
    for t in tags:
        if isinstance(t, (bytes, bytearray)):
            t = bytes(t).decode("ascii", errors="replace")
        if not isinstance(t, str):
            raise TypeError(f"devrt.torch.{what}: a tag is a str, not {type(t).__name__} ({t!r})")
        if t not in out:
            out.append(t)
    return out


@contextlib.contextmanager
def _untagged():
    previous = _devrt.get_tag()
    if previous is None:
        yield
        return
    _devrt.set_tag(None)
    try:
        yield
    finally:
        _devrt.set_tag(previous)


@contextlib.contextmanager
def _current_stream_known(torch, device: int):
    """Keeps a 1-byte untagged allocation of devrt's live on PyTorch's current stream for the
    block: devrt then counts that stream among the device's streams, so a sleep inside the block
    follows (in stream order) the work PyTorch queued there, even where devrt had not seen the
    stream before (a pool's memory taken on another stream, a stream made since)."""
    stream = torch.cuda.current_stream(device).cuda_stream
    with _untagged():
        ptr = _devrt.malloc(1, device, stream)
    try:
        yield
    finally:
        _devrt.free(ptr, device, stream)


def sleep(tags: Union[str, Iterable[str]], keep: Union[bool, str, Iterable[str]] = (), device=None) -> None:
    """Puts the GPU memory of ``tags`` to sleep on ``device`` (None: the current CUDA device): its
    physical memory goes back to the GPU (``torch.cuda.mem_get_info`` shows it free) while every
    tensor keeps its address. ``keep`` names the tags whose contents are kept (copied to pinned
    host memory and restored by ``wake_up``): True for all, () for none; the others come back with
    whatever the memory holds, to be written again before they are read (a KV cache to refill,
    weights to load). vLLM's level 1 is ``sleep(("weights", "kv_cache"), keep=("weights",))``,
    level 2 ``keep=()``.

    No ``torch.cuda.synchronize()`` is needed: devrt copies and unmaps in stream order after the
    work queued on the device's streams that it knows, which are the streams memory was allocated
    or freed on through devrt, and PyTorch's current stream (made known here). Kernels PyTorch
    queued on other streams devrt has never seen (no allocation on them) and that still use the
    tagged memory must be synchronized by the caller first (``stream.synchronize()``).

    Until ``wake_up``: no kernel may touch the sleeping tensors (an illegal address), and nothing
    may be allocated under a sleeping tag (devrt refuses with DEVRT_ERROR_ASLEEP; with
    ``use_mem_pool`` the block refuses to start, as PyTorch could hand out memory its pool caches).
    Freeing sleeping tensors is fine. A tag not used on the device, or asleep already: nothing
    happens. Raises ``devrt.DevrtError`` with devrt's message."""
    torch = _torch()
    names = _tag_list(tags, "sleep")
    if keep is True:
        kept = set(names)
    elif keep is False or keep is None:
        kept = set()
    else:
        kept = set(_tag_list(keep, "sleep"))
        extra = sorted(kept - set(names))
        if extra:
            raise ValueError(f"devrt.torch.sleep: keep names tags that are not slept: {extra} (tags: {names})")
    d = _device(device)
    with torch.cuda.device(d), _current_stream_known(torch, d):
        for t in names:
            _devrt.sleep(t, d, keep=t in kept)
            with _state_lock:
                _asleep.setdefault(d, {}).setdefault(t, t in kept)


def wake_up(tags: Union[None, str, Iterable[str]] = None, device=None) -> None:
    """Wakes ``tags`` on ``device`` (None: the current CUDA device): memory is mapped at the same
    addresses and the kept contents restored before it returns. ``tags`` None: every tag
    ``sleep`` put to sleep there. Tags slept without their contents hold garbage: write them
    before reading. Out of memory (``devrt.DevrtOutOfMemoryError``): that tag stays asleep with its
    kept copy; free memory and call again."""
    torch = _torch()
    d = _device(device)
    with _state_lock:
        known = list(_asleep.get(d, {}))
    names = known if tags is None else _tag_list(tags, "wake_up")
    with torch.cuda.device(d):
        for t in names:
            _devrt.wake(t, d)
            with _state_lock:
                _asleep.get(d, {}).pop(t, None)


def sleeping(device=None) -> Dict[str, bool]:
    """The tags ``sleep`` put to sleep on ``device`` and not woken since, each with whether its
    contents were kept."""
    d = _device(device)
    with _state_lock:
        return dict(_asleep.get(d, {}))


def mem_pool():
    """A new ``torch.cuda.MemPool`` whose segments devrt allocates (``devrt_torch_malloc`` and
    ``devrt_torch_free`` through ``torch.cuda.memory.CUDAPluggableAllocator``), with PyTorch's
    caching allocator in charge of the blocks inside them. For a process that did not call
    ``install()``: it works after CUDA is initialised. Segments take the tag of the thread that
    asks for them (``use_mem_pool(tag)`` sets both). Under ``install()`` PyTorch's allocator is
    devrt already and has no MemPools: use ``tag`` (or ``use_mem_pool``, which then tags only)."""
    global _pool_allocator
    torch = _torch()
    if _installed is not None:
        raise RuntimeError(
            "devrt.torch.mem_pool(): devrt.torch.install() made devrt PyTorch's allocator, which has no "
            "MemPools; every CUDA tensor comes from devrt already: allocate under devrt.torch.tag(name)")
    with _state_lock:
        if _pool_allocator is None:
            _devrt.lib()  # loads the library (and says where it looked if it is missing)
            _pool_allocator = torch.cuda.memory.CUDAPluggableAllocator(
                _devrt.library_path(), "devrt_torch_malloc", "devrt_torch_free")
        allocator = _pool_allocator
    return torch.cuda.MemPool(allocator.allocator())


def pool(name: str):
    """The ``torch.cuda.MemPool`` of tag ``name`` (made on first use; one per tag, so that tags never
    share a segment)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"devrt.torch.pool: a tag is a non-empty str, not {name!r}")
    with _devrt.tag(name):  # devrt checks the name (printable ASCII, at most 63 bytes)
        pass
    with _state_lock:
        p = _pools.get(name)
    if p is None:
        p = mem_pool()
        with _state_lock:
            p = _pools.setdefault(name, p)
    return p


@contextlib.contextmanager
def use_mem_pool(name: str, device=None):
    """Inside the block, this thread's CUDA allocations come from the MemPool of tag ``name``
    (``torch.cuda.use_mem_pool(pool(name))``) and the segments devrt gives that pool carry the tag
    (``tag(name)``), so ``sleep(name)`` frees them. Under ``install()`` it is ``tag(name)`` alone.
    Refused (``devrt.DevrtError``, DEVRT_ERROR_ASLEEP) while ``sleep`` has the tag asleep on the
    device: PyTorch could hand out a block its pool caches in the sleeping memory."""
    torch = _torch()
    d = _device(device)
    with _state_lock:
        asleep = name in _asleep.get(d, {})
    if asleep:
        raise _devrt.DevrtError(
            _devrt.ERROR_ASLEEP, "DEVRT_ERROR_ASLEEP",
            f"devrt.torch.use_mem_pool: tag '{name}' is asleep on cuda:{d}; devrt.torch.wake_up('{name}') first")
    if _installed is not None:
        with _devrt.tag(name):
            yield None
        return
    p = pool(name)
    with torch.cuda.use_mem_pool(p, device=d), _devrt.tag(name):
        yield p

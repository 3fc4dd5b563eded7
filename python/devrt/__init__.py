"""devrt from Python: a thin ctypes layer over libdevrt_c.so (devrt/c_api.h).

    import devrt
    devrt.init(use_cuda=False)                # optional: the first call starts devrt with defaults
    ptr = devrt.malloc(1 << 20, device=devrt.HOST)
    devrt.free(ptr, device=devrt.HOST)
    print(devrt.stats(devrt.HOST)["in_use_bytes"])

Devices: -1 (``HOST``) is the host, 0..N-1 the CUDA devices (CUDA's numbering). Streams are
``cudaStream_t`` values as integers, as in CUDA, PyTorch and CuPy: ``None`` or 0 (like
``STREAM_LEGACY``, 1) is CUDA's legacy default stream, ``STREAM_PER_THREAD`` (2) the per-thread
default stream, ``STREAM_DEVICE`` (3) the device's own stream (devrt's). A stream may be destroyed
right after the memory used on it is freed, with its work still queued. Errors raise
``DevrtError`` (``DevrtOutOfMemoryError`` for out of memory) with devrt's message.

Tags, sleep and wake: allocations made under a tag (``with devrt.tag("weights"):``, or
``set_tag``) get an address range of their own per device, so the tag's memory can sleep:
``devrt.sleep("weights", device)`` gives its physical memory back to the device (copying the live
allocations to host memory first unless ``keep=False``) while every pointer stays valid, and
``devrt.wake("weights", device)`` maps memory at the same addresses again and restores what was
kept. Allocating under a sleeping tag raises ``DevrtError`` with status ``ERROR_ASLEEP``.

PyTorch and CuPy: ``devrt.torch.install()`` and ``devrt.cupy.install()``.
"""

from __future__ import annotations

import contextlib
import ctypes
import operator
import os
import threading
from pathlib import Path
from typing import Dict, Iterable, Optional, Union

__all__ = [
    "HOST", "STREAM_LEGACY", "STREAM_PER_THREAD", "STREAM_DEVICE", "DevrtError", "DevrtOutOfMemoryError", "lib", "library_path",
    "init", "shutdown", "is_initialized", "device_count", "malloc", "free", "record_stream", "retire_stream",
    "allocation_size",
    "stats", "reset_peak_stats", "empty_cache", "configure", "last_error", "set_memory_limit", "get_memory_limit",
    "record_memory_history", "memory_snapshot", "merge_snapshots", "metrics_text",
    "set_tag", "get_tag", "tag", "sleep", "wake", "release_host_copies", "MAX_TAG_LENGTH",
]

HOST = -1
MAX_ALLOCATION_SIZE = 1 << 62  # DEVRT_MAX_ALLOCATION_SIZE: larger sizes are SIZE_TOO_LARGE
STREAM_LEGACY = 1
STREAM_PER_THREAD = 2
STREAM_DEVICE = 3

LIBRARY_NAME = "libdevrt_c.so"
_C_API_VERSION = 1

# Status codes of devrt/c_api.h.
SUCCESS = 0
ERROR_OUT_OF_MEMORY = 1
ERROR_INVALID_VALUE = 2
ERROR_UNKNOWN_POINTER = 3
ERROR_INVALID_DEVICE = 4
ERROR_DOUBLE_FREE = 5
ERROR_SIZE_TOO_LARGE = 6
ERROR_NO_POOL = 7
ERROR_INVALID_LAYOUT = 8
ERROR_BUSY = 9
ERROR_NOT_INITIALIZED = 10
ERROR_ALREADY_INITIALIZED = 11
ERROR_DEVICE = 12
ERROR_INTERNAL = 13
ERROR_ASLEEP = 14
ERROR_UNSUPPORTED = 15

# The version of devrt_stats read (devrt_get_stats_v): 2 has the sleep and wake fields, 3 the
# pinned host memory kept for later sleeps, 4 the peak of memory in use and busy on streams.
_STATS_VERSION = 4
# Longest tag, in bytes (printable ASCII only).
MAX_TAG_LENGTH = 63


class DevrtError(RuntimeError):
    """A failed devrt call: ``status`` is the code of devrt/c_api.h, ``name`` its name, the message
    devrt's (what was wrong, with the values)."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.status = status
        self.name = name
        self.message = message


class DevrtOutOfMemoryError(DevrtError, MemoryError):
    """The device refused an allocation (free memory, ``empty_cache()``, and retry)."""


class _Options(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int),
        ("use_cuda", ctypes.c_int),
        ("host_layout", ctypes.c_char_p),
        ("cuda_layout", ctypes.c_char_p),
        ("log_level", ctypes.c_char_p),
        ("host_capacity", ctypes.c_uint64),
        ("use_environment", ctypes.c_int),
    ]


_STAT_FIELDS = [
    "reserved_bytes", "peak_reserved_bytes", "in_use_bytes", "peak_in_use_bytes", "live_allocations",
    "allocations", "frees", "failed_allocations", "out_of_memory_errors", "driver_allocs", "driver_frees",
    "maps", "unmaps", "device_refusals", "cleanups", "reclaims", "stream_waits", "fences", "streams",
    # version 2: sleep and wake
    "sleeping_bytes", "offloaded_bytes", "sleeps", "wakes",
    # version 3: pinned host memory kept after a wake for the next sleep's copy
    "host_cached_bytes",
    # version 4: the floor stream order sets
    "peak_busy_bytes",
]


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in _STAT_FIELDS]


_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_lock = threading.Lock()


def _candidates():
    env = os.environ.get("DEVRT_LIBRARY")
    if env:
        yield Path(env)
        return  # named explicitly: nothing else is tried
    here = Path(__file__).resolve().parent
    yield here / LIBRARY_NAME
    # The repository's build trees, only when this is python/devrt of a source tree: an installed
    # copy uses its own library and nothing else.
    repo = here.parent.parent
    if here.parent.name != "python" or not (repo / "runtime" / "include" / "devrt" / "c_api.h").is_file():
        return
    for build in ("release", "debug"):
        yield repo / "build" / build / "runtime" / LIBRARY_NAME
        yield repo / "build" / build / LIBRARY_NAME


def library_path() -> str:
    """The path of libdevrt_c.so: ``$DEVRT_LIBRARY``, else next to this package (where pip installs
    it), else, in a source tree only, the repository's build/release, then build/debug. Raises
    FileNotFoundError naming what was tried."""
    tried = []
    for c in _candidates():
        if c.is_file():
            return str(c)
        tried.append(str(c))
    raise FileNotFoundError(
        "devrt: libdevrt_c.so not found; tried " + ", ".join(tried)
        + ". Build it (cmake --build build/release --target devrt_c) or set DEVRT_LIBRARY to its path.")


def lib() -> ctypes.CDLL:
    """The loaded libdevrt_c.so (loaded on first use, with its function prototypes)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            l = ctypes.CDLL(path)
            vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
            for name, res, args in [
                ("devrt_options_default", None, [ctypes.POINTER(_Options)]),
                ("devrt_init", i, [ctypes.POINTER(_Options)]),
                ("devrt_shutdown", i, []),
                ("devrt_is_initialized", i, []),
                ("devrt_last_error", ctypes.c_char_p, []),
                ("devrt_status_name", ctypes.c_char_p, [i]),
                ("devrt_device_count", i, [ctypes.POINTER(i)]),
                ("devrt_malloc", i, [ctypes.POINTER(vp), sz, i, vp]),
                ("devrt_free", i, [vp, i, vp]),
                ("devrt_record_stream", i, [vp, vp]),
                ("devrt_retire_stream", i, [i, vp]),
                ("devrt_allocation_size", i, [vp, ctypes.POINTER(sz)]),
                ("devrt_get_stats", i, [i, ctypes.POINTER(_Stats)]),
                ("devrt_get_stats_v", i, [i, ctypes.POINTER(_Stats), i]),
                ("devrt_set_tag", i, [ctypes.c_char_p]),
                ("devrt_get_tag", ctypes.c_char_p, []),
                ("devrt_sleep", i, [i, ctypes.c_char_p, i]),
                ("devrt_wake", i, [i, ctypes.c_char_p]),
                ("devrt_release_host_copies", i, [i, ctypes.POINTER(ctypes.c_uint64)]),
                ("devrt_set_memory_limit", i, [i, ctypes.c_uint64]),
                ("devrt_get_memory_limit", i, [i, ctypes.POINTER(ctypes.c_uint64)]),
                ("devrt_reset_peak_stats", i, [i]),
                ("devrt_empty_cache", i, [i]),
                ("devrt_configure", i, [i, ctypes.c_char_p]),
                ("devrt_record_memory_history", i, [i, sz]),
                ("devrt_memory_snapshot", i, [i, i, vp, sz, ctypes.POINTER(sz)]),
                ("devrt_metrics_text", i, [vp, sz, ctypes.POINTER(sz)]),
            ]:
                f = getattr(l, name)
                f.restype = res
                f.argtypes = args
            _lib_path = path
            _lib = l
    return _lib


def _check(status: int) -> None:
    if status == SUCCESS:
        return
    l = lib()
    name = l.devrt_status_name(status).decode()
    message = l.devrt_last_error().decode(errors="replace")
    cls = DevrtOutOfMemoryError if status == ERROR_OUT_OF_MEMORY else DevrtError
    raise cls(status, name, message)


def _stream(stream) -> Optional[int]:
    # 0 and None are both NULL for ctypes: CUDA's legacy default stream.
    return None if stream in (None, 0) else int(stream)


def last_error() -> str:
    """This thread's message of its last failed devrt call."""
    return lib().devrt_last_error().decode(errors="replace")


_U64_MAX = (1 << 64) - 1


def _int_arg(value, what: str, name: str) -> int:
    """An integer argument, checked before ctypes converts it (ctypes wraps values past its type's
    range instead of refusing them)."""
    if isinstance(value, bool):
        raise TypeError(f"{what}: {name} is an int, not bool ({value!r})")
    try:
        return operator.index(value)  # int, numpy integers, anything with __index__
    except TypeError:
        raise TypeError(f"{what}: {name} is an int, not {type(value).__name__} ({value!r})") from None


def _u64_arg(value, what: str, name: str) -> int:
    value = _int_arg(value, what, name)
    if value < 0 or value > _U64_MAX:
        raise ValueError(f"{what}: {name} is a number of bytes from 0 to 2**64 - 1, not {value}")
    return value


def _text_arg(value, what: str, name: str) -> Optional[bytes]:
    """A str argument (None passes as NULL)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what}: {name} is a str, not {type(value).__name__} ({value!r})")
    if "\0" in value:
        raise ValueError(f"{what}: {name} holds a NUL character, which would cut it short: {value!r}")
    return value.encode()


def init(use_cuda: bool = True, host_layout: Optional[str] = None, cuda_layout: Optional[str] = None,
         log_level: Optional[str] = None, host_capacity: int = 0, use_environment: bool = True) -> None:
    """Starts devrt (before any other call; the first call otherwise starts it with the defaults).
    Layouts are layout strings ("auto", "arena", "sliced:page=64MiB,slice=8MiB", ...)."""
    l = lib()
    o = _Options()
    l.devrt_options_default(ctypes.byref(o))
    o.version = _C_API_VERSION
    o.use_cuda = 1 if use_cuda else 0
    o.host_layout = _text_arg(host_layout, "init", "host_layout")
    o.cuda_layout = _text_arg(cuda_layout, "init", "cuda_layout")
    o.log_level = _text_arg(log_level, "init", "log_level")
    o.host_capacity = _u64_arg(host_capacity, "init", "host_capacity")
    o.use_environment = 1 if use_environment else 0
    _check(l.devrt_init(ctypes.byref(o)))


def shutdown() -> None:
    """Frees every live allocation and stops devrt (``init`` starts it again)."""
    _check(lib().devrt_shutdown())


def is_initialized() -> bool:
    return bool(lib().devrt_is_initialized())


def device_count() -> int:
    """Number of CUDA devices devrt uses."""
    n = ctypes.c_int(0)
    _check(lib().devrt_device_count(ctypes.byref(n)))
    return n.value


def malloc(size: int, device: int = HOST, stream=None) -> int:
    """Allocates ``size`` bytes on ``device`` for use on ``stream``; returns the address."""
    size = _int_arg(size, "malloc", "size")
    if size < 0:
        raise DevrtError(ERROR_SIZE_TOO_LARGE, "DEVRT_ERROR_SIZE_TOO_LARGE", f"malloc: negative size {size}")
    if size > MAX_ALLOCATION_SIZE:
        raise DevrtError(ERROR_SIZE_TOO_LARGE, "DEVRT_ERROR_SIZE_TOO_LARGE",
                         f"malloc: size {size} is larger than devrt allocates ({MAX_ALLOCATION_SIZE} bytes, 2**62)")
    p = ctypes.c_void_p()
    _check(lib().devrt_malloc(ctypes.byref(p), size, device, _stream(stream)))
    return p.value or 0


def free(ptr: int, device: int = HOST, stream=None) -> None:
    """Frees ``ptr`` in stream order on ``stream``."""
    _check(lib().devrt_free(ptr, device, _stream(stream)))


def record_stream(ptr: int, stream) -> None:
    """Marks ``ptr``'s memory as used on ``stream`` too (see ``Tensor.record_stream``); ``stream`` may be
    another GPU's. Raises ``DevrtError`` when devrt cannot track the stream (not a live stream)."""
    _check(lib().devrt_record_stream(ptr, _stream(stream)))


def retire_stream(stream, device: int) -> None:
    """Optional: ``stream`` is about to be destroyed (see ``devrt_retire_stream``). Frees are fenced
    when they happen, so streams may be destroyed without it."""
    _check(lib().devrt_retire_stream(device, _stream(stream)))


def allocation_size(ptr: int) -> int:
    n = ctypes.c_size_t(0)
    _check(lib().devrt_allocation_size(ptr, ctypes.byref(n)))
    return n.value


def stats(device: int = HOST) -> Dict[str, int]:
    """The statistics of a device (the fields of devrt_stats in devrt/c_api.h, version 4):
    ``reserved_bytes``, ``in_use_bytes``, ..., and for sleep and wake ``sleeping_bytes`` (memory
    unmapped by ``sleep``), ``offloaded_bytes`` (host memory holding what ``sleep`` kept),
    ``sleeps`` and ``wakes`` (the calls that put a tag to sleep and woke one), and
    ``host_cached_bytes`` (pinned host memory kept after a wake for the next sleep's copy;
    ``release_host_copies`` frees it), and ``peak_busy_bytes`` (the peak of memory in use plus
    memory freed on streams whose queued work may still use it: ``peak_in_use_bytes`` over it
    bounds the memory efficiency of any allocator that waits for its streams; 0 on the host)."""
    s = _Stats()
    _check(lib().devrt_get_stats_v(device, ctypes.byref(s), _STATS_VERSION))
    return {name: int(getattr(s, name)) for name in _STAT_FIELDS}


def reset_peak_stats(device: int = HOST) -> None:
    _check(lib().devrt_reset_peak_stats(device))


def empty_cache(device: int = HOST) -> None:
    """Returns the device's unused memory to the driver."""
    _check(lib().devrt_empty_cache(device))


def set_memory_limit(device: int, limit: int) -> None:
    """The most ``device`` may hold for devrt, in bytes (0: no limit but the device's own), as
    ``torch.cuda.set_per_process_memory_fraction`` and cudaMallocAsync's release threshold:
    allocations past it raise ``DevrtOutOfMemoryError``; below what the device holds, its free
    memory goes back at once. At start, ``DEVRT_MEMORY_LIMIT`` (40GiB, 0.8, 80%) sets it on every
    device. ``devrt.torch.set_per_process_memory_fraction`` takes a share of a GPU."""
    try:
        limit = _u64_arg(limit, "set_memory_limit", "the limit")
    except TypeError as e:
        raise ValueError(str(e)) from None
    _check(lib().devrt_set_memory_limit(int(device), limit))


def get_memory_limit(device: int = HOST) -> int:
    """The device's memory limit in bytes (0: none)."""
    n = ctypes.c_uint64(0)
    _check(lib().devrt_get_memory_limit(int(device), ctypes.byref(n)))
    return int(n.value)


def configure(device: int, layout: str) -> None:
    """Replaces the device's pool layout; a bad layout, or live memory, keeps the current one."""
    if layout is None:
        raise TypeError("configure: layout is a str (a layout string such as \"auto\"), not None")
    _check(lib().devrt_configure(device, _text_arg(layout, "configure", "layout")))


def _text(call, what: str) -> bytes:
    """Calls a devrt function that answers through a buffer (see c_api.h): asks for the length,
    then reads with some room, again if the answer grew in between."""
    n = ctypes.c_size_t(0)
    _check(call(None, 0, ctypes.byref(n)))
    room = n.value + 4096
    for _ in range(8):
        buf = ctypes.create_string_buffer(room)
        status = call(buf, room, ctypes.byref(n))
        if status == SUCCESS:
            return buf.raw[:n.value]
        if n.value + 1 <= room:
            _check(status)
        room = n.value * 2 + 4096
    raise DevrtError(ERROR_INTERNAL, "DEVRT_ERROR_INTERNAL", f"{what}: the answer kept growing")


def record_memory_history(enabled: bool = True, max_entries: int = 100000) -> None:
    """Starts (or stops) recording every device's trace of memory events for ``memory_snapshot``:
    allocations, frees, memory taken from and given back to the device, out-of-memory errors. At
    most ``max_entries`` per device are kept, the oldest dropped first; starting anew clears them.
    As ``torch.cuda.memory._record_memory_history`` (without stack frames)."""
    if max_entries <= 0:
        raise DevrtError(ERROR_INVALID_VALUE, "DEVRT_ERROR_INVALID_VALUE",
                         f"record_memory_history: max_entries is {max_entries}; it must be positive")
    _check(lib().devrt_record_memory_history(1 if enabled else 0, int(max_entries)))


def _snapshot_of(device: int) -> dict:
    import pickle

    l = lib()
    raw = _text(lambda buf, size, n: l.devrt_memory_snapshot(device, 0, buf, size, n), "memory_snapshot")
    return pickle.loads(raw)  # devrt's own output: PyTorch's snapshot format


def merge_snapshots(snapshots) -> dict:
    """One snapshot of several devices' (each from ``memory_snapshot(device)``): the segments
    together, each device's trace at its index (CUDA devices at theirs, the host after them)."""
    out = {"segments": [], "device_traces": [], "allocator_settings": {"allocator": "devrt"}, "devrt_devices": []}
    cuda = []
    other = []
    for s in snapshots:
        (cuda if s["devrt_devices"] and s["devrt_devices"][-1].startswith("cuda:") else other).append(s)
    slots = {}
    for s in cuda:
        slots[len(s["device_traces"]) - 1] = s
    n = max(slots) + 1 if slots else 0
    order = [slots.get(i) for i in range(n)] + other
    for i, s in enumerate(order):
        if s is None:
            out["device_traces"].append([])
            out["devrt_devices"].append("")
            continue
        for seg in s["segments"]:
            seg = dict(seg)
            seg["device"] = i
            out["segments"].append(seg)
        out["device_traces"].append(s["device_traces"][-1] if s["device_traces"] else [])
        out["devrt_devices"].append(s["devrt_devices"][-1])
    return out


def memory_snapshot(device: Optional[int] = None) -> dict:
    """A snapshot in the format of ``torch.cuda.memory._snapshot()``: ``segments`` (memory held from
    the device, each with its ``blocks``: address, size, requested_size, state, stream) and
    ``device_traces`` (what ``record_memory_history`` recorded). ``device``: HOST or a CUDA index;
    None: the host and every CUDA device devrt uses (``device_count()``). ``pickle.dump`` it to a file for
    ``python -m torch.cuda._memory_viz``."""
    if device is not None:
        return _snapshot_of(int(device))
    devices = [HOST] + list(range(device_count()))
    return merge_snapshots([_snapshot_of(d) for d in devices])


def metrics_text() -> str:
    """Every started device's gauges and counters in the OpenMetrics text format (for a /metrics
    endpoint): devrt_reserved_bytes, devrt_in_use_bytes, their peaks, devrt_maps_total, ...,
    labelled with the device, ending in ``# EOF``."""
    l = lib()
    return _text(lambda buf, size, n: l.devrt_metrics_text(buf, size, n), "metrics_text").decode()


# ---- Tags, sleep and wake ----

TagLike = Union[str, bytes]


def _tag_bytes(name: TagLike, what: str) -> bytes:
    """A tag as the bytes devrt takes; what C cannot see (a NUL, a type that is no string) is refused
    here, the rest (length, printable ASCII) by devrt with its own message."""
    if isinstance(name, str):
        raw = name.encode("utf-8", errors="surrogateescape")
    elif isinstance(name, (bytes, bytearray)):
        raw = bytes(name)
    else:
        raise TypeError(f"{what}: a tag is a str, not {type(name).__name__} ({name!r})")
    if b"\0" in raw:
        raise DevrtError(ERROR_INVALID_VALUE, "DEVRT_ERROR_INVALID_VALUE",
                         f"{what}: the tag {name!r} holds a NUL byte; a tag is printable ASCII, "
                         f"at most {MAX_TAG_LENGTH} bytes")
    return raw


def set_tag(name: Optional[TagLike]) -> None:
    """Sets the calling thread's tag for its later allocations (``malloc``, and PyTorch's through
    ``devrt.torch``); ``None`` or ``""`` clears it. A tag is printable ASCII, at most 63 bytes;
    anything else raises ``DevrtError`` (``ERROR_INVALID_VALUE``) and leaves the tag as it was."""
    if name is None:
        _check(lib().devrt_set_tag(None))
        return
    _check(lib().devrt_set_tag(_tag_bytes(name, "set_tag")))


def get_tag() -> Optional[str]:
    """The calling thread's tag; ``None`` when it has none."""
    raw = lib().devrt_get_tag()
    return None if raw is None else raw.decode("ascii", errors="replace")


@contextlib.contextmanager
def tag(name: Optional[TagLike]):
    """Allocations of this thread inside the block carry ``name`` (``None``: no tag); the tag
    before it is restored on the way out, an exception included. Blocks nest.

        with devrt.tag("weights"):
            p = devrt.malloc(1 << 20, device)
    """
    previous = get_tag()
    set_tag(name)
    try:
        yield
    finally:
        set_tag(previous)


def _tags(tags, what: str) -> list:
    if isinstance(tags, (str, bytes, bytearray)):
        return [tags]
    if tags is None:
        raise TypeError(f"{what}: name the tag (a str, or a list or tuple of them)")
    return list(tags)


def sleep(tags: Union[TagLike, Iterable[TagLike]], device: int = HOST, keep: bool = True) -> None:
    """Puts the memory of ``tags`` (a tag, or a list or tuple of them, each in turn) on ``device``
    to sleep: in stream order after the work queued on the device's streams (the streams devrt has
    seen), copies the live allocations to host memory when ``keep`` is true, then gives the
    physical memory back to the device; addresses stay reserved, pointers valid. Touching the
    memory before ``wake`` is an error of the program (an illegal address on CUDA, a segmentation
    fault on the host). Allocating under a sleeping tag raises ``ERROR_ASLEEP``; freeing is fine.
    A tag never used on the device, or asleep already: nothing happens. Raises ``DevrtError``
    (``ERROR_UNSUPPORTED`` where the device cannot map memory), ``DevrtOutOfMemoryError`` when
    the host has no room for the copy (that tag unchanged; the tags before it in the list stay
    asleep)."""
    for t in _tags(tags, "sleep"):
        _check(lib().devrt_sleep(int(device), _tag_bytes(t, "sleep"), 1 if keep else 0))


def wake(tags: Union[TagLike, Iterable[TagLike]], device: int = HOST) -> None:
    """Wakes ``tags`` (a tag, or a list or tuple of them, each in turn) on ``device``: memory is
    mapped at the same addresses and the contents ``sleep`` kept are restored (memory slept with
    ``keep=False`` comes back uncleared: write it before reading). An awake tag: nothing happens.
    ``DevrtOutOfMemoryError`` when the device has no room: that tag stays asleep with its kept copy
    (free memory and call again); the tags before it in the list are awake."""
    for t in _tags(tags, "wake"):
        _check(lib().devrt_wake(int(device), _tag_bytes(t, "wake")))


def release_host_copies(device: int = HOST) -> int:
    """Frees the pinned host memory devrt keeps after a wake so that the next ``sleep(keep=True)``
    need not pin anew (``stats()["host_cached_bytes"]``); returns the bytes freed. Copies holding
    a sleeping tag's contents stay."""
    n = ctypes.c_uint64(0)
    _check(lib().devrt_release_host_copies(int(device), ctypes.byref(n)))
    return int(n.value)

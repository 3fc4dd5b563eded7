"""devrt as CuPy's allocator.

    import devrt.cupy
    devrt.cupy.install()
    x = cupy.arange(1 << 20)        # memory from devrt, used on CuPy's current stream

Each allocation is made for CuPy's current stream (``cupy.cuda.get_current_stream()``) and freed,
when CuPy drops its last reference, in the order of the stream current at that moment: later work
on that stream may reuse it at once, other streams only once the work queued there is done. The
point the stream has reached is recorded at the free, so CuPy may destroy a stream (when it is
collected) with its work still queued: no retire is needed, and a stream created later with the
same handle never gets that memory early. Out of
memory raises ``cupy.cuda.memory.OutOfMemoryError`` with the size, chained to devrt's error (which
says what the device refused and what devrt holds).
"""

from __future__ import annotations

import devrt as _devrt

_previous = None
_installed = False


def _cupy():
    try:
        import cupy  # noqa: PLC0415 (imported late: devrt does not need CuPy to load)
    except ImportError as e:
        raise ImportError("devrt.cupy needs CuPy (import cupy failed: %s)" % e) from e
    return cupy


def _stream_handle(cupy) -> int:
    # CuPy's null stream (ptr 0) is CUDA's legacy default stream, as it is for devrt.
    return cupy.cuda.get_current_stream().ptr


class _Owner:
    """Frees its allocation when CuPy drops the last reference to the memory."""

    __slots__ = ("ptr", "device", "__weakref__")

    def __init__(self, ptr: int, device: int):
        self.ptr = ptr
        self.device = device

    def __del__(self):
        try:
            import cupy  # noqa: PLC0415

            _devrt.free(self.ptr, self.device, _stream_handle(cupy))
        except Exception:  # noqa: BLE001 (interpreter shutdown: modules may be gone; devrt frees at exit)
            pass


def malloc(size: int):
    """CuPy's allocator function: ``size`` bytes on the current device and stream."""
    cupy = _cupy()
    device = cupy.cuda.runtime.getDevice()
    try:
        ptr = _devrt.malloc(size, device, _stream_handle(cupy))
    except _devrt.DevrtOutOfMemoryError as e:
        held = _devrt.stats(device)["reserved_bytes"]
        raise cupy.cuda.memory.OutOfMemoryError(size, held) from e
    mem = cupy.cuda.UnownedMemory(ptr, size, _Owner(ptr, device), device)
    return cupy.cuda.MemoryPointer(mem, 0)


def install() -> None:
    """Makes devrt CuPy's allocator (``cupy.cuda.set_allocator``); ``uninstall`` restores the previous."""
    global _previous, _installed
    cupy = _cupy()
    if _installed:
        return
    _previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(malloc)
    _installed = True


def uninstall() -> None:
    global _previous, _installed
    if not _installed:
        return
    _cupy().cuda.set_allocator(_previous)
    _previous = None
    _installed = False

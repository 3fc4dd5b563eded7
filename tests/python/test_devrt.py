"""The Python package on the host device (ctypes over libdevrt_c.so), and the PyTorch and CuPy
glue where those modules and a GPU are present (skipped with the reason otherwise).

Run: DEVRT_LIBRARY=build/debug/runtime/libdevrt_c.so PYTHONPATH=python python3 -m unittest discover -s tests/python
"""

import ctypes
import importlib.util
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import devrt  # noqa: E402

HOST = devrt.HOST


def restart(**options):
    devrt.shutdown()
    devrt.init(use_cuda=False, use_environment=False, **options)


class Package(unittest.TestCase):
    def test_finds_and_loads_the_library(self):
        path = devrt.library_path()
        self.assertTrue(path.endswith("libdevrt_c.so"), path)
        if "DEVRT_LIBRARY" in os.environ:
            self.assertEqual(path, os.environ["DEVRT_LIBRARY"])
        self.assertIsNotNone(devrt.lib().devrt_malloc)

    def test_a_missing_library_says_what_was_tried(self):
        old = os.environ.get("DEVRT_LIBRARY")
        os.environ["DEVRT_LIBRARY"] = "/nonexistent/libdevrt_c.so"
        try:
            with self.assertRaises(FileNotFoundError) as c:
                devrt.library_path()
            self.assertIn("/nonexistent/libdevrt_c.so", str(c.exception))
            self.assertIn("DEVRT_LIBRARY", str(c.exception))
        finally:
            if old is None:
                del os.environ["DEVRT_LIBRARY"]
            else:
                os.environ["DEVRT_LIBRARY"] = old


class HostDevice(unittest.TestCase):
    def setUp(self):
        restart()

    def tearDown(self):
        devrt.shutdown()

    def test_the_memory_limit_refuses_past_it_and_zero_lifts_it(self):
        self.assertEqual(devrt.get_memory_limit(HOST), 0)
        devrt.set_memory_limit(HOST, 48 << 20)
        self.assertEqual(devrt.get_memory_limit(HOST), 48 << 20)
        p = devrt.malloc(32 << 20, HOST)
        with self.assertRaises(devrt.DevrtOutOfMemoryError) as e:
            devrt.malloc(32 << 20, HOST)
        self.assertIn("memory limit", str(e.exception))
        self.assertLessEqual(devrt.stats(HOST)["peak_reserved_bytes"], 48 << 20)
        for bad in (-1, 1.5, "1GiB", True):
            with self.assertRaises(ValueError):
                devrt.set_memory_limit(HOST, bad)
        devrt.set_memory_limit(HOST, 0)
        q = devrt.malloc(32 << 20, HOST)
        devrt.free(p, HOST)
        devrt.free(q, HOST)

    def test_malloc_write_read_free_with_exact_statistics(self):
        before = devrt.stats(HOST)
        self.assertEqual(before["in_use_bytes"], 0)
        p = devrt.malloc(4096, HOST)
        q = devrt.malloc(1000, HOST, stream=devrt.STREAM_LEGACY)
        ctypes.memset(p, 0xAB, 4096)
        self.assertEqual(ctypes.string_at(p, 4096), b"\xab" * 4096)
        self.assertEqual(devrt.allocation_size(q), 1000)
        s = devrt.stats(HOST)
        self.assertEqual(s["in_use_bytes"], 5096)
        self.assertEqual(s["live_allocations"], 2)
        self.assertEqual(s["allocations"], before["allocations"] + 2)
        devrt.free(p, HOST)
        devrt.free(q, HOST, stream=devrt.STREAM_PER_THREAD)  # another stream than its own
        s = devrt.stats(HOST)
        self.assertEqual(s["in_use_bytes"], 0)
        self.assertEqual(s["frees"], before["frees"] + 2)
        self.assertEqual(s["peak_in_use_bytes"], 5096)
        devrt.reset_peak_stats(HOST)
        self.assertEqual(devrt.stats(HOST)["peak_in_use_bytes"], 0)
        devrt.empty_cache(HOST)
        self.assertEqual(devrt.stats(HOST)["reserved_bytes"], 0)

    def test_stream_names_and_retire(self):
        # CUDA's numbering everywhere: None and 0 the legacy stream, 2 the per-thread one, and
        # devrt's own stream by its name; the host accepts them all, and retiring is optional.
        self.assertEqual((devrt.STREAM_LEGACY, devrt.STREAM_PER_THREAD, devrt.STREAM_DEVICE), (1, 2, 3))
        ptrs = [devrt.malloc(512, HOST, stream=s) for s in (None, 0, devrt.STREAM_DEVICE, 0x1000)]
        devrt.record_stream(ptrs[3], devrt.STREAM_DEVICE)
        for p in ptrs:
            devrt.free(p, HOST)
        devrt.retire_stream(0x1000, HOST)
        self.assertEqual(devrt.stats(HOST)["live_allocations"], 0)

    def test_threads(self):
        errors = []

        def work(t):
            try:
                for i in range(300):
                    n = 64 + (i * 37 + t) % 4000
                    p = devrt.malloc(n, HOST)
                    ctypes.memset(p, t, n)
                    if ctypes.string_at(p, n) != bytes([t]) * n:
                        errors.append(f"thread {t}: data of allocation {i} changed")
                    devrt.free(p, HOST)
            except Exception as e:  # noqa: BLE001
                errors.append(f"thread {t}: {e}")

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(errors, [])
        self.assertEqual(devrt.stats(HOST)["live_allocations"], 0)

    def test_errors_carry_the_code_and_the_values(self):
        p = devrt.malloc(64, HOST)
        devrt.free(p, HOST)
        with self.assertRaises(devrt.DevrtError) as c:
            devrt.free(p, HOST)
        self.assertEqual(c.exception.status, devrt.ERROR_DOUBLE_FREE)
        self.assertEqual(c.exception.name, "DEVRT_ERROR_DOUBLE_FREE")
        self.assertIn(hex(p), str(c.exception))

        with self.assertRaises(devrt.DevrtError) as c:
            devrt.free(0x1234560, HOST)
        self.assertEqual(c.exception.status, devrt.ERROR_UNKNOWN_POINTER)
        self.assertIn("0x1234560", c.exception.message)

        with self.assertRaises(devrt.DevrtError) as c:
            devrt.malloc(1 << 63, HOST)
        self.assertEqual(c.exception.status, devrt.ERROR_SIZE_TOO_LARGE)
        self.assertIn(str(1 << 63), c.exception.message)

        with self.assertRaises(devrt.DevrtError) as c:
            devrt.malloc(10, 3)
        self.assertEqual(c.exception.status, devrt.ERROR_INVALID_DEVICE)
        self.assertIn("device 3", c.exception.message)

        with self.assertRaises(devrt.DevrtError) as c:
            devrt.configure(HOST, "sliced:page=0")
        self.assertEqual(c.exception.status, devrt.ERROR_INVALID_LAYOUT)
        self.assertIn("page_size", c.exception.message)
        self.assertEqual(devrt.stats(HOST)["live_allocations"], 0)
        devrt.free(devrt.malloc(10, HOST), HOST)  # still works

    def test_arguments_ctypes_would_wrap_or_misread_are_refused(self):
        before = devrt.stats(HOST)
        with self.assertRaises(devrt.DevrtError) as c:
            devrt.malloc(2**64 + 100, HOST)  # ctypes would pass 100
        self.assertEqual(c.exception.status, devrt.ERROR_SIZE_TOO_LARGE)
        self.assertIn(str(2**64 + 100), c.exception.message)
        with self.assertRaises(TypeError) as t:
            devrt.malloc("10", HOST)
        self.assertIn("size is an int", str(t.exception))
        with self.assertRaises(TypeError):
            devrt.malloc(10.0, HOST)
        with self.assertRaises(ValueError) as v:
            devrt.set_memory_limit(HOST, 2**64 + 4096)  # ctypes would pass 4096
        self.assertIn("2**64 - 1", str(v.exception))
        self.assertEqual(devrt.get_memory_limit(HOST), 0)
        with self.assertRaises(TypeError) as t:
            devrt.configure(HOST, None)
        self.assertIn("layout is a str", str(t.exception))
        with self.assertRaises(TypeError):
            devrt.configure(HOST, b"auto")
        with self.assertRaises(ValueError) as v:
            devrt.configure(HOST, "auto\0sub-slices")  # C would read "auto" alone
        self.assertIn("NUL", str(v.exception))

        class Index:  # numpy's integers and others that convert through __index__
            def __index__(self):
                return 4096

        p = devrt.malloc(Index(), HOST)
        self.assertEqual(devrt.allocation_size(p), 4096)
        devrt.free(p, HOST)
        devrt.shutdown()
        with self.assertRaises(ValueError) as v:
            devrt.init(False, host_capacity=-5)
        self.assertIn("host_capacity", str(v.exception))
        with self.assertRaises(TypeError):
            devrt.init(False, host_layout=7)
        self.assertFalse(devrt.is_initialized())
        restart()
        after = devrt.stats(HOST)
        self.assertEqual(after["allocations"], 0)
        self.assertEqual(before["live_allocations"], 0)

    def test_out_of_memory_is_a_memory_error_with_the_sizes(self):
        restart(host_capacity=32 << 20)
        held = []
        with self.assertRaises(devrt.DevrtOutOfMemoryError) as c:
            for _ in range(8):
                held.append(devrt.malloc(8 << 20, HOST))
        self.assertIsInstance(c.exception, MemoryError)
        self.assertIn(str(8 << 20), c.exception.message)
        for p in held:
            devrt.free(p, HOST)

    def test_shut_down_until_init(self):
        devrt.shutdown()
        self.assertFalse(devrt.is_initialized())
        with self.assertRaises(devrt.DevrtError) as c:
            devrt.malloc(10, HOST)
        self.assertEqual(c.exception.status, devrt.ERROR_NOT_INITIALIZED)
        restart()
        self.assertEqual(devrt.device_count(), 0)


def _module_and_gpu(name):
    if importlib.util.find_spec(name) is None:
        return f"{name} is not installed"
    if name == "torch":
        import torch

        if not torch.cuda.is_available():
            return "torch has no CUDA device here"
    if name == "cupy":
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() == 0:
                return "cupy sees no CUDA device"
        except Exception as e:  # noqa: BLE001
            return f"cupy sees no CUDA device ({e})"
    return None


_torch_missing = _module_and_gpu("torch")
_cupy_missing = _module_and_gpu("cupy")


@unittest.skipIf(_torch_missing is not None, _torch_missing or "")
class Torch(unittest.TestCase):
    """Runs in a process of its own: PyTorch's allocator can be swapped once, before CUDA starts."""

    def test_tensors_streams_and_statistics_through_devrt(self):
        import subprocess

        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "examples",
                              "torch_smoke.py")
        r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("torch smoke: ok", r.stdout)


@unittest.skipIf(_cupy_missing is not None, _cupy_missing or "")
class Cupy(unittest.TestCase):
    def test_kernels_on_two_streams_through_devrt(self):
        import subprocess

        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "examples",
                              "cupy_smoke.py")
        r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("cupy smoke: ok", r.stdout)


class GlueWithoutTheFrameworks(unittest.TestCase):
    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "torch is installed: the Torch tests cover it")
    def test_torch_glue_says_torch_is_missing(self):
        import devrt.torch as dt

        with self.assertRaises(ImportError) as c:
            dt.install()
        self.assertIn("PyTorch", str(c.exception))
        self.assertTrue(dt.is_out_of_memory(RuntimeError("devrt_torch_malloc: 10 bytes on cuda:0: out of memory")))
        self.assertFalse(dt.is_out_of_memory(RuntimeError("something else")))

    @unittest.skipIf(importlib.util.find_spec("cupy") is not None, "cupy is installed: the Cupy tests cover it")
    def test_cupy_glue_says_cupy_is_missing(self):
        import devrt.cupy as dc

        with self.assertRaises(ImportError) as c:
            dc.install()
        self.assertIn("CuPy", str(c.exception))


if __name__ == "__main__":
    unittest.main()

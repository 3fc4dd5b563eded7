"""Tags, sleep and wake through the Python package on the host device (whose arena maps memory with
mmap, so sleep and wake work there as on a GPU), and the PyTorch glue where torch and a GPU are
present (skipped with the reason otherwise).

Run: DEVRT_LIBRARY=build/debug/runtime/libdevrt_c.so PYTHONPATH=python python3 -m unittest discover -s tests/python
"""

import ctypes
import importlib.util
import os
import random
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import devrt  # noqa: E402

HOST = devrt.HOST
MiB = 1 << 20


def restart(**options):
    devrt.shutdown()
    devrt.init(use_cuda=False, use_environment=False, **options)


def pattern(n, seed):
    return random.Random(seed).randbytes(n)


def write(ptr, data):
    ctypes.memmove(ptr, data, len(data))


def read(ptr, n):
    return ctypes.string_at(ptr, n)


class Tags(unittest.TestCase):
    def setUp(self):
        restart()

    def tearDown(self):
        devrt.set_tag(None)
        devrt.shutdown()

    def test_set_get_and_clear(self):
        self.assertIsNone(devrt.get_tag())
        devrt.set_tag("weights")
        self.assertEqual(devrt.get_tag(), "weights")
        devrt.set_tag("kv_cache")
        self.assertEqual(devrt.get_tag(), "kv_cache")
        devrt.set_tag(None)
        self.assertIsNone(devrt.get_tag())
        devrt.set_tag("weights")
        devrt.set_tag("")
        self.assertIsNone(devrt.get_tag())
        devrt.set_tag(b"bytes-too")
        self.assertEqual(devrt.get_tag(), "bytes-too")

    def test_the_longest_tag_and_every_printable_byte(self):
        longest = "x" * devrt.MAX_TAG_LENGTH
        devrt.set_tag(longest)
        self.assertEqual(devrt.get_tag(), longest)
        printable = "".join(chr(c) for c in range(0x20, 0x7F))
        for i in range(0, len(printable), devrt.MAX_TAG_LENGTH):
            devrt.set_tag(printable[i:i + devrt.MAX_TAG_LENGTH])
            self.assertEqual(devrt.get_tag(), printable[i:i + devrt.MAX_TAG_LENGTH])

    def test_a_bad_tag_raises_and_changes_nothing(self):
        devrt.set_tag("weights")
        for bad in ("x" * (devrt.MAX_TAG_LENGTH + 1), "tab\there", "bell\x07", "del\x7f", "caf\u00e9", "new\nline",
                    "nul\x00byte"):
            with self.subTest(tag=bad):
                with self.assertRaises(devrt.DevrtError) as c:
                    devrt.set_tag(bad)
                self.assertEqual(c.exception.status, devrt.ERROR_INVALID_VALUE)
                self.assertEqual(c.exception.name, "DEVRT_ERROR_INVALID_VALUE")
                self.assertTrue(c.exception.message)
                self.assertEqual(devrt.get_tag(), "weights", "a refused tag leaves the tag as it was")
        with self.assertRaises(devrt.DevrtError) as c:
            devrt.set_tag("y" * 64)
        self.assertIn("63", c.exception.message)
        with self.assertRaises(TypeError):
            devrt.set_tag(5)
        self.assertEqual(devrt.get_tag(), "weights")

    def test_the_context_manager_nests_and_restores_on_exceptions(self):
        with devrt.tag("weights"):
            self.assertEqual(devrt.get_tag(), "weights")
            with devrt.tag("kv_cache"):
                self.assertEqual(devrt.get_tag(), "kv_cache")
                with devrt.tag(None):
                    self.assertIsNone(devrt.get_tag())
                self.assertEqual(devrt.get_tag(), "kv_cache")
            self.assertEqual(devrt.get_tag(), "weights")
            with self.assertRaises(KeyError):
                with devrt.tag("activations"):
                    raise KeyError("boom")
            self.assertEqual(devrt.get_tag(), "weights")
            with self.assertRaises(devrt.DevrtError):
                with devrt.tag("z" * 64):
                    self.fail("a bad tag does not enter the block")
            self.assertEqual(devrt.get_tag(), "weights")
        self.assertIsNone(devrt.get_tag())

    def test_a_tag_belongs_to_its_thread(self):
        seen = []
        with devrt.tag("weights"):
            th = threading.Thread(target=lambda: seen.append(devrt.get_tag()))
            th.start()
            th.join()
            self.assertEqual(devrt.get_tag(), "weights")
        self.assertEqual(seen, [None])

    def test_torch_and_the_package_share_the_tag_functions(self):
        import devrt.torch as dt

        self.assertIs(dt.tag, devrt.tag)
        with dt.tag("weights"):
            self.assertEqual(devrt.get_tag(), "weights")
        self.assertIsNone(devrt.get_tag())


class SleepAndWake(unittest.TestCase):
    def setUp(self):
        restart()

    def tearDown(self):
        devrt.set_tag(None)
        devrt.shutdown()

    def test_sleep_keeping_contents_gives_memory_back_and_wake_restores_it_byte_for_byte(self):
        sizes = [4 * MiB, 1000, 64 * 1024 + 7, 3 * MiB]
        with devrt.tag("weights"):
            ptrs = [devrt.malloc(n, HOST) for n in sizes]
        other = devrt.malloc(MiB, HOST)  # untagged: stays awake throughout
        data = [pattern(n, i) for i, n in enumerate(sizes)]
        for p, d in zip(ptrs, data):
            write(p, d)
        write(other, pattern(MiB, 99))
        total = sum(sizes)
        before = devrt.stats(HOST)
        self.assertEqual(before["sleeping_bytes"], 0)
        self.assertEqual(before["offloaded_bytes"], 0)

        devrt.sleep("weights", HOST, keep=True)
        asleep = devrt.stats(HOST)
        self.assertGreaterEqual(asleep["sleeping_bytes"], total)
        self.assertGreaterEqual(asleep["offloaded_bytes"], total)
        self.assertLessEqual(asleep["reserved_bytes"], before["reserved_bytes"] - total,
                             f"reserved {before['reserved_bytes']} -> {asleep['reserved_bytes']}")
        self.assertEqual(asleep["sleeps"], before["sleeps"] + 1)
        self.assertEqual(asleep["wakes"], before["wakes"])
        self.assertGreater(asleep["unmaps"], before["unmaps"])
        self.assertEqual(read(other, MiB), pattern(MiB, 99), "an untagged allocation does not sleep")

        devrt.wake("weights", HOST)
        awake = devrt.stats(HOST)
        self.assertEqual(awake["sleeping_bytes"], 0)
        self.assertEqual(awake["offloaded_bytes"], 0)
        self.assertEqual(awake["wakes"], before["wakes"] + 1)
        self.assertGreaterEqual(awake["reserved_bytes"], asleep["reserved_bytes"] + total)
        self.assertGreater(awake["maps"], asleep["maps"])
        for p, n, d in zip(ptrs, sizes, data):
            self.assertEqual(devrt.allocation_size(p), n, "the same pointer, the same allocation")
            self.assertEqual(read(p, n), d, f"contents of {hex(p)} ({n} bytes) after wake")
        # The woken memory is writable, and the tag allocates again.
        write(ptrs[0], b"\x5a" * sizes[0])
        self.assertEqual(read(ptrs[0], sizes[0]), b"\x5a" * sizes[0])
        with devrt.tag("weights"):
            q = devrt.malloc(MiB, HOST)
        write(q, pattern(MiB, 7))
        self.assertEqual(read(q, MiB), pattern(MiB, 7))
        for p in ptrs + [q, other]:
            devrt.free(p, HOST)
        self.assertEqual(devrt.stats(HOST)["live_allocations"], 0)

    def test_sleep_discarding_contents_then_wake_gives_usable_memory(self):
        with devrt.tag("kv_cache"):
            p = devrt.malloc(8 * MiB, HOST)
        write(p, pattern(8 * MiB, 1))
        before = devrt.stats(HOST)
        devrt.sleep("kv_cache", HOST, keep=False)
        asleep = devrt.stats(HOST)
        self.assertGreaterEqual(asleep["sleeping_bytes"], 8 * MiB)
        self.assertEqual(asleep["offloaded_bytes"], 0, "nothing kept, nothing offloaded")
        self.assertLessEqual(asleep["reserved_bytes"], before["reserved_bytes"] - 8 * MiB)
        devrt.wake("kv_cache", HOST)
        self.assertEqual(devrt.allocation_size(p), 8 * MiB)
        fresh = pattern(8 * MiB, 2)
        write(p, fresh)
        self.assertEqual(read(p, 8 * MiB), fresh)
        devrt.free(p, HOST)

    def test_malloc_under_a_sleeping_tag_is_refused_until_wake(self):
        with devrt.tag("weights"):
            p = devrt.malloc(MiB, HOST)
        devrt.sleep("weights", HOST)
        failed = devrt.stats(HOST)["failed_allocations"]
        with devrt.tag("weights"):
            with self.assertRaises(devrt.DevrtError) as c:
                devrt.malloc(4096, HOST)
        self.assertEqual(c.exception.status, devrt.ERROR_ASLEEP)
        self.assertEqual(c.exception.name, "DEVRT_ERROR_ASLEEP")
        self.assertNotIsInstance(c.exception, devrt.DevrtOutOfMemoryError)
        self.assertIn("weights", c.exception.message)
        self.assertGreaterEqual(devrt.stats(HOST)["failed_allocations"], failed)
        # Other tags and untagged memory are not affected.
        with devrt.tag("kv_cache"):
            q = devrt.malloc(4096, HOST)
        r = devrt.malloc(4096, HOST)
        devrt.wake("weights", HOST)
        with devrt.tag("weights"):
            s = devrt.malloc(4096, HOST)
        for x in (p, q, r, s):
            devrt.free(x, HOST)

    def test_a_sleeping_allocation_may_be_freed_and_the_tag_woken_after(self):
        with devrt.tag("weights"):
            a = devrt.malloc(2 * MiB, HOST)
            b = devrt.malloc(2 * MiB, HOST)
        write(a, pattern(2 * MiB, 3))
        write(b, pattern(2 * MiB, 4))
        devrt.sleep("weights", HOST, keep=True)
        devrt.free(a, HOST)
        s = devrt.stats(HOST)
        self.assertEqual(s["live_allocations"], 1)
        self.assertEqual(s["in_use_bytes"], 2 * MiB)
        devrt.wake("weights", HOST)
        self.assertEqual(read(b, 2 * MiB), pattern(2 * MiB, 4))
        with self.assertRaises(devrt.DevrtError) as c:
            devrt.allocation_size(a)
        self.assertEqual(c.exception.status, devrt.ERROR_UNKNOWN_POINTER)
        devrt.free(b, HOST)
        # Everything freed while asleep: the tag sleeps and wakes with nothing in it.
        with devrt.tag("weights"):
            c_ = devrt.malloc(MiB, HOST)
        devrt.sleep("weights", HOST)
        devrt.free(c_, HOST)
        devrt.wake("weights", HOST)
        self.assertEqual(devrt.stats(HOST)["live_allocations"], 0)
        self.assertEqual(devrt.stats(HOST)["sleeping_bytes"], 0)

    def test_unknown_tags_and_repeated_calls_are_no_ops(self):
        before = devrt.stats(HOST)
        devrt.sleep("never-used", HOST)
        devrt.sleep("never-used", HOST, keep=False)
        devrt.wake("never-used", HOST)
        s = devrt.stats(HOST)
        self.assertEqual((s["sleeps"], s["wakes"], s["sleeping_bytes"]), (before["sleeps"], before["wakes"], 0))

        with devrt.tag("weights"):
            p = devrt.malloc(MiB, HOST)
        write(p, pattern(MiB, 5))
        devrt.wake("weights", HOST)  # awake already
        devrt.sleep("weights", HOST)
        devrt.sleep("weights", HOST, keep=False)  # asleep already: the kept copy stays
        s = devrt.stats(HOST)
        self.assertEqual(s["sleeps"], before["sleeps"] + 1)
        self.assertEqual(s["wakes"], before["wakes"])
        devrt.wake("weights", HOST)
        devrt.wake("weights", HOST)
        s = devrt.stats(HOST)
        self.assertEqual(s["wakes"], before["wakes"] + 1)
        self.assertEqual(read(p, MiB), pattern(MiB, 5))
        devrt.free(p, HOST)

    def test_lists_of_tags_and_the_counters(self):
        ptrs = {}
        for i, t in enumerate(("weights", "kv_cache", "activations")):
            with devrt.tag(t):
                ptrs[t] = devrt.malloc(MiB, HOST)
            write(ptrs[t], pattern(MiB, 10 + i))
        before = devrt.stats(HOST)
        devrt.sleep(["weights", "kv_cache"], HOST, keep=True)
        devrt.sleep(("activations",), HOST, keep=False)
        s = devrt.stats(HOST)
        self.assertEqual(s["sleeps"], before["sleeps"] + 3)
        self.assertGreaterEqual(s["sleeping_bytes"], 3 * MiB)
        devrt.wake(("weights", "kv_cache", "activations"), HOST)
        s = devrt.stats(HOST)
        self.assertEqual(s["wakes"], before["wakes"] + 3)
        self.assertEqual(s["sleeping_bytes"], 0)
        self.assertEqual(read(ptrs["weights"], MiB), pattern(MiB, 10))
        self.assertEqual(read(ptrs["kv_cache"], MiB), pattern(MiB, 11))
        for p in ptrs.values():
            devrt.free(p, HOST)

    def test_bad_arguments(self):
        for bad in ("", "x" * 64, "bad\x01"):
            with self.subTest(tag=bad):
                with self.assertRaises(devrt.DevrtError) as c:
                    devrt.sleep(bad, HOST)
                self.assertEqual(c.exception.status, devrt.ERROR_INVALID_VALUE)
                with self.assertRaises(devrt.DevrtError) as c:
                    devrt.wake(bad, HOST)
                self.assertEqual(c.exception.status, devrt.ERROR_INVALID_VALUE)
        with self.assertRaises(devrt.DevrtError) as c:
            devrt.sleep("weights", 7)
        self.assertEqual(c.exception.status, devrt.ERROR_INVALID_DEVICE)
        with self.assertRaises(devrt.DevrtError) as c:
            devrt.wake("weights", 7)
        self.assertEqual(c.exception.status, devrt.ERROR_INVALID_DEVICE)
        with self.assertRaises(TypeError):
            devrt.sleep(None, HOST)

    def test_shut_down_with_a_sleeping_tag(self):
        with devrt.tag("weights"):
            devrt.malloc(MiB, HOST)
        devrt.sleep("weights", HOST)
        devrt.shutdown()  # frees what is live, asleep or not
        restart()
        s = devrt.stats(HOST)
        self.assertEqual((s["live_allocations"], s["sleeping_bytes"], s["offloaded_bytes"]), (0, 0, 0))


class StatsVersions(unittest.TestCase):
    def setUp(self):
        restart()

    def tearDown(self):
        devrt.shutdown()

    def test_version_one_fills_its_fields_only(self):
        l = devrt.lib()
        s = devrt._Stats()
        for name in ("sleeping_bytes", "offloaded_bytes", "sleeps", "wakes"):
            setattr(s, name, 0xDEAD)
        with devrt.tag("weights"):
            p = devrt.malloc(MiB, HOST)
        devrt.sleep("weights", HOST)
        self.assertEqual(l.devrt_get_stats(HOST, ctypes.byref(s)), devrt.SUCCESS)
        self.assertEqual(s.live_allocations, 1)
        self.assertEqual((s.sleeping_bytes, s.offloaded_bytes, s.sleeps, s.wakes), (0xDEAD,) * 4)
        self.assertEqual(l.devrt_get_stats_v(HOST, ctypes.byref(s), 1), devrt.SUCCESS)
        self.assertEqual(s.sleeps, 0xDEAD)
        s.host_cached_bytes = 0xDEAD
        self.assertEqual(l.devrt_get_stats_v(HOST, ctypes.byref(s), 2), devrt.SUCCESS)
        self.assertEqual(s.sleeps, 1)
        self.assertGreaterEqual(s.sleeping_bytes, MiB)
        self.assertEqual(s.host_cached_bytes, 0xDEAD, "version 2 has no host_cached_bytes")
        s.peak_busy_bytes = 0xDEAD
        self.assertEqual(l.devrt_get_stats_v(HOST, ctypes.byref(s), 3), devrt.SUCCESS)
        self.assertEqual(s.host_cached_bytes, 0)
        self.assertEqual(s.peak_busy_bytes, 0xDEAD, "version 3 has no peak_busy_bytes")
        self.assertEqual(l.devrt_get_stats_v(HOST, ctypes.byref(s), 4), devrt.SUCCESS)
        self.assertEqual(s.peak_busy_bytes, 0, "the host has no streams")
        self.assertEqual(l.devrt_get_stats_v(HOST, ctypes.byref(s), 5), devrt.ERROR_INVALID_VALUE)
        self.assertIn("version", devrt.last_error())
        devrt.wake("weights", HOST)
        devrt.free(p, HOST)

    def test_the_pinned_copy_is_kept_after_wake_and_released_on_request(self):
        with devrt.tag("cache"):
            p = devrt.malloc(3 * MiB, HOST)
        ctypes.memset(p, 0x5A, 3 * MiB)
        devrt.sleep("cache", HOST, keep=True)
        kept = devrt.stats(HOST)["offloaded_bytes"]
        self.assertGreaterEqual(kept, 3 * MiB)
        self.assertEqual(devrt.stats(HOST)["host_cached_bytes"], 0)
        devrt.wake("cache", HOST)
        self.assertEqual(ctypes.string_at(p + 3 * MiB - 4, 4), b"\x5a" * 4)
        self.assertEqual(devrt.stats(HOST)["host_cached_bytes"], kept)
        devrt.sleep("cache", HOST, keep=True)
        self.assertEqual(devrt.stats(HOST)["host_cached_bytes"], 0, "the second sleep reuses the kept copy")
        self.assertEqual(devrt.release_host_copies(HOST), 0, "a copy holding contents stays")
        devrt.wake("cache", HOST)
        self.assertEqual(ctypes.string_at(p, 4), b"\x5a" * 4)
        self.assertEqual(devrt.release_host_copies(HOST), kept)
        self.assertEqual(devrt.stats(HOST)["host_cached_bytes"], 0)
        with self.assertRaises(devrt.DevrtError) as e:
            devrt.release_host_copies(7)
        self.assertEqual(e.exception.name, "DEVRT_ERROR_INVALID_DEVICE")
        devrt.free(p, HOST)

    def test_the_status_names(self):
        l = devrt.lib()
        self.assertEqual(l.devrt_status_name(devrt.ERROR_ASLEEP), b"DEVRT_ERROR_ASLEEP")
        self.assertEqual(l.devrt_status_name(devrt.ERROR_UNSUPPORTED), b"DEVRT_ERROR_UNSUPPORTED")
        self.assertEqual((devrt.ERROR_ASLEEP, devrt.ERROR_UNSUPPORTED), (14, 15))


def _torch_missing():
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "torch has no CUDA device here"
    return None


_TORCH_MISSING = _torch_missing()
_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "gpu", "sleep_llama.py")


@unittest.skipIf(_TORCH_MISSING is not None, _TORCH_MISSING or "")
class TorchSleep(unittest.TestCase):
    """tools/gpu/sleep_llama.py in processes of their own (PyTorch's allocator is chosen once per
    process): under devrt.torch.install(), and through MemPools without it. It needs transformers."""

    def _run(self, *args):
        if not os.path.isfile(_SCRIPT):
            self.skipTest(f"{_SCRIPT} is not here (the installed package's tests)")
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        r = subprocess.run([sys.executable, _SCRIPT, *args], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn(": FAIL", r.stdout)
        return r.stdout

    def test_installed(self):
        self.assertIn("PASS", self._run("--mode", "install"))

    def test_mem_pools(self):
        self.assertIn("PASS", self._run("--mode", "mempool"))


class TorchGlueWithoutTorch(unittest.TestCase):
    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "torch is installed: TorchSleep covers it")
    def test_sleep_wake_and_pools_say_torch_is_missing(self):
        import devrt.torch as dt

        for call in (lambda: dt.sleep("weights"), lambda: dt.wake_up(), lambda: dt.mem_pool(),
                     lambda: dt.use_mem_pool("weights").__enter__()):
            with self.assertRaises(ImportError) as c:
                call()
            self.assertIn("PyTorch", str(c.exception))


if __name__ == "__main__":
    unittest.main()

"""Memory snapshots in PyTorch's format, OpenMetrics text and the out-of-memory message, through the
Python package on the host device. Where torch is installed, PyTorch's own memory viewer
(torch.cuda._memory_viz) reads the snapshot too.

Run: DEVRT_LIBRARY=build/debug/runtime/libdevrt_c.so PYTHONPATH=python python3 -m unittest discover -s tests/python
"""

import ctypes
import importlib.util
import os
import pickle
import random
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import devrt  # noqa: E402

HOST = devrt.HOST


def restart(**options):
    devrt.shutdown()
    devrt.init(use_cuda=False, use_environment=False, **options)


def check_format(test, snap, stats):
    """The invariants PyTorch's viewer relies on, and devrt's own figures."""
    test.assertIn("segments", snap)
    test.assertIn("device_traces", snap)
    reserved = 0
    allocated = 0
    for seg in snap["segments"]:
        for key in ("address", "total_size", "stream", "blocks", "segment_type", "allocated_size", "active_size",
                    "requested_size", "device", "is_expandable", "frames"):
            test.assertIn(key, seg)
        at = seg["address"]
        for b in seg["blocks"]:
            for key in ("address", "size", "requested_size", "state", "frames"):
                test.assertIn(key, b)
            test.assertIn(b["state"], ("active_allocated", "active_pending_free", "inactive"))
            test.assertEqual(b["address"], at, "the blocks cover the segment in address order")
            test.assertLessEqual(b["requested_size"], b["size"])
            at += b["size"]
            if b["state"] == "active_allocated":
                allocated += b["requested_size"]
        test.assertEqual(at - seg["address"], seg["total_size"], "the blocks add up to the segment")
        reserved += seg["total_size"]
    test.assertEqual(reserved, stats["reserved_bytes"], "total_reserved is devrt's reserved bytes")
    test.assertEqual(allocated, stats["in_use_bytes"], "total_allocated is devrt's bytes in use")
    for trace in snap["device_traces"]:
        live = set()
        for e in trace:
            for key in ("action", "addr", "size", "stream", "time_us", "frames"):
                test.assertIn(key, e)
            if e["action"] == "alloc":
                live.add(e["addr"])
            elif e["action"] == "free_completed":
                test.assertIn(e["addr"], live, "every free_completed follows its alloc")
                live.discard(e["addr"])


class Snapshot(unittest.TestCase):
    def setUp(self):
        restart()

    def tearDown(self):
        devrt.shutdown()

    def test_the_format_adds_up_after_random_work(self):
        devrt.record_memory_history(True, max_entries=100000)
        rng = random.Random(5)
        live = []
        for _ in range(400):
            if not live or rng.random() < 0.6:
                size = rng.choice([rng.randint(1, 4096), rng.randint(1, 1 << 20), rng.randint(1, 8 << 20)])
                live.append(devrt.malloc(size, HOST))
            else:
                devrt.free(live.pop(rng.randrange(len(live))), HOST)
        snap = devrt.memory_snapshot(HOST)
        check_format(self, snap, devrt.stats(HOST))
        actions = {e["action"] for e in snap["device_traces"][-1]}
        self.assertTrue({"alloc", "free_requested", "free_completed", "segment_alloc"} <= actions, actions)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snap.pickle")
            with open(path, "wb") as f:
                pickle.dump(snap, f)
            with open(path, "rb") as f:
                self.assertEqual(pickle.load(f), snap)
        for p in live:
            devrt.free(p, HOST)
        devrt.empty_cache(HOST)
        after = devrt.memory_snapshot(HOST)
        check_format(self, after, devrt.stats(HOST))
        self.assertIn("segment_free", {e["action"] for e in after["device_traces"][-1]})

    def test_every_device_at_once(self):
        p = devrt.malloc(1000, HOST)
        snap = devrt.memory_snapshot()
        self.assertEqual(snap["devrt_devices"], ["host"], "no CUDA device here: the host alone")
        check_format(self, snap, devrt.stats(HOST))
        devrt.free(p, HOST)

    def test_history_is_off_until_asked(self):
        devrt.free(devrt.malloc(100, HOST), HOST)
        self.assertEqual(devrt.memory_snapshot(HOST)["device_traces"][-1], [])
        with self.assertRaises(devrt.DevrtError) as c:
            devrt.record_memory_history(True, max_entries=0)
        self.assertIn("max_entries", c.exception.message)

    def test_the_c_interface_refuses_bad_arguments(self):
        l = devrt.lib()
        n = ctypes.c_size_t(0)
        self.assertEqual(l.devrt_memory_snapshot(HOST, 7, None, 0, ctypes.byref(n)), devrt.ERROR_INVALID_VALUE)
        self.assertIn("format 7", devrt.last_error())
        self.assertEqual(l.devrt_memory_snapshot(HOST, 1, None, 0, None), devrt.ERROR_INVALID_VALUE)
        self.assertEqual(l.devrt_memory_snapshot(5, 1, None, 0, ctypes.byref(n)), devrt.ERROR_INVALID_DEVICE)
        self.assertEqual(l.devrt_memory_snapshot(HOST, 1, None, 0, ctypes.byref(n)), devrt.SUCCESS)
        self.assertGreater(n.value, 10)
        small = ctypes.create_string_buffer(8)
        self.assertEqual(l.devrt_memory_snapshot(HOST, 1, small, 8, ctypes.byref(n)), devrt.ERROR_INVALID_VALUE)
        self.assertIn("needs", devrt.last_error())
        self.assertEqual(l.devrt_record_memory_history(2, 10), devrt.ERROR_INVALID_VALUE)
        self.assertEqual(l.devrt_metrics_text(None, 0, None), devrt.ERROR_INVALID_VALUE)


class Metrics(unittest.TestCase):
    def setUp(self):
        restart()

    def tearDown(self):
        devrt.shutdown()

    def test_openmetrics_text_parses_back_to_the_statistics(self):
        ptrs = [devrt.malloc(n << 16, HOST) for n in range(1, 6)]
        devrt.free(ptrs.pop(), HOST)
        text = devrt.metrics_text()
        self.assertTrue(text.endswith("# EOF\n"))
        types = {}
        samples = {}
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                types[name] = kind
            elif line.startswith("#"):
                continue
            else:
                name_labels, value = line.rsplit(" ", 1)
                name, labels = name_labels.split("{", 1)
                self.assertEqual(labels, 'device="host"}')
                family = name[:-len("_total")] if name.endswith("_total") and name not in types else name
                self.assertIn(family, types, line)
                samples[name] = int(value)
        s = devrt.stats(HOST)
        self.assertEqual(samples["devrt_reserved_bytes"], s["reserved_bytes"])
        self.assertEqual(samples["devrt_in_use_bytes"], s["in_use_bytes"])
        self.assertEqual(samples["devrt_peak_in_use_bytes"], s["peak_in_use_bytes"])
        self.assertEqual(samples["devrt_live_allocations"], 4)
        self.assertEqual(samples["devrt_reserves_total"], 5)
        self.assertEqual(samples["devrt_maps_total"], s["maps"])
        self.assertEqual(types["devrt_maps"], "counter")
        self.assertEqual(types["devrt_reserved_bytes"], "gauge")
        for p in ptrs:
            devrt.free(p, HOST)


class OutOfMemory(unittest.TestCase):
    def tearDown(self):
        devrt.shutdown()

    def test_the_message_names_the_request_the_device_and_the_largest_allocations(self):
        restart(host_capacity=64 << 20)
        held = [devrt.malloc(n << 20, HOST) for n in (8, 16, 4, 12)]
        devrt.record_memory_history(True)
        with self.assertRaises(devrt.DevrtOutOfMemoryError) as c:
            devrt.malloc(40 << 20, HOST)
        m = c.exception.message
        self.assertIn("request: 40.00 MiB (41943040 bytes) on host", m)
        self.assertIn("device: capacity 64.00 MiB, free 24.00 MiB", m)
        self.assertIn("devrt: reserved 40.00 MiB, in use 40.00 MiB in 4 allocations", m)
        self.assertIn("returning 0 B", m)
        self.assertIn("largest free block", m)
        self.assertIn("the 4 largest live allocations (of 4):", m)
        self.assertLess(m.index("16.00 MiB (16777216 bytes)"), m.index("12.00 MiB (12582912 bytes)"))
        self.assertIn("reserve #2 of 4", m)
        self.assertIn("hint: ", m)
        ooms = [e for e in devrt.memory_snapshot(HOST)["device_traces"][-1] if e["action"] == "oom"]
        self.assertEqual(len(ooms), 1)
        self.assertEqual(ooms[0]["size"], 40 << 20)
        self.assertEqual(ooms[0]["device_free"], 24 << 20)
        for p in held:
            devrt.free(p, HOST)


@unittest.skipIf(importlib.util.find_spec("torch") is None, "torch is not installed")
class PyTorchViewer(unittest.TestCase):
    """PyTorch's memory viewer on a snapshot of the host device (it needs no GPU)."""

    def setUp(self):
        restart()

    def tearDown(self):
        devrt.shutdown()

    def test_memory_viz_reads_the_snapshot(self):
        from torch.cuda import _memory_viz

        devrt.record_memory_history(True)
        ptrs = [devrt.malloc(n << 20, HOST) for n in (1, 30, 2, 50)]
        devrt.free(ptrs[1], HOST)
        snap = devrt.memory_snapshot(HOST)
        s = devrt.stats(HOST)
        summary = _memory_viz.segsum(snap)
        self.assertIn("total_reserved: " + repr(_memory_viz.Bytes(s["reserved_bytes"])), summary)
        self.assertIn("total_allocated: " + repr(_memory_viz.Bytes(s["in_use_bytes"])), summary)
        self.assertIn("entries", _memory_viz.trace(snap))
        self.assertIn("<html>", _memory_viz.trace_plot(snap))
        for i in (0, 2, 3):
            devrt.free(ptrs[i], HOST)


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""Tests of tools/replay/snapshot_to_trace.py on small synthetic snapshots (no torch needed).

When DEVRT_REPLAY names the devrt-replay executable (ctest sets it), the converted trace is also
replayed and its peak live checked.
"""

import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "tools", "replay", "snapshot_to_trace.py")


def ev(action, addr, size=0, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": []}
    e.update(extra)
    return e


# Device 0: address 0x1000 is reused after its free, a free_completed trails each free_requested,
# one free has no allocation in the history, and segment/oom events are not replayed.
REUSE = [
    ev("segment_alloc", 0x1000, 1 << 20),
    ev("alloc", 0x1000, 100),
    ev("alloc", 0x2000, 200),
    ev("free_requested", 0x1000, 100),
    ev("free_completed", 0x1000, 100),
    ev("alloc", 0x1000, 300),
    ev("free_requested", 0x2000, 200),
    ev("free_completed", 0x2000, 200),
    ev("free_requested", 0x9999, 64),
    ev("oom", 0, 0),
]


class SnapshotToTrace(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write_pickle(self, obj, name="snap.pickle"):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            pickle.dump(obj, f)
        return path

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, check=False)

    def read_trace(self, path):
        with gzip.open(path, "rt") as f:
            lines = f.read().splitlines()
        self.assertTrue(lines[0].startswith("# "), lines[0])
        return json.loads(lines[0][2:]), lines[1:]

    def test_address_reuse_gets_new_ids_and_frees_map_to_live_allocations(self):
        snap = self.write_pickle({"segments": [], "device_traces": [REUSE]})
        out = os.path.join(self.dir, "out.trace.gz")
        r = self.run_script(snap, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        header, lines = self.read_trace(out)
        self.assertEqual(lines, ["a 0 100", "a 1 200", "f 0", "a 2 300", "f 1"])
        self.assertEqual(header["source"], "pytorch-snapshot")
        self.assertEqual(header["device"], 0)
        self.assertEqual(header["events"], 5)
        self.assertEqual(header["allocs"], 3)
        self.assertEqual(header["live_at_end"], 1)
        self.assertEqual(header["peak_live_bytes"], 500)
        self.assertEqual(header["unmatched_frees"], 1)
        self.assertEqual(header["implicit_frees"], 0)
        self.assertEqual(header["actions"]["segment_alloc"], 1)
        self.assertEqual(header["actions"]["free_completed"], 2)
        self.assertEqual(header["snapshot"], "snap.pickle")

    def test_default_output_name_and_free_completed_alone(self):
        # Without free_requested events, free_completed ends the allocation.
        snap = self.write_pickle({"device_traces": [[ev("alloc", 8, 10), ev("free_completed", 8, 10),
                                                     ev("alloc", 8, 20)]]}, "model.pickle")
        r = self.run_script(snap)
        self.assertEqual(r.returncode, 0, r.stderr)
        header, lines = self.read_trace(os.path.join(self.dir, "model.trace.gz"))
        self.assertEqual(lines, ["a 0 10", "f 0", "a 1 20"])
        self.assertEqual(header["unmatched_frees"], 0)

    def test_alloc_at_a_live_address_ends_the_older_allocation(self):
        snap = self.write_pickle({"device_traces": [[ev("alloc", 8, 10), ev("alloc", 8, 30)]]})
        out = os.path.join(self.dir, "out.trace.gz")
        self.assertEqual(self.run_script(snap, "-o", out).returncode, 0)
        header, lines = self.read_trace(out)
        self.assertEqual(lines, ["a 0 10", "f 0", "a 1 30"])
        self.assertEqual(header["implicit_frees"], 1)
        self.assertEqual(header["peak_live_bytes"], 30)

    def test_device_with_most_allocations_by_default_or_chosen(self):
        snap = self.write_pickle({"device_traces": [[ev("alloc", 1, 5)], [ev("alloc", 1, 7), ev("alloc", 2, 9)]]})
        out = os.path.join(self.dir, "out.trace.gz")
        self.assertEqual(self.run_script(snap, "-o", out).returncode, 0)
        header, lines = self.read_trace(out)
        self.assertEqual(header["device"], 1)
        self.assertEqual(lines, ["a 0 7", "a 1 9"])
        self.assertEqual(self.run_script(snap, "-o", out, "--device", "0").returncode, 0)
        header, lines = self.read_trace(out)
        self.assertEqual((header["device"], lines), (0, ["a 0 5"]))
        r = self.run_script(snap, "-o", out, "--device", "5")
        self.assertEqual(r.returncode, 1)
        self.assertIn("2 device(s)", r.stderr)

    def test_rejects_what_is_not_a_snapshot(self):
        out = os.path.join(self.dir, "out.trace.gz")
        for obj, message in (([1, 2], "no 'device_traces'"), ({"device_traces": [[]]}, "no alloc events"),
                             ({"device_traces": [[ev("alloc", "x", 1)]]}, "bad addr or size")):
            r = self.run_script(self.write_pickle(obj), "-o", out)
            self.assertEqual(r.returncode, 1, obj)
            self.assertIn(message, r.stderr)
        self.assertFalse(os.path.exists(out))

    def test_refuses_pickles_that_would_run_code(self):
        path = os.path.join(self.dir, "evil.pickle")
        marker = os.path.join(self.dir, "ran")
        # A pickle that calls os.system when loaded: the converter must not load it.
        payload = b"cos\nsystem\n(S'touch " + marker.encode() + b"'\ntR."
        with open(path, "wb") as f:
            f.write(payload)
        r = self.run_script(path, "-o", os.path.join(self.dir, "out.trace.gz"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("names the class", r.stderr)
        self.assertFalse(os.path.exists(marker))

    @unittest.skipUnless(os.environ.get("DEVRT_REPLAY"), "DEVRT_REPLAY is not set")
    def test_converted_trace_replays(self):
        snap = self.write_pickle({"device_traces": [REUSE]})
        out = os.path.join(self.dir, "out.trace.gz")
        self.assertEqual(self.run_script(snap, "-o", out).returncode, 0)
        r = subprocess.run([os.environ["DEVRT_REPLAY"], out, "--json", "--no-progress"], capture_output=True,
                           text=True, check=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        figures = json.loads(r.stdout)
        self.assertEqual(figures["peak_live_bytes"], 500)
        self.assertEqual(figures["events"], 5)


if __name__ == "__main__":
    unittest.main()

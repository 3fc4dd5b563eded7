#!/usr/bin/env python3
"""Convert a PyTorch CUDA memory snapshot into a devrt allocation trace.

Input: the pickle written from ``torch.cuda.memory._snapshot()`` (for example by
``torch.cuda.memory._dump_snapshot(path)`` after ``torch.cuda.memory._record_memory_history()``).
It is a dict whose ``"device_traces"`` holds, per device, a list of events; each event is a dict
with ``"action"``, ``"addr"`` and ``"size"`` (and more that is not used here).

Output: a devrt trace (gzip'd text), read by ``devrt-replay``::

    # {"source": "pytorch-snapshot", ...}     header: JSON on the first line
    a <id> <bytes>                             allocation <id> of <bytes>
    f <id>                                     free of allocation <id>

Mapping:
  * ``alloc`` becomes ``a``: ids are dense, assigned in allocation order. An address that is
    reused after a free gets a new id.
  * ``free_requested`` becomes ``f`` for the allocation live at that address. PyTorch records
    ``free_completed`` later (when the streams that used the block are done); it is ignored when
    the allocation was already ended by its ``free_requested``, and used as the free otherwise
    (snapshots that lack ``free_requested``).
  * Segment events (``segment_alloc``, ``segment_free``, ``segment_map``, ``segment_unmap``),
    ``snapshot`` and ``oom`` are the caching allocator's own business: counted in the header,
    not replayed.
  * A free of an address with no live allocation is skipped and counted (``unmatched_frees``):
    PyTorch keeps the history in a ring buffer, so a snapshot may start after allocations that
    are freed later. An ``alloc`` at an address still live ends the older allocation first
    (counted as ``implicit_frees``); it should not happen in a consistent snapshot.

Only one device is converted: ``--device N``, by default the device with the most ``alloc``
events. The pickle is read without torch and without running code from it: only plain
containers, numbers and strings are accepted (``--trust`` lifts that, for snapshots that hold
other objects).

Usage::

    python3 tools/replay/snapshot_to_trace.py snapshot.pickle -o model.trace.gz
    devrt-replay model.trace.gz
"""

import argparse
import collections
import gzip
import json
import os
import pickle
import sys

# Classes a plain snapshot may name; anything else would run code from the file when unpickled.
_SAFE_CLASSES = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
}


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        cls = _SAFE_CLASSES.get((module, name))
        if cls is None:
            raise pickle.UnpicklingError(
                f"the snapshot names the class {module}.{name}; only plain dicts and lists are read "
                "without --trust")
        return cls


class ConversionError(Exception):
    pass


def load_snapshot(path, trust=False):
    with open(path, "rb") as f:
        if trust:
            return pickle.load(f)
        return _PlainUnpickler(f).load()


def pick_device(device_traces, device):
    if not isinstance(device_traces, list):
        raise ConversionError("'device_traces' is not a list (one list of events per device)")
    if device is not None:
        if device < 0 or device >= len(device_traces):
            raise ConversionError(f"--device {device}: the snapshot has {len(device_traces)} device(s)")
        return device
    counts = [sum(1 for e in (events or []) if isinstance(e, dict) and e.get("action") == "alloc")
              for events in device_traces]
    if not counts or max(counts) == 0:
        raise ConversionError("the snapshot has no alloc events (was memory history recorded?)")
    return counts.index(max(counts))


def convert(snapshot, device=None):
    """Returns (header dict, list of event lines) for one device of a snapshot."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ConversionError("not a PyTorch memory snapshot: no 'device_traces' key")
    traces = snapshot["device_traces"]
    dev = pick_device(traces, device)
    live = {}  # address -> id of the allocation live there
    lines = []
    actions = collections.Counter()
    next_id = 0
    live_bytes = 0
    peak_live = 0
    sizes = {}
    unmatched = 0
    implicit = 0
    for index, event in enumerate(traces[dev] or []):
        if not isinstance(event, dict):
            raise ConversionError(f"device {dev}, event {index}: not a dict")
        action = event.get("action")
        actions[action] += 1
        if action not in ("alloc", "free_requested", "free_completed"):
            continue
        try:
            addr = int(event["addr"])
            size = int(event.get("size", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise ConversionError(f"device {dev}, event {index} ({action}): bad addr or size: {e}") from e
        if action == "alloc":
            if size < 0:
                raise ConversionError(f"device {dev}, event {index}: negative size {size}")
            if addr in live:
                old = live.pop(addr)
                lines.append(f"f {old}")
                live_bytes -= sizes.pop(old)
                implicit += 1
            live[addr] = next_id
            sizes[next_id] = size
            lines.append(f"a {next_id} {size}")
            next_id += 1
            live_bytes += size
            peak_live = max(peak_live, live_bytes)
        else:
            ident = live.pop(addr, None)
            if ident is None:
                # free_completed after its free_requested, or a free from before the history.
                if action == "free_requested":
                    unmatched += 1
                continue
            lines.append(f"f {ident}")
            live_bytes -= sizes.pop(ident)
    header = {
        "source": "pytorch-snapshot",
        "device": dev,
        "events": len(lines),
        "allocs": next_id,
        "live_at_end": len(live),
        "peak_live_bytes": peak_live,
        "unmatched_frees": unmatched,
        "implicit_frees": implicit,
        "actions": {str(k): v for k, v in sorted(actions.items(), key=lambda kv: str(kv[0]))},
    }
    return header, lines


def write_trace(path, header, lines):
    with gzip.open(path, "wt", encoding="ascii", newline="\n") as f:
        f.write("# " + json.dumps(header) + "\n")
        for line in lines:
            f.write(line)
            f.write("\n")


def default_output(path):
    base = os.path.basename(path)
    for ext in (".pickle", ".pkl"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    return os.path.join(os.path.dirname(path), base + ".trace.gz")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Convert a PyTorch CUDA memory snapshot (pickle) into a devrt trace (.trace.gz).")
    parser.add_argument("snapshot", help="pickle from torch.cuda.memory._snapshot() / _dump_snapshot()")
    parser.add_argument("-o", "--output", help="trace to write (default: SNAPSHOT without .pickle + .trace.gz)")
    parser.add_argument("--device", type=int, help="device index (default: the one with the most allocations)")
    parser.add_argument("--trust", action="store_true",
                        help="unpickle any class (runs code from the file; only for snapshots you trust)")
    args = parser.parse_args(argv)
    try:
        snapshot = load_snapshot(args.snapshot, args.trust)
        header, lines = convert(snapshot, args.device)
    except (OSError, pickle.UnpicklingError, EOFError, ConversionError) as e:
        print(f"snapshot_to_trace: {args.snapshot}: {e}", file=sys.stderr)
        return 1
    header["snapshot"] = os.path.basename(args.snapshot)
    out = args.output or default_output(args.snapshot)
    try:
        write_trace(out, header, lines)
    except OSError as e:
        print(f"snapshot_to_trace: {out}: {e}", file=sys.stderr)
        return 1
    print(f"snapshot_to_trace: wrote {out}: device {header['device']}, {header['events']} events, "
          f"{header['allocs']} allocations, peak live {header['peak_live_bytes']} bytes, "
          f"{header['unmatched_frees']} unmatched frees", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

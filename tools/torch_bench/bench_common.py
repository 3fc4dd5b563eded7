"""Helpers shared by the torch_bench scripts. Imports nothing beyond the standard library, so the
self-test (and run_all's comparison code) work on a machine without PyTorch or CuPy."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

SCHEMA = 1

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent  # tools/torch_bench -> the repository
PYTHON_DIR = REPO / "python"
DEFAULT_LIB = REPO / "build" / "release" / "runtime" / "libdevrt_c.so"

BUILD_HINT = ("build it with `cmake --preset release && cmake --build build/release --target devrt_c` "
              "(on a machine with the CUDA toolkit, so that it links the CUDA backend), or pass --lib PATH")

# Exit codes of the workload scripts (run_all reads them).
EXIT_OK = 0
EXIT_WRONG = 1          # ran, but a result was wrong (data check failed)
EXIT_SETUP = 2          # could not run: missing library, no GPU, bad arguments, an exception
EXIT_NO_TRANSFORMERS = 3  # --impl auto: the transformers path is unusable here; rerun with --impl plain

TORCH_WORKLOADS = ("llama_gen", "gpt2_train", "bert_infer", "side_stream")
CUPY_WORKLOADS = ("cupy_two_streams",)
ALL_WORKLOADS = TORCH_WORKLOADS + CUPY_WORKLOADS

TORCH_ALLOCATORS = ("default", "expandable", "devrt")
CUPY_ALLOCATORS = ("default", "devrt")


def allocators_for(workload: str) -> Sequence[str]:
    return CUPY_ALLOCATORS if workload in CUPY_WORKLOADS else TORCH_ALLOCATORS


def fail(message: str, code: int = EXIT_SETUP) -> None:
    """Prints an error on stderr and exits with ``code``."""
    print(f"torch_bench: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def check_library(path: Optional[str]) -> str:
    """The absolute path of libdevrt_c.so, or exits with a message saying what was looked for."""
    p = Path(path) if path else DEFAULT_LIB
    if not p.is_absolute():
        p = Path.cwd() / p
    if not p.is_file():
        fail(f"libdevrt_c.so not found at {p}; {BUILD_HINT}")
    return str(p)


def load_hint(error: BaseException) -> str:
    """A hint for a library that exists but does not load (a dependency missing on this machine)."""
    if isinstance(error, OSError) and "cannot open shared object" in str(error):
        return ("; a library that libdevrt_c.so needs is missing here: `ldd` on it shows which; copy those "
                "(libfmt, libspdlog) from the build machine and put their folder on LD_LIBRARY_PATH")
    return ""


def check_loadable(lib_path: str) -> None:
    """Exits with a message if ``lib_path`` exists but cannot be loaded (no torch needed)."""
    import ctypes  # noqa: PLC0415

    try:
        ctypes.CDLL(lib_path)
    except OSError as e:
        fail(f"cannot load {lib_path}: {e}{load_hint(e)}")


def prepare_devrt_import(lib_path: str) -> None:
    """Makes ``import devrt`` load ``lib_path``: sets DEVRT_LIBRARY and puts python/ on sys.path."""
    os.environ["DEVRT_LIBRARY"] = lib_path
    if str(PYTHON_DIR) not in sys.path:
        sys.path.insert(0, str(PYTHON_DIR))


def f32(values) -> List[float]:
    """Floats rounded to float32's precision (9 significant digits round-trip a float32), so the
    JSON stays small and exact comparisons still hold."""
    return [float("%.9g" % float(v)) for v in values]


def group(name: str, values, mode: str, tol: float = 0.0) -> Dict[str, Any]:
    """One group of output values that run_all compares between allocators.

    mode "exact": every value equal; "rel": max_i |a_i - b_i| / max(|b_i|, 1e-6) <= tol;
    "maxabs_rel": max_i |a_i - b_i| / max_i |b_i| <= tol (for logits and activations, whose single
    values may be near zero)."""
    if mode not in ("exact", "rel", "maxabs_rel"):
        raise ValueError(f"unknown comparison mode {mode!r}")
    vals = [int(v) for v in values] if mode == "exact" else f32(values)
    return {"name": name, "mode": mode, "tol": float(tol), "values": vals}


def new_result(workload: str, allocator: str, impl: str, small: bool) -> Dict[str, Any]:
    return {
        "schema": SCHEMA, "workload": workload, "allocator": allocator, "impl": impl, "small": small,
        "ok": False, "check_ok": None, "error": None,
        "peak_reserved_bytes": None, "peak_live_bytes": None, "wall_s": None,
        "outputs": [], "checks": {}, "info": {},
    }


def write_result(path: Optional[str], result: Dict[str, Any]) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, separators=(",", ":"))
    os.replace(tmp, p)


# ---- exact references (plain integers, no torch) ----

def periodic_sum(n: int, m: int, mod: int = 1000) -> int:
    """sum over i < n of (i * m) % mod, exactly, by whole periods."""
    import math  # noqa: PLC0415

    period = mod // math.gcd(m, mod)
    one = sum((i * m) % mod for i in range(period))
    full, rest = divmod(n, period)
    return full * one + sum((i * m) % mod for i in range(rest))


def affine_sum(n: int, m: int, ops) -> int:
    """sum over i < n of f((i * m) % 1000), f applying v -> v * a + b for each (a, b) of ops in turn."""
    a_all, b_all = 1, 0
    for a, b in ops:
        a_all, b_all = a_all * a, b_all * a + b
    return a_all * periodic_sum(n, m) + b_all * n


# ---- comparison of outputs between runs (used by run_all and tested by selftest) ----

def _group_error(ref: Dict[str, Any], got: Dict[str, Any]) -> float:
    """The group's error in units of its tolerance (<= 1 agrees; 0 is identical; inf differs in
    shape or, for exact groups, in any value)."""
    a, b = got["values"], ref["values"]
    if len(a) != len(b):
        return math.inf
    mode, tol = ref["mode"], ref["tol"]
    if any(isinstance(x, float) and math.isnan(x) for x in a):
        return math.inf
    if mode == "exact":
        return 0.0 if list(a) == list(b) else math.inf
    if not b:
        return 0.0
    if mode == "rel":
        err = max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a, b))
    else:  # maxabs_rel
        scale = max(abs(y) for y in b)
        err = max(abs(x - y) for x, y in zip(a, b)) / max(scale, 1e-12)
    if err == 0.0:
        return 0.0
    return err / tol if tol > 0 else math.inf


def compare_outputs(ref: Sequence[Dict[str, Any]], got: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Compares the output groups of a run to a reference run's. Returns ``ok``, ``identical``,
    ``worst`` (error / tolerance of the worst group), ``worst_group`` and ``problems``."""
    by_name = {g["name"]: g for g in got}
    worst, worst_name, problems, identical = 0.0, None, [], True
    if not ref:
        problems.append("the reference run recorded no outputs")
    for r in ref:
        g = by_name.get(r["name"])
        if g is None:
            problems.append(f"{r['name']}: missing")
            worst, worst_name = math.inf, r["name"]
            continue
        e = _group_error(r, g)
        if e != 0.0:
            identical = False
        if e > worst or worst_name is None:
            worst, worst_name = max(worst, e), r["name"]
        if e > 1.0:
            problems.append(f"{r['name']}: error {e:.3g}x its tolerance ({r['mode']}, tol {r['tol']:g})")
    extra = set(by_name) - {r["name"] for r in ref}
    if extra:
        problems.append(f"{len(extra)} output groups the reference lacks")
    return {"ok": not problems, "identical": identical and not problems, "worst": worst,
            "worst_group": worst_name, "problems": problems}

"""Runs every torch_bench workload under every allocator, each in a fresh process, and prints a
markdown table per workload: peak reserved and live bytes, wall time of the measured part (medians
over --runs), ratios to PyTorch's default allocator, and whether the outputs agree with the default
run's.

    PYTHONPATH=python python3 tools/torch_bench/run_all.py --lib build/release/runtime/libdevrt_c.so \\
        --runs 3 --out $OUT/torch_bench.json

Writes the summary JSON to --out, the same tables as markdown next to it (.md), and each process's
JSON result and log into --runs-dir (default a temporary folder), packed into <out>_runs.tar.gz next
to --out: three files in all beside --out. Exit status: 0 all ran, every check
passed and every output agreed; 1 a wrong result, a disagreement or a failed run; 2 could not start.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as common  # noqa: E402

HERE = Path(__file__).resolve().parent

ALLOCATOR_LABELS = {
    "default": "PyTorch default",
    "expandable": "PyTorch expandable_segments",
    "devrt": "devrt",
}
CUPY_LABELS = {"default": "CuPy MemoryPool", "devrt": "devrt"}


def label(workload: str, allocator: str) -> str:
    table = CUPY_LABELS if workload in common.CUPY_WORKLOADS else ALLOCATOR_LABELS
    return table.get(allocator, allocator)


# ---- figures (no torch needed: selftest.py checks these on fake results) ----

def median(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.3f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


def fmt_ratio(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f}×"


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


def run_ok(r: Dict[str, Any]) -> bool:
    return bool(r.get("ok")) and r.get("check_ok") is not False and r.get("error") is None


def agreement(ref_runs: Sequence[Dict[str, Any]], runs: Sequence[Dict[str, Any]], is_reference: bool) -> Dict[str, Any]:
    """Compares each run's outputs with the reference allocator's run of the same index (or its first
    run with outputs). For the reference allocator itself, compares its later runs with its first."""
    ref_with = [r for r in ref_runs if r.get("outputs")]
    if not ref_with:
        return {"ok": False, "text": "no reference outputs", "compared": 0, "identical": False, "worst": None,
                "problems": ["the reference allocator produced no outputs"]}
    compared, problems, worst, identical = 0, [], 0.0, True
    for i, r in enumerate(runs):
        if not r.get("outputs"):
            continue
        if is_reference:
            if r is ref_with[0]:
                continue
            ref = ref_with[0]
        else:
            ref = ref_runs[i] if i < len(ref_runs) and ref_runs[i].get("outputs") else ref_with[0]
        c = common.compare_outputs(ref["outputs"], r["outputs"])
        compared += 1
        worst = max(worst, c["worst"])
        identical = identical and c["identical"]
        problems += [f"run {i + 1}: {p}" for p in c["problems"]]
    if is_reference and compared == 0:
        return {"ok": True, "text": "reference", "compared": 0, "identical": True, "worst": 0.0, "problems": []}
    if compared == 0:
        return {"ok": False, "text": "no outputs", "compared": 0, "identical": False, "worst": None,
                "problems": ["no run produced outputs"]}
    if problems:
        text = f"DIFFER ({len(problems)} problems, worst {worst:.3g}× tol)"
    elif identical:
        text = "identical" if not is_reference else "reference; runs identical"
    else:
        text = (f"agree (worst {worst:.2g}× tol)" if not is_reference else f"reference; runs agree ({worst:.2g}× tol)")
    return {"ok": not problems, "text": text, "compared": compared, "identical": identical and not problems,
            "worst": worst, "problems": problems}


def summarize(workload: str, runs_by_alloc: Dict[str, List[Dict[str, Any]]],
              reference: str = "default") -> Dict[str, Any]:
    """Medians, ratios to the reference allocator and agreement, per allocator."""
    rows = []
    ref_runs = runs_by_alloc.get(reference, [])
    ref_ok = [r for r in ref_runs if run_ok(r)]
    ref_res = median([r.get("peak_reserved_bytes") for r in ref_ok])
    ref_wall = median([r.get("wall_s") for r in ref_ok])
    all_ok = True
    for alloc, runs in runs_by_alloc.items():
        ok_runs = [r for r in runs if run_ok(r)]
        res = median([r.get("peak_reserved_bytes") for r in ok_runs])
        live = median([r.get("peak_live_bytes") for r in ok_runs])
        wall = median([r.get("wall_s") for r in ok_runs])
        walls = [r.get("wall_s") for r in ok_runs if r.get("wall_s") is not None]
        agree = agreement(ref_runs, runs, alloc == reference)
        failures = [f"run {i + 1}: {r.get('error') or 'failed'}" for i, r in enumerate(runs) if not run_ok(r)]
        checks = {}
        for r in runs:
            for k, v in (r.get("checks") or {}).items():
                if isinstance(v, bool):
                    checks[k] = checks.get(k, True) and v
                elif isinstance(v, (int, float)):
                    checks[k] = max(checks.get(k, 0), v)
        row_ok = not failures and agree["ok"] and len(ok_runs) == len(runs) and bool(runs)
        all_ok = all_ok and row_ok
        rows.append({
            "allocator": alloc, "label": label(workload, alloc), "runs": len(runs), "runs_ok": len(ok_runs),
            "peak_reserved_bytes": res, "peak_live_bytes": live, "wall_s": wall,
            "wall_min_s": min(walls) if walls else None, "wall_max_s": max(walls) if walls else None,
            "reserved_vs_reference": ratio(res, ref_res), "wall_vs_reference": ratio(wall, ref_wall),
            "reserved_over_live": ratio(res, live), "agreement": agree, "failures": failures,
            "checks": checks, "ok": row_ok,
        })
    return {"workload": workload, "reference": reference, "rows": rows, "ok": all_ok}


def format_table(summary: Dict[str, Any], impl: Optional[str] = None) -> str:
    w = summary["workload"]
    models = w in ("llama_gen", "gpt2_train", "bert_infer") and impl
    head = f"### {w}" + (f" (models: {impl})" if models else "")
    lines = [head, "",
             "| allocator | runs ok | peak reserved | × default | peak live | reserved / live | wall (s) | × default "
             "| outputs vs default | checks |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.3f}"
        if r["wall_min_s"] is not None and r["runs_ok"] > 1:
            wall += f" ({r['wall_min_s']:.3f}–{r['wall_max_s']:.3f})"
        checks = ", ".join(f"{k}={'ok' if v is True else ('FAIL' if v is False else v)}" for k, v in r["checks"].items())
        lines.append(
            f"| {r['label']} | {r['runs_ok']}/{r['runs']} | {fmt_bytes(r['peak_reserved_bytes'])} | "
            f"{fmt_ratio(r['reserved_vs_reference'])} | {fmt_bytes(r['peak_live_bytes'])} | "
            f"{fmt_ratio(r['reserved_over_live'])} | {wall} | {fmt_ratio(r['wall_vs_reference'])} | "
            f"{r['agreement']['text']} | {checks or '-'} |")
    notes = []
    for r in summary["rows"]:
        for f in r["failures"]:
            notes.append(f"- {r['label']}: {f}")
        for p in r["agreement"]["problems"][:5]:
            notes.append(f"- {r['label']}: outputs: {p}")
    if notes:
        lines += [""] + notes
    return "\n".join(lines) + "\n"


def strip_outputs(r: Dict[str, Any]) -> Dict[str, Any]:
    out = {k: v for k, v in r.items() if k != "outputs"}
    out["output_groups"] = len(r.get("outputs") or [])
    return out


# ---- running the processes ----

def child_env(allocator: str, lib: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)  # the newer name PyTorch reads too
    if allocator == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if allocator == "devrt" and lib:
        env["DEVRT_LIBRARY"] = lib
    else:
        env.pop("DEVRT_LIBRARY", None)
    pp = env.get("PYTHONPATH", "")
    parts = [p for p in pp.split(os.pathsep) if p]
    if str(common.PYTHON_DIR) not in parts:
        parts.insert(0, str(common.PYTHON_DIR))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("HF_HUB_OFFLINE", "1")  # never reach the network (nothing here downloads)
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def command(python: str, workload: str, allocator: str, lib: Optional[str], out: Path, small: bool,
            impl: str, deterministic: int) -> List[str]:
    if workload in common.CUPY_WORKLOADS:
        cmd = [python, str(HERE / "cupy_workload.py"), "--allocator", allocator, "--out", str(out)]
    else:
        cmd = [python, str(HERE / "workload.py"), "--workload", workload, "--allocator", allocator, "--out", str(out),
               "--impl", impl, "--deterministic", str(deterministic)]
    if allocator == "devrt" and lib:
        cmd += ["--lib", lib]
    if small:
        cmd.append("--small")
    return cmd


def run_one(cmd: List[str], env: Dict[str, str], out: Path, log: Path, timeout: float, workload: str,
            allocator: str) -> tuple:
    if out.exists():
        out.unlink()
    t0 = time.perf_counter()
    with open(log, "w") as lf:
        lf.write("$ " + " ".join(cmd) + "\n")
        lf.flush()
        try:
            rc = subprocess.run(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, timeout=timeout,
                                cwd=str(common.REPO)).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    elapsed = time.perf_counter() - t0
    result: Dict[str, Any]
    if out.exists():
        try:
            result = json.loads(out.read_text())
        except ValueError as e:
            result = common.new_result(workload, allocator, "?", False)
            result["error"] = f"unreadable result {out}: {e}"
    else:
        result = common.new_result(workload, allocator, "?", False)
        lines = [ln for ln in log.read_text(errors="replace").strip().splitlines()[1:] if ln.strip()]
        result["error"] = (f"timed out after {timeout:.0f} s" if rc == -1 else f"exit status {rc}, no result; "
                           + " / ".join(lines[-2:]))
    if rc != 0 and result.get("error") is None:
        result["error"] = f"exit status {rc}"
    if rc != 0:
        result["ok"] = False
        result["log_tail"] = log.read_text(errors="replace").splitlines()[-40:]
    result["exit_status"] = rc
    result["process_s"] = elapsed
    return rc, result


def archive_path(out: Path) -> Path:
    return out.with_name(out.stem + "_runs.tar.gz")


def write_outputs(out: Path, report: Dict[str, Any], tables: List[str], run_dir: Path, started: str, args) -> None:
    """The summary JSON, the markdown tables and the archive of the per-run files."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, out)
    partial = "" if report.get("complete") else " (incomplete: later workloads have not run)"
    out.with_suffix(".md").write_text(
        f"# torch_bench ({started}, {args.runs} runs{', small' if args.small else ''}){partial}\n\n"
        + "\n".join(tables))
    archive = archive_path(out)
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(str(run_dir), arcname="torch_bench_runs")
    os.replace(tmp, archive)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", default=str(common.DEFAULT_LIB), help="libdevrt_c.so (default build/release/runtime/)")
    p.add_argument("--runs", type=int, default=3, help="fresh processes per workload and allocator (default 3)")
    p.add_argument("--out", default="torch_bench.json", help="summary JSON (default ./torch_bench.json)")
    p.add_argument("--small", action="store_true", help="smaller models and fewer steps (a quick pass)")
    p.add_argument("--workloads", default=",".join(common.ALL_WORKLOADS),
                   help="comma-separated subset of " + ",".join(common.ALL_WORKLOADS))
    p.add_argument("--allocators", default=",".join(common.TORCH_ALLOCATORS),
                   help="comma-separated subset of default,expandable,devrt (CuPy: default,devrt)")
    p.add_argument("--impl", default="auto", choices=("auto", "transformers", "plain"),
                   help="models from transformers or plain torch.nn; auto falls back to plain, for all "
                        "allocators of a workload, when the first run finds transformers unusable")
    p.add_argument("--deterministic", type=int, default=1, choices=(0, 1))
    p.add_argument("--python", default=sys.executable, help="the interpreter for the workload processes")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per process (default 300)")
    p.add_argument("--runs-dir", default=None,
                   help="folder for each process's JSON result and log (default: a new temporary folder; "
                        "they are also packed into <out>_runs.tar.gz next to --out)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    allocators = [a for a in args.allocators.split(",") if a]
    bad = [w for w in workloads if w not in common.ALL_WORKLOADS]
    if bad:
        common.fail(f"unknown workloads {bad}; known: {', '.join(common.ALL_WORKLOADS)}")
    bad = [a for a in allocators if a not in common.TORCH_ALLOCATORS]
    if bad:
        common.fail(f"unknown allocators {bad}; known: {', '.join(common.TORCH_ALLOCATORS)}")
    if args.runs < 1:
        common.fail("--runs must be at least 1")
    lib = None
    if "devrt" in allocators:
        if args.dry_run:
            lib = str(Path(args.lib).resolve())
        else:
            lib = common.check_library(args.lib)
            common.check_loadable(lib)
    out = Path(args.out).resolve()
    if args.runs_dir:
        run_dir = Path(args.runs_dir).resolve()
    elif args.dry_run:
        run_dir = Path(tempfile.gettempdir()) / "torch_bench_runs"
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="torch_bench_runs_"))
    if not args.dry_run:
        run_dir.mkdir(parents=True, exist_ok=True)

    plan = []  # (workload, run index, allocator)
    for w in workloads:
        allowed = [a for a in allocators if a in common.allocators_for(w)]
        for r in range(args.runs):
            for a in allowed:
                plan.append((w, r, a))
    if args.dry_run:
        for w, r, a in plan:
            f = run_dir / f"{w}.{a}.run{r + 1}.json"
            print(" ".join(command(args.python, w, a, lib, f, args.small, args.impl, args.deterministic)))
        return 0

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t_all = time.perf_counter()
    report: Dict[str, Any] = {"schema": common.SCHEMA, "started": started, "argv": sys.argv, "lib": lib,
                              "runs": args.runs, "small": args.small, "workloads": {}}
    tables = []
    overall_ok = True
    step = 0
    for w in workloads:
        impl = args.impl if w not in ("side_stream",) + common.CUPY_WORKLOADS else "plain"
        allowed = [a for a in allocators if a in common.allocators_for(w)]
        while True:  # once more with --impl plain if the first run finds transformers unusable
            runs: Dict[str, List[Dict[str, Any]]] = {a: [] for a in allowed}
            restart = False
            for r in range(args.runs):
                for a in allowed:
                    step += 1
                    f = run_dir / f"{w}.{a}.run{r + 1}.json"
                    log = run_dir / f"{w}.{a}.run{r + 1}.log"
                    cmd = command(args.python, w, a, lib, f, args.small, impl, args.deterministic)
                    print(f"[{step}/{len(plan)}] {w} {a} run {r + 1}/{args.runs} ...", end=" ", flush=True)
                    rc, res = run_one(cmd, child_env(a, lib), f, log, args.timeout, w, a)
                    first = r == 0 and a == allowed[0]
                    if rc == common.EXIT_NO_TRANSFORMERS and impl == "auto" and first:
                        print(f"transformers unusable ({res.get('error')}); running {w} with plain torch.nn models",
                              flush=True)
                        impl, restart = "plain", True
                        break
                    if impl == "auto" and first and rc == 0:
                        impl = res.get("impl") or impl  # every later run uses what the first one used
                    wall = res.get("wall_s")
                    print(("ok" if run_ok(res) else f"FAILED: {res.get('error')} (log: {log})")
                          + (f", wall {wall:.3f} s" if wall is not None else "")
                          + f", process {res['process_s']:.1f} s", flush=True)
                    runs[a].append(res)
                if restart:
                    break
            if not restart:
                break
            step -= 1
        summary = summarize(w, runs)
        table = format_table(summary, impl)
        print("\n" + table, flush=True)
        tables.append(table)
        overall_ok = overall_ok and summary["ok"]
        report["workloads"][w] = {"impl": impl, "summary": summary,
                                  "runs": {a: [strip_outputs(x) for x in rs] for a, rs in runs.items()}}
        report["total_s"] = time.perf_counter() - t_all
        report["ok"] = overall_ok
        report["complete"] = w == workloads[-1]
        write_outputs(out, report, tables, run_dir, started, args)  # after each workload: a cut-off run keeps its figures
    print(f"total {report['total_s']:.0f} s; summary: {out}; tables: {out.with_suffix('.md')}; per-run results and "
          f"logs: {run_dir} (packed in {archive_path(out)})")
    if not overall_ok:
        print("torch_bench: FAILED: a run failed, a check found wrong results, or outputs differ (see above)")
        return common.EXIT_WRONG
    print("torch_bench: all runs ok, every check passed, outputs agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())

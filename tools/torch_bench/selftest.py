"""Checks the torch_bench scripts on a machine without a GPU, PyTorch or CuPy: every script parses,
the workload schedules are sane, the scripts fail with clear messages where they cannot run, and
run_all's medians, ratios, agreement and tables work on fake results.

    python3 tools/torch_bench/selftest.py          # prints "torch_bench selftest: ok"
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_common as common  # noqa: E402
import run_all  # noqa: E402

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAILED: {what}")


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_parse():
    for f in sorted(HERE.glob("*.py")):
        try:
            ast.parse(f.read_text(), filename=str(f))
            compile(f.read_text(), str(f), "exec")
        except SyntaxError as e:
            expect(False, f"{f.name} does not parse: {e}")
    for name in ("workload.py", "cupy_workload.py", "run_all.py", "bench_common.py", "README.md"):
        expect((HERE / name).is_file(), f"{name} exists")


def test_schedules():
    import workload  # imports no torch at module level
    import cupy_workload

    for small in (False, True):
        c = workload.llama_config(small)
        expect(all(1 <= b <= 8 and 32 <= p <= 512 for b, p in c["requests"]), "llama requests: batch 1-8, prompt 32-512")
        expect(c["hidden"] % c["heads"] == 0, "llama: hidden divisible by heads")
        c = workload.gpt2_config(small)
        expect(all(s <= c["positions"] for _, s in c["shapes"]), "gpt2: sequences fit n_positions")
        expect(len({s for _, s in c["shapes"]}) > 1, "gpt2: shapes vary")
        c = workload.bert_config(small)
        expect(all(1 <= b <= 64 and 16 <= s <= c["positions"] for b, s in c["shapes"]), "bert: batch 1-64, seq 16-512")
        c = workload.side_stream_config(small)
        expect(len(c["sizes"]) == c["iters"], "side_stream: a size per iteration")
        # int32 range of the chain x -> x*a+b over four hops, x < 1000
        hi = 999
        for a, b in [(1, 1), (3, 0), (1, -5), (2, 7)]:
            hi = hi * a + abs(b)
        expect(hi < 2 ** 31, "side_stream values fit int32")
        c = cupy_workload.config(small)
        expect(len(c["sizes"]) == c["iters"], "cupy: a size per iteration")
    # The same schedule every time (every allocator's process must see the same shapes).
    expect(workload.gpt2_config(False) == workload.gpt2_config(False), "gpt2 schedule is deterministic")
    expect(workload.bert_config(False) == workload.bert_config(False), "bert schedule is deterministic")
    # cupy's closed-form expected sum against a direct sum.
    (a, b), (a2, b2) = cupy_workload.OPS
    for n, m in [(1, 1), (1000, 3), (4097, 8), (12345, 13), (1 << 14, 10)]:
        direct = sum((((i * m) % 1000) * a + b) * a2 + b2 for i in range(n))
        expect(cupy_workload.expected_sum(n, m) == direct, f"cupy expected_sum({n}, {m})")
    expect(set(workload.RUNNERS) == set(common.TORCH_WORKLOADS), "workload.py runs every torch workload")
    # side_stream's exact sums: the affine chain of its four hops against a direct sum.
    ops = [(1, 1), (3, 0), (1, -5), (2, 7)]
    for n, m in [(1, 1), (999, 7), (5000, 10), (12289, 13)]:
        for hops in (1, 4):
            direct = 0
            for i in range(n):
                v = (i * m) % 1000
                for a_, b_ in ops[:hops]:
                    v = v * a_ + b_
                direct += v
            expect(common.affine_sum(n, m, ops[:hops]) == direct, f"affine_sum({n}, {m}, {hops} hops)")


def result(alloc, reserved, live, wall, loss_scale=1.0, ok=True, check_ok=True, outputs=True):
    r = common.new_result("gpt2_train", alloc, "transformers", False)
    r.update({"ok": ok, "check_ok": check_ok, "peak_reserved_bytes": reserved, "peak_live_bytes": live,
              "wall_s": wall, "checks": {"finite_losses": check_ok}})
    if outputs:
        r["outputs"] = [common.group("loss", [10.0 * loss_scale, 9.5 * loss_scale, 9.0], "rel", 1e-3),
                        common.group("step0.logits", [0.5, -2.0, 0.0], "maxabs_rel", 1e-2),
                        common.group("sums", [12345678901, 2, 3], "exact")]
    return r


def test_compare():
    base = result("default", 1, 1, 1)["outputs"]
    same = common.compare_outputs(base, copy.deepcopy(base))
    expect(same["ok"] and same["identical"] and same["worst"] == 0.0, "identical outputs agree")
    near = copy.deepcopy(base)
    near[0]["values"][0] *= 1 + 5e-4  # within 1e-3
    near[1]["values"][2] = 0.015       # 0.015 / 2.0 = 0.0075 < 1e-2
    c = common.compare_outputs(base, near)
    expect(c["ok"] and not c["identical"] and 0 < c["worst"] <= 1, f"near outputs agree ({c})")
    far = copy.deepcopy(base)
    far[0]["values"][1] *= 1.01
    c = common.compare_outputs(base, far)
    expect(not c["ok"] and c["worst_group"] == "loss", f"a loss 1% off differs ({c})")
    ex = copy.deepcopy(base)
    ex[2]["values"][0] += 1
    expect(not common.compare_outputs(base, ex)["ok"], "an exact group one off differs")
    short = copy.deepcopy(base)
    short[1]["values"].pop()
    expect(not common.compare_outputs(base, short)["ok"], "a group of another length differs")
    missing = copy.deepcopy(base)[:2]
    expect(not common.compare_outputs(base, missing)["ok"], "a missing group differs")
    nan = copy.deepcopy(base)
    nan[1]["values"][0] = float("nan")
    expect(not common.compare_outputs(base, nan)["ok"], "NaN differs")
    expect(common.group("x", [1 / 3], "rel")["values"][0] == float("%.9g" % (1 / 3)), "floats rounded to float32 digits")
    # JSON round trip keeps the comparison exact.
    rt = json.loads(json.dumps(base))
    expect(common.compare_outputs(base, rt)["identical"], "JSON round trip stays identical")


def test_summary_and_table():
    g = 1 << 30
    runs = {
        "default": [result("default", 10 * g, 7 * g, 2.0), result("default", 10 * g, 7 * g, 2.2),
                    result("default", 10 * g, 7 * g, 1.9)],
        "expandable": [result("expandable", 8 * g, 7 * g, 2.4) for _ in range(3)],
        "devrt": [result("devrt", 7.2 * g, 7 * g, 2.1), result("devrt", 7.4 * g, 7 * g, 2.0),
                  result("devrt", 7.3 * g, 7 * g, 2.3, loss_scale=1 + 2e-4)],
    }
    s = run_all.summarize("gpt2_train", runs)
    rows = {r["allocator"]: r for r in s["rows"]}
    expect(s["ok"], f"all-good summary is ok ({[r['failures'] + r['agreement']['problems'] for r in s['rows']]})")
    expect(rows["default"]["wall_s"] == 2.0, "median wall of the default runs")
    expect(abs(rows["devrt"]["reserved_vs_reference"] - 0.73) < 1e-9, "devrt reserved ratio = median 7.3 / 10")
    expect(abs(rows["devrt"]["wall_vs_reference"] - 1.05) < 1e-9, "devrt wall ratio = 2.1 / 2.0")
    expect(abs(rows["expandable"]["reserved_over_live"] - 8 / 7) < 1e-9, "reserved / live")
    expect(rows["default"]["agreement"]["text"].startswith("reference"), "default is the reference")
    expect(rows["expandable"]["agreement"]["identical"], "expandable identical")
    expect(rows["devrt"]["agreement"]["ok"] and not rows["devrt"]["agreement"]["identical"], "devrt agrees, not bitwise")
    t = run_all.format_table(s, "transformers")
    lines = [ln for ln in t.splitlines() if ln.startswith("|")]
    expect(len(lines) == 5, f"table has a header, a rule and three rows ({len(lines)})")
    expect(all(ln.count("|") == lines[0].count("|") for ln in lines), "table rows have the header's columns")
    expect("0.730×" in t and "10.000 GiB" in t and "identical" in t, "table shows ratios, GiB and agreement")

    bad = copy.deepcopy(runs)
    bad["devrt"][1] = result("devrt", 7 * g, 7 * g, 2.0, loss_scale=1.05)
    bad["expandable"][2] = result("expandable", 8 * g, 7 * g, 2.4, ok=False, check_ok=False)
    bad["expandable"][2]["error"] = "wrong result: {'finite_losses': False}"
    s = run_all.summarize("gpt2_train", bad)
    rows = {r["allocator"]: r for r in s["rows"]}
    expect(not s["ok"], "a summary with a disagreement and a wrong result is not ok")
    expect(not rows["devrt"]["agreement"]["ok"] and "DIFFER" in rows["devrt"]["agreement"]["text"],
           "devrt disagreement reported")
    expect(rows["expandable"]["runs_ok"] == 2 and rows["expandable"]["failures"], "failed run counted")
    expect(rows["expandable"]["checks"]["finite_losses"] is False, "a failed check shows")
    t = run_all.format_table(s, "transformers")
    expect("DIFFER" in t and "2/3" in t and "wrong result" in t, "table shows the failures")

    # A workload whose processes all crashed: no figures, not ok, still a table.
    crashed = {"default": [common.new_result("side_stream", "default", "plain", False)], "devrt": []}
    crashed["default"][0]["error"] = "exit status 2, no result"
    s = run_all.summarize("side_stream", crashed)
    expect(not s["ok"], "crashed summary not ok")
    t = run_all.format_table(s, "plain")
    expect("| - |" in t, "missing figures print as -")

    # Exact workloads with counters in checks.
    ss = {a: [dict(result(a, g, g, 1.0), checks={"four_sides.wrong_elements": 0}) for _ in range(2)]
          for a in ("default", "devrt")}
    ss["devrt"][1]["checks"] = {"four_sides.wrong_elements": 12}
    s = run_all.summarize("side_stream", ss)
    rows = {r["allocator"]: r for r in s["rows"]}
    expect(rows["devrt"]["checks"]["four_sides.wrong_elements"] == 12, "the largest wrong count shows")


def run(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120)


def test_command_lines():
    py = sys.executable
    with tempfile.TemporaryDirectory() as d:
        # run_all: a missing library is a clear error, exit 2.
        r = run([py, str(HERE / "run_all.py"), "--lib", f"{d}/nope/libdevrt_c.so", "--out", f"{d}/x.json"])
        expect(r.returncode == 2 and "libdevrt_c.so not found" in r.stderr and "cmake" in r.stderr,
               f"run_all names the missing library ({r.returncode}, {r.stderr.strip()})")
        # run_all: a library that exists but does not load is a clear error too.
        junk = Path(d) / "junk" / "libdevrt_c.so"
        junk.parent.mkdir()
        junk.write_bytes(b"not an ELF file")
        r = run([py, str(HERE / "run_all.py"), "--lib", str(junk), "--out", f"{d}/x.json"])
        expect(r.returncode == 2 and "cannot load" in r.stderr, f"run_all names a library that does not load ({r.stderr})")
        # run_all --dry-run: every workload, allocator and run, fresh processes.
        fake = Path(d) / "libdevrt_c.so"
        fake.write_bytes(b"")
        r = run([py, str(HERE / "run_all.py"), "--lib", str(fake), "--runs", "3", "--out", f"{d}/x.json", "--dry-run"])
        lines = r.stdout.strip().splitlines()
        expect(r.returncode == 0 and len(lines) == 4 * 3 * 3 + 1 * 2 * 3, f"dry run lists 42 processes ({len(lines)})")
        expect(sum("cupy_workload.py" in ln for ln in lines) == 6, "cupy workload under default and devrt")
        expect(all("--lib" in ln for ln in lines if "--allocator devrt" in ln), "devrt runs get --lib")
        r = run([py, str(HERE / "run_all.py"), "--workloads", "nope", "--out", f"{d}/x.json", "--dry-run"])
        expect(r.returncode == 2 and "unknown workloads" in r.stderr, "unknown workload refused")
        # The workload scripts: --help needs no torch; without torch (or a GPU) a clear error, exit 2.
        for script in ("workload.py", "cupy_workload.py"):
            r = run([py, str(HERE / script), "--help"])
            expect(r.returncode == 0 and "--allocator" in r.stdout, f"{script} --help")
        r = run([py, str(HERE / "workload.py"), "--workload", "side_stream", "--allocator", "devrt", "--lib",
                 f"{d}/nope.so", "--out", f"{d}/w.json"])
        expect(r.returncode == 2 and "libdevrt_c.so not found" in r.stderr, f"workload names the missing library ({r.stderr})")
        if not have("torch"):
            r = run([py, str(HERE / "workload.py"), "--workload", "gpt2_train", "--allocator", "default",
                     "--out", f"{d}/w.json"])
            expect(r.returncode == 2 and "PyTorch is not installed" in r.stderr, f"no torch: clear error ({r.stderr})")
        if not have("cupy"):
            r = run([py, str(HERE / "cupy_workload.py"), "--allocator", "default", "--out", f"{d}/c.json"])
            expect(r.returncode == 2 and "CuPy is not installed" in r.stderr, f"no cupy: clear error ({r.stderr})")
        r = run([py, str(HERE / "workload.py"), "--workload", "side_stream", "--allocator", "default"],
                env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
        expect(r.returncode == 2, "workload refuses a stray PYTORCH_CUDA_ALLOC_CONF (or lacks torch)")
    env = run_all.child_env("expandable", None)
    expect(env.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True", "expandable child env")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    try:
        expect("PYTORCH_CUDA_ALLOC_CONF" not in run_all.child_env("default", None), "default child env is clean")
        expect(run_all.child_env("devrt", "/x/libdevrt_c.so").get("DEVRT_LIBRARY") == "/x/libdevrt_c.so",
               "devrt child env names the library")
    finally:
        del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
    expect(str(common.PYTHON_DIR) in run_all.child_env("default", None)["PYTHONPATH"], "children see python/")


FAKE_PYTHON = r'''#!%(python)s
# Stands in for python3 + workload.py / cupy_workload.py: writes a plausible result from the arguments.
import json, sys
sys.path.insert(0, %(here)r)
import bench_common as common
args = sys.argv[2:]
opt = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--") and not args[i + 1].startswith("--")}
w = opt.get("--workload", "cupy_two_streams")
a = opt["--allocator"]
impl = opt.get("--impl", "cupy")
if w == "llama_gen" and impl == "auto":
    print("torch_bench: transformers path unusable: a fake API change", file=sys.stderr)
    sys.exit(common.EXIT_NO_TRANSFORMERS)
r = common.new_result(w, a, "plain" if impl == "auto" else impl, "--small" in args)
scale = {"default": 1.0, "expandable": 0.9, "devrt": 0.8}[a]
r.update(ok=True, check_ok=True, peak_reserved_bytes=int(2e9 * scale), peak_live_bytes=int(1.5e9), wall_s=1.0 + scale,
         checks={"wrong_elements": 0})
loss = [10.0, 9.0]
if w == "bert_infer" and a == "devrt":
    loss = [10.0, 9.5]  # a disagreement
r["outputs"] = [common.group("loss", loss, "rel", 1e-3)]
common.write_result(opt["--out"], r)
print(w, a, "ok")
'''


def test_run_all_loop():
    """run_all's whole loop with a fake interpreter: fallback to plain models, tables, files, status."""
    with tempfile.TemporaryDirectory() as d:
        fake = Path(d) / "fakepython"
        fake.write_text(FAKE_PYTHON % {"python": sys.executable, "here": str(HERE)})
        fake.chmod(0o755)
        lib = Path(d) / "lib" / "libdevrt_c.so"
        lib.parent.mkdir()
        import shutil

        real = common.DEFAULT_LIB
        if not real.is_file():
            print("selftest: (no build/release/runtime/libdevrt_c.so: run_all's loop is checked without devrt)")
            allocs = "default,expandable"
        else:
            shutil.copy(real, lib)
            allocs = "default,expandable,devrt"
        out = Path(d) / "out" / "tb.json"
        r = run([sys.executable, str(HERE / "run_all.py"), "--python", str(fake), "--lib", str(lib), "--runs", "2",
                 "--allocators", allocs, "--workloads", "llama_gen,gpt2_train,bert_infer,cupy_two_streams",
                 "--out", str(out)])
        n_alloc = len(allocs.split(","))
        expect("running llama_gen with plain torch.nn models" in r.stdout, "fallback to plain announced")
        expect(out.is_file() and out.with_suffix(".md").is_file() and (out.parent / "tb_runs.tar.gz").is_file(),
               f"summary, tables and archive written ({sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else None})")
        if not out.is_file():
            print(r.stdout, r.stderr)
            return
        rep = json.loads(out.read_text())
        expect(rep["workloads"]["llama_gen"]["impl"] == "plain", "llama_gen ran with plain models after the fallback")
        expect(all(len(v) == 2 for v in rep["workloads"]["llama_gen"]["runs"].values()), "two runs of each allocator")
        expect(len(rep["workloads"]["cupy_two_streams"]["runs"]) == (2 if n_alloc == 3 else 1),
               "cupy: no expandable runs")
        gpt = {x["allocator"]: x for x in rep["workloads"]["gpt2_train"]["summary"]["rows"]}
        expect(abs(gpt["expandable"]["reserved_vs_reference"] - 0.9) < 1e-6, "ratio from the fake runs")
        expect(rep["workloads"]["gpt2_train"]["summary"]["ok"], "gpt2 ok")
        if n_alloc == 3:
            expect(not rep["workloads"]["bert_infer"]["summary"]["ok"], "the fake disagreement is caught")
            expect(r.returncode == 1 and "FAILED" in r.stdout, f"exit status 1 on a disagreement ({r.returncode})")
        else:
            expect(r.returncode == 0, f"exit status 0 when all agree ({r.returncode}: {r.stdout[-500:]})")
        expect(rep["complete"], "summary marked complete")
        md = out.with_suffix(".md").read_text()
        expect(md.count("### ") == 4, "a table per workload")


def test_torch_summary():
    """torch_summary.py (tools/gpu/run.sh torch-bench): medians per workload and allocator, with the
    allocator read from the file name, failed runs counted and left out."""
    with tempfile.TemporaryDirectory() as d:
        runs = {"default": [3.0, 1.0, 2.0], "devrt-posted": [5.0, 4.0, 6.0]}
        for alloc, walls in runs.items():
            for i, w in enumerate(walls, 1):
                r = {"ok": True, "wall_s": w, "peak_reserved_bytes": int(w * 1e9), "num_device_alloc": i}
                (Path(d) / f"torch_gpt2_train_{alloc}_{i}.json").write_text(json.dumps(r))
        (Path(d) / "torch_gpt2_train_devrt_1.json").write_text(json.dumps({"ok": False, "error": "x"}))
        files = sorted(str(p) for p in Path(d).glob("*.json"))
        r = subprocess.run([sys.executable, str(HERE / "torch_summary.py"), *files], capture_output=True, text=True)
        expect(r.returncode == 0, f"torch_summary exit status 0 ({r.returncode}: {r.stderr[-300:]})")
        rows = {line.split("|")[2].strip(): line for line in r.stdout.splitlines() if line.startswith("| gpt2_train")}
        expect(set(rows) == {"default", "devrt", "devrt-posted"}, f"a row per allocator: {sorted(rows)}")
        expect("| 2.000 (3.000, 1.000, 2.000) |" in rows.get("default", ""), f"default's median: {rows.get('default')}")
        expect("| 2.000 (1.000-3.000) |" in rows.get("default", ""), f"default's peak: {rows.get('default')}")
        expect("| 5.000 (5.000, 4.000, 6.000) |" in rows.get("devrt-posted", ""), "devrt-posted kept apart")
        expect("0 of 1" in rows.get("devrt", ""), f"the failed run counted: {rows.get('devrt')}")
        r = subprocess.run([sys.executable, str(HERE / "torch_summary.py"), str(Path(d) / "nothing.json")],
                           capture_output=True, text=True)
        expect(r.returncode == 1 and "no results" in r.stderr, "no results: exit status 1")


def main() -> int:
    for t in (test_parse, test_schedules, test_compare, test_summary_and_table, test_command_lines, test_run_all_loop,
              test_torch_summary):
        try:
            t()
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            expect(False, f"{t.__name__} raised {type(e).__name__}: {e}")
    if failures:
        print(f"torch_bench selftest: {len(failures)} FAILED")
        return 1
    print("torch_bench selftest: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

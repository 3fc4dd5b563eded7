#!/usr/bin/env bash
# Two builds of devrt in turns on the GPU machine: the packed one (.gpu/bin, tools/gpu/pack.sh)
# against another (.gpu/base: its devrt-replay and devrt_inference_server, for example built from
# an older commit in a git worktree and copied there before the device tool carries .gpu).
#
#   MJ=1 ROUNDS=3 TRACES="bert_serve syn_kvgrow0 ..." bash tools/gpu/ab.sh
#
# MJ=1 (default): the main job on cuda (MJ_DEVICE=sim-gpu: the simulated GPU, which runs here too),
# at its defaults and with --hidden 4096 --threads 16, MJ_ROUNDS rounds (default 5), the two builds
# first in turn: efficiency, requests/s, maps and unmaps of each run, then the medians.
# Then each trace of .gpu/traces named in TRACES, ROUNDS times (default 3) in rotated order, under
# both builds, cudaMallocAsync and PyTorch's allocator (default and expandable segments; its
# baseline program is built first, tools/replay/build_torch_baseline.sh): best and median
# ns/event, peak reserved / peak live, maps, unmaps and failed allocations of each. CAP (say
# "--memory-limit 1.05x") is passed to every replay. TORCH_WORKLOADS (say "bert_infer llama_gen"):
# tools/torch_bench/workload.py under PyTorch's default, expandable segments and devrt with each
# build's libdevrt_c.so (.gpu/base/libdevrt_c.so against .gpu/lib's), TORCH_RUNS times (default 3)
# in rotated order: median wall seconds and peak reserved. TORCH_VARIANTS picks among default,
# expandable, base and bin (default: all four). The runs' JSON files and logs stay in $WORK (default
# /tmp/devrt-ab); only a line per run as it ends (torch_runs.txt: a call cut by a timeout still
# reports) and the summary (torch_summary.txt) go to $OUT, which the device tool returns.
set -u
cd "$(dirname "$0")/../.."
. tools/gpu/replay_one.sh
G=$PWD/.gpu
T=$G/traces
OUT=${OUT:-$G/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
WORK=${WORK:-/tmp/devrt-ab}
mkdir -p "$WORK"
read -r -a vs <<<"${TORCH_VARIANTS:-default expandable base bin}"
needs_base=0
[ "${MJ:-1}" = 1 ] || [ -n "${TRACES:-}" ] && needs_base=1
for v in "${vs[@]}"; do [ "$v" = base ] && [ -n "${TORCH_WORKLOADS:-}" ] && needs_base=1; done
if [ $needs_base = 1 ] && [ ! -x "$G/base/devrt-replay" ]; then
  echo "ab: no $G/base/devrt-replay (the build to compare against)" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
if [ "${MJ:-1}" = 1 ]; then
  : >"$WORK/mj.txt"
  for r in $(seq "${MJ_ROUNDS:-5}"); do
    for cfg in "" "--hidden 4096 --threads 16"; do
      if ((r % 2)); then order="base bin"; else order="bin base"; fi
      for b in $order; do
        o=$(timeout 60 "$G/$b/devrt_inference_server" --device "${MJ_DEVICE:-cuda}" --no-progress $cfg 2>&1)
        e=$(echo "$o" | grep efficiency | sed -E 's/.*= ([0-9.]+)%.*/\1/')
        tp=$(echo "$o" | grep "^throughput" | sed -E 's/.*s: ([0-9.]+) requests.*/\1/')
        mu=$(echo "$o" | grep "^statistics" | grep -oE "[0-9]+ maps, [0-9]+ unmaps")
        echo "main job [${cfg:-defaults}] $b round $r: efficiency $e%, $tp requests/s, $mu" | tee -a "$WORK/mj.txt"
      done
    done
  done
  python3 - "$WORK/mj.txt" <<'PY' | tee "$OUT/main_job_summary.txt"
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"main job \[(.*)\] (\w+) round \d+: efficiency ([0-9.]+)%, ([0-9.]+) requests/s, (\d+) maps", line)
    if m:
        rows.setdefault((m[1], m[2]), []).append((float(m[3]), float(m[4]), int(m[5])))
for (cfg, b), v in sorted(rows.items()):
    e = [x[0] for x in v]
    print(f"main job [{cfg}] {b}: {len(v)} runs, efficiency median {statistics.median(e):.1f}% ({min(e):.1f}-{max(e):.1f}), "
          f"requests/s median {statistics.median(x[1] for x in v):.0f}, maps median {statistics.median(x[2] for x in v):.0f}")
PY
fi
if [ -n "${TORCH_WORKLOADS:-}" ]; then
  nv=${#vs[@]}
  rm -f "$WORK"/ab_*.json
  : >"$OUT/torch_runs.txt"
  for w in $TORCH_WORKLOADS; do
    for r in $(seq "${TORCH_RUNS:-3}"); do
      for ((i = 0; i < nv; ++i)); do
        v=${vs[$(((i + r - 1) % nv))]}
        case $v in
          default | expandable) a=$v lib=$G/lib/libdevrt_c.so ;;
          base) a=devrt lib=$G/base/libdevrt_c.so ;;
          bin) a=devrt lib=$G/lib/libdevrt_c.so ;;
        esac
        PYTHONPATH=python timeout 150 python3 tools/torch_bench/workload.py --workload "$w" --allocator "$a" \
          --lib "$lib" --out "$WORK/ab_${w}_${v}_$r.json" >"$WORK/ab_${w}_${v}_$r.log" 2>&1 ||
          echo "ab: $w under $v, run $r failed: $(tail -1 "$WORK/ab_${w}_${v}_$r.log")"
        [ -f "$WORK/ab_${w}_${v}_$r.json" ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], d.get("ok"), d.get("wall_s"), d.get("peak_reserved_bytes"))' \
          "$WORK/ab_${w}_${v}_$r.json" "$w $v $r:" | tee -a "$OUT/torch_runs.txt"
      done
    done
  done
  python3 - "$WORK" <<'PY' | tee "$OUT/torch_summary.txt"
import glob, json, re, statistics, sys
rows = {}
for p in glob.glob(sys.argv[1] + "/ab_*.json"):
    m = re.search(r"ab_(.+)_(default|expandable|base|bin)_(\d+)\.json$", p)
    d = json.load(open(p))
    if m and d.get("ok"):
        rows.setdefault((m[1], m[2]), []).append(d)
for (w, v) in sorted(rows):
    ds = rows[(w, v)]
    walls = " ".join(f"{d['wall_s']:.3f}" for d in ds)
    peaks = sorted(d['peak_reserved_bytes'] for d in ds)
    print(f"{w:12s} {v:10s} runs {len(ds)}: wall s median {statistics.median(d['wall_s'] for d in ds):.3f} ({walls}), "
          f"peak reserved bytes median {statistics.median(peaks):,.0f} (range {peaks[0]:,}-{peaks[-1]:,})")
PY
fi
[ -n "${TRACES:-}" ] || exit 0
bash tools/replay/build_torch_baseline.sh /tmp/devrt-torch-baseline >"$OUT/torch_build.log" 2>&1 ||
  echo "ab: no PyTorch baseline (torch_build.log)"
names=(base bin cudaMallocAsync torch_default torch_expandable)
: >"$OUT/ab.jsonl"
for t in $TRACES; do
  [ -f "$T/$t.trace.gz" ] || { echo "ab: no $T/$t.trace.gz"; continue; }
  for r in $(seq "${ROUNDS:-3}"); do
    for k in 0 1 2 3 4; do
      a=${names[$(((k + r) % 5))]}
      case $a in
        base | bin) out=$(replay_one "$G/$a" devrt "$T/$t.trace.gz") ;;
        *) out=$(replay_one "$G/bin" "$a" "$T/$t.trace.gz") ;;
      esac
      [ -n "$out" ] && echo "{\"trace\": \"$t\", \"allocator\": \"$a\", \"run\": $(echo "$out" | tail -1)}" >>"$OUT/ab.jsonl"
    done
  done
done
python3 tools/gpu/replay_summary.py "$OUT/ab.jsonl" base bin cudaMallocAsync torch_default torch_expandable

#!/usr/bin/env bash
# The GPU runs, as named steps, on the machine with the H200 (after tools/gpu/pack.sh here; the
# device tool copies the repository and carries .gpu/). Logs land in $OUT (or .gpu/out), one per
# step, and each step prints its summary lines.
#
#   bash tools/gpu/run.sh STEP...
#
# Steps:
#   tests        the CUDA tests (C++ runtime and C interface), with CUDA_MODULE_LOADING=EAGER (the
#                tests' own main sets it unless it is set)
#   tests-lazy   the same with CUDA's default lazy module loading
#   memcheck     every stream, graph, storage and C-interface test under compute-sanitizer memcheck,
#                one process per test, with a watchdog that prints every thread's stack on a hang
#   torch        the stream-order cases under PyTorch (tests/cuda/torch_stream_order.py)
#   replay       the allocation traces through devrt on the GPU (--json, driver time per call)
#   baselines    the traces through cudaMallocAsync and PyTorch's caching allocator (default and
#                expandable segments), twice each; builds devrt-torch-baseline there
#   compare      devrt and those three on every trace, $ROUNDS (3) rounds in rotated order, one
#                table of the best ns/event, the range and peak reserved / peak live; with
#                CAP="--memory-limit 1.05x" every allocator under that cap (a balloon for the peers)
#   demo         the main job (devrt_inference_server --device cuda), the examples
#   bench        devrt_bench_events, devrt_bench_streams and devrt_bench_actor
#   latency      devrt_bench_gap (C and C++, host and cuda:0, requests served in place and not,
#                three rounds in rotated order) with the idle device's CPU; devrt_bench_actor
#                beside $B/devrt_bench_actor_base when packed (an earlier build), rotated
#   torch-bench  tools/torch_bench/workload.py, runs $TORCH_FIRST (1) to $TORCH_RUNS (5) of each of $TORCH_WORKLOADS
#                (gpt2_train bert_infer side_stream) under each of $TORCH_ALLOCS (default expandable
#                devrt; devrt-posted: every request sent to the device thread), the order rotated
#                by one every run; then the medians (tools/torch_bench/torch_summary.py)
#   snapshot     tools/torch_bench's gpt2_train under devrt with a memory snapshot at the end of
#                its measured part; PyTorch's viewer (torch.cuda._memory_viz stats (its segsum), trace,
#                trace_plot) on it, its totals against devrt's statistics; tests/python/test_snapshot.py
#                (PyTorch's viewer on a host snapshot); an out-of-memory message from cuda:0
#   all          tests tests-lazy memcheck torch replay demo bench latency
set -u
cd "$(dirname "$0")/../.."
. tools/gpu/replay_one.sh
G=$PWD/.gpu
B=$G/bin
T=$G/traces
OUT=${OUT:-$G/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CS=$(ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
# The traces of replay, baselines and compare (names in $T, without .trace.gz); TRACES=... picks
# others, such as those of tools/replay/synth_trace.py copied into .gpu/traces.
TRACES=${TRACES:-"llama_serve gpt2_train bert_serve cnn_train moe_train unet_train"}
run() {
  echo "== $*"
  local t0=$SECONDS
  "$@"
  local rc=$?
  echo "== exit $rc ($((SECONDS - t0)) s)"
  return $rc
}

step_tests() {
  run timeout 300 "$B/devrt_cuda_tests"
  run timeout 120 "$B/devrt_cuda_c_tests"
}

step_tests_lazy() {
  CUDA_MODULE_LOADING=LAZY run timeout 300 "$B/devrt_cuda_tests"
  CUDA_MODULE_LOADING=LAZY run timeout 120 "$B/devrt_cuda_c_tests"
}

step_memcheck() {
  [ -n "$CS" ] || { echo "memcheck: no compute-sanitizer"; return 1; }
  local bin t rc=0
  for bin in devrt_cuda_tests devrt_cuda_c_tests; do
    for t in $("$B/$bin" --gtest_list_tests | awk '/^[A-Za-z]/{s=$1} /^  /{print s $1}' |
               grep -E '^(CudaStreams|CudaGraph|CudaStorage|CApiStreams|CApiSleep|MultiGpu)\.'); do
      # The refused allocation is on purpose: its API error is not one.
      local api=explicit
      [ "$t" = CudaStorage.RefusedAllocationCarriesTheCudaErrorName ] && api=no
      [ "$t" = CApiSleep.AWakeWithoutRoomFailsStaysAsleepAndSucceedsOnceThereIsRoom ] && api=no
      DEVRT_TEST_WATCHDOG=150 run timeout 180 "$CS" --tool memcheck --report-api-errors "$api" --error-exitcode 3 \
        "$B/$bin" --gtest_brief=1 --gtest_filter="$t" || rc=1
    done
  done
  return $rc
}

step_torch() {
  DEVRT_LIBRARY=$G/lib/libdevrt_c.so PYTHONPATH=python run timeout 120 python3 tests/cuda/torch_stream_order.py
}

step_snapshot() {
  local lib=$G/lib/libdevrt_c.so sub
  PYTHONPATH=python run timeout 300 python3 tools/torch_bench/workload.py --workload gpt2_train --allocator devrt \
    --lib "$lib" --snapshot "$OUT/gpt2_train.pickle" --out "$OUT/gpt2_train_snapshot.json"
  for sub in stats; do
    echo "== python3 -m torch.cuda._memory_viz $sub gpt2_train.pickle"
    python3 -m torch.cuda._memory_viz "$sub" "$OUT/gpt2_train.pickle" >"$OUT/viz_$sub.txt" 2>&1
    echo "exit $?"
    head -c 2500 "$OUT/viz_$sub.txt"
    echo
    echo "..."
    tail -12 "$OUT/viz_$sub.txt"
  done
  echo "== python3 -m torch.cuda._memory_viz trace gpt2_train.pickle"
  python3 -m torch.cuda._memory_viz trace "$OUT/gpt2_train.pickle" >"$OUT/viz_trace.txt" 2>&1
  echo "exit $?; $(wc -l <"$OUT/viz_trace.txt") lines"
  head -20 "$OUT/viz_trace.txt"
  echo "..."
  tail -6 "$OUT/viz_trace.txt"
  echo
  run python3 -m torch.cuda._memory_viz trace_plot "$OUT/gpt2_train.pickle" -o "$OUT/gpt2_train.html"
  ls -la "$OUT/gpt2_train.html"
  echo "== the snapshot's totals against devrt's statistics of the same moment"
  OUT=$OUT python3 - <<'PY'
import json, os, pickle
out = os.environ["OUT"]
snap = pickle.load(open(f"{out}/gpt2_train.pickle", "rb"))
st = json.load(open(f"{out}/gpt2_train.pickle.stats.json"))
reserved = sum(s["total_size"] for s in snap["segments"])
allocated = sum(b["requested_size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
bad = [s for s in snap["segments"] if sum(b["size"] for b in s["blocks"]) != s["total_size"]]
acts = {}
for e in snap["device_traces"][0]:
    acts[e["action"]] = acts.get(e["action"], 0) + 1
print(f"segments {len(snap['segments'])}, blocks {sum(len(s['blocks']) for s in snap['segments'])}, "
      f"segments whose blocks do not add up: {len(bad)}")
print(f"total_reserved {reserved} vs devrt reserved_bytes {st['reserved_bytes']}: "
      f"{'equal' if reserved == st['reserved_bytes'] else 'DIFFERENT'}")
print(f"total_allocated {allocated} vs devrt in_use_bytes {st['in_use_bytes']}: "
      f"{'equal' if allocated == st['in_use_bytes'] else 'DIFFERENT'}")
print("trace actions:", acts)
PY
  DEVRT_LIBRARY=$lib run timeout 120 python3 -m unittest discover -s tests/python -p test_snapshot.py
  echo "== an out-of-memory message from cuda:0"
  DEVRT_LIBRARY=$lib PYTHONPATH=python timeout 120 python3 - <<'PY'
import devrt
devrt.init(use_cuda=True)
held = [devrt.malloc(100 << 30, 0)] + [devrt.malloc(1 << 30, 0) for _ in range(3)]
try:
    devrt.malloc(60 << 30, 0)
except devrt.DevrtOutOfMemoryError as e:
    print(e)
for p in held:
    devrt.free(p, 0)
PY
  echo "== the same under PyTorch, through devrt.torch.oom_errors()"
  DEVRT_LIBRARY=$lib PYTHONPATH=python timeout 120 python3 - <<'PY'
import torch, devrt.torch
devrt.torch.install()
held = [torch.empty(100 << 30, dtype=torch.uint8, device="cuda")]
try:
    with devrt.torch.oom_errors():
        torch.empty(60 << 30, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as e:
    print(type(e).__name__ + ":", str(e)[:2500])
PY
}

step_replay() {
  local t
  for t in $TRACES; do
    [ -f "$T/$t.trace.gz" ] && run timeout 60 "$B/devrt-replay" "$T/$t.trace.gz" --device cuda --json --no-progress
  done
  return 0
}

# Every trace through devrt, cudaMallocAsync and PyTorch's allocator (default and expandable
# segments), $ROUNDS (3) rounds with the order rotated; then one line per trace and allocator: the
# best ns/event, its range, and peak reserved / peak live (compare.txt, compare.jsonl).
step_compare() {
  bash tools/replay/build_torch_baseline.sh /tmp/devrt-torch-baseline > "$OUT/torch_build.log" 2>&1 || echo "compare: no PyTorch baseline (torch_build.log)"
  local t r k j names=(devrt cudaMallocAsync torch_default torch_expandable)
  : > "$OUT/compare.jsonl"
  for t in $TRACES; do
    [ -f "$T/$t.trace.gz" ] || continue
    for r in $(seq 1 "${ROUNDS:-3}"); do
      for k in 0 1 2 3; do
        j=$(( (k + r) % 4 ))
        local out
        out=$(replay_one "$B" "${names[$j]}" "$T/$t.trace.gz")
        [ -n "$out" ] && echo "{\"trace\": \"$t\", \"allocator\": \"${names[$j]}\", \"run\": $(echo "$out" | tail -1)}" >> "$OUT/compare.jsonl"
      done
    done
  done
  python3 tools/gpu/replay_summary.py "$OUT/compare.jsonl" devrt cudaMallocAsync torch_default torch_expandable |
    tee "$OUT/compare.txt"
}

step_baselines() {
  bash tools/replay/build_torch_baseline.sh /tmp/devrt-torch-baseline > "$OUT/torch_build.log" 2>&1
  local t i
  for t in $TRACES; do
    [ -f "$T/$t.trace.gz" ] || continue
    for i in 1 2; do
      run timeout 60 "$B/devrt-replay" "$T/$t.trace.gz" --baseline cudaMallocAsync --json --no-progress
      run timeout 90 /tmp/devrt-torch-baseline "$T/$t.trace.gz" --json
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run timeout 90 /tmp/devrt-torch-baseline "$T/$t.trace.gz" --json
    done
  done
}

step_demo() {
  run timeout 120 "$B/devrt_inference_server" --device cuda --no-progress
  run timeout 60 "$B/devrt_graph_capture"
  run timeout 60 "$B/devrt_model_reload" --device cuda
}

step_bench() {
  run timeout 60 "$B/devrt_bench_events"
  [ -f "$T/llama_serve.trace.gz" ] && run timeout 120 "$B/devrt_bench_streams" --trace "$T/llama_serve.trace.gz" --seconds 1
  run timeout 120 "$B/devrt_bench_actor" --benchmark_filter='round_trip/|churn_(reserve|create)/real_time/threads:(1|16)$' \
    --benchmark_min_time=0.2
}

step_latency() {
  local rep dev api sip order
  for rep in 1 2 3; do
    order="1 0"
    [ $((rep % 2)) -eq 0 ] && order="0 1"
    for dev in host cuda; do
      for api in c cpp; do
        for sip in $order; do
          echo "-- serve_in_place=$sip"
          DEVRT_SERVE_IN_PLACE=$sip run timeout 120 "$B/devrt_bench_gap" --api "$api" --device "$dev" \
            --gaps 0,5,20,100,1000 --idle-ms 1000
        done
      done
    done
  done
  local filter='round_trip/|churn_(reserve|create)/real_time/threads:(1|16)$'
  for rep in 1 2 3; do
    order="devrt_bench_actor devrt_bench_actor_base"
    [ $((rep % 2)) -eq 0 ] && order="devrt_bench_actor_base devrt_bench_actor"
    for b in $order; do
      [ -x "$B/$b" ] && run timeout 120 "$B/$b" --benchmark_filter="$filter" --benchmark_min_time=0.2
    done
  done
  return 0
}

step_torch_bench() {
  # The allocators of $TORCH_ALLOCS (default, expandable: PyTorch's with expandable segments, devrt,
  # devrt-posted: devrt with every request sent to the device thread), in an order rotated by one
  # every run; then the medians of each (torch_summary.py).
  local w r a alloc sip conf i n
  local -a allocs order
  read -r -a allocs <<<"${TORCH_ALLOCS:-default expandable devrt}"
  n=${#allocs[@]}
  for w in ${TORCH_WORKLOADS:-gpt2_train bert_infer side_stream}; do
    for r in $(seq "${TORCH_FIRST:-1}" "${TORCH_RUNS:-5}"); do
      order=()
      for i in $(seq 0 $((n - 1))); do order+=("${allocs[$(((i + r - 1) % n))]}"); done
      for a in "${order[@]}"; do
        alloc=$a
        sip=1
        [ "$a" = devrt-posted ] && alloc=devrt && sip=0
        DEVRT_SERVE_IN_PLACE=$sip PYTHONPATH=python run timeout 150 python3 tools/torch_bench/workload.py \
          --workload "$w" --allocator "$alloc" --lib "$G/lib/libdevrt_c.so" --out "$OUT/torch_${w}_${a}_$r.json"
      done
    done
  done
  python3 tools/torch_bench/torch_summary.py "$OUT"/torch_*.json
  return 0
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then
  sed -n '2,22p' "$0"
  exit 2
fi
[ "${steps[0]}" = all ] && steps=(tests tests-lazy memcheck torch replay demo bench latency)
status=0
for s in "${steps[@]}"; do
  f="step_${s//-/_}"
  if ! declare -F "$f" >/dev/null; then
    echo "unknown step: $s"
    status=2
    continue
  fi
  echo "==== step $s"
  "$f" > "$OUT/$s.log" 2>&1 || status=1
  grep -E '^== |^-- |^\| |^idle|^devrt_bench_gap|^(round_trip|churn_)|PASSED|FAILED|ERROR SUMMARY|watchdog|crash|; wall |^\[ (g1|g4|t1|record|blocked|streams|devices|cuda) ' "$OUT/$s.log" |
    grep -v '^== thread' | head -300
done
exit $status

#!/usr/bin/env bash
# Traces devrt was not tuned on (tools/replay/synth_trace.py, seed 0 of each pattern) and the hard
# patterns of tools/replay/traces/edge, replayed on the simulated H200 capped at 1.05 times their
# peak of live bytes: the peak reserved stays within the cap on every one, and every pattern but
# the growing caches completes without a failed reserve (those fail a few of their ~3,800 reserves
# at that cap, 4 today and 21 with mappings of up to 32 MiB near the limit: BENCHMARKS.md, "Near
# the memory limit", says why no allocator that leaves live memory in place does better); then the
# recorded traces behind a busy simulated GPU.
#
#   synth_capped.sh PYTHON3 DEVRT_REPLAY SOURCE_DIR WORK_DIR
set -euo pipefail
python=$1 replay=$2 src=$3 work=$4
rm -rf "${work}" && mkdir -p "${work}"
"${python}" "${src}/tools/replay/synth_trace.py" "${work}" --seeds 1 >/dev/null
status=0
# check LABEL MAX_FAILURES TRACE [REPLAY OPTIONS...]: replays TRACE capped at 1.05x on sim-gpu; fails
# the script when the peak reserved passes the cap or more than MAX_FAILURES reserves fail.
check() {
  local label=$1 allowed=$2 trace=$3
  shift 3
  local json line failures within ratio maps unmaps
  json=$("${replay}" "${trace}" --device sim-gpu --memory-limit 1.05x --json --no-progress "$@")
  line=$(echo "${json}" | "${python}" -c '
import json, sys
d = json.loads(sys.stdin.read())
cap = 1.05 * d["peak_live_bytes"]
print(d["failures"], int(d["peak_reserved_bytes"] <= cap), "%.3f" % d["ratio"], d["maps"], d["unmaps"])')
  read -r failures within ratio maps unmaps <<<"${line}"
  echo "${label}: peak reserved / peak live ${ratio}, ${maps} maps, ${unmaps} unmaps, ${failures} failed reserves"
  [ "${within}" = 1 ] || { echo "FAIL: ${label}: the peak reserved passed the cap"; status=1; }
  [ "${failures}" -le "${allowed}" ] || { echo "FAIL: ${label}: ${failures} failed reserves"; status=1; }
}
for t in "${work}"/*.trace.gz "${src}"/tools/replay/traces/edge/*.trace; do
  name=$(basename "${t}")
  name=${name%%.*}
  case ${name} in
    kvgrow*) check "${name}" 9 "${t}" ;;
    *) check "${name}" 0 "${t}" ;;
  esac
done
# The recorded traces, capped the same way with the simulated GPU 16 events behind (unmaps wait
# behind its work): an out-of-memory reclaim waits for the memory on its way back, and every one
# completes within the cap. PyTorch's llama_gen is the tightest: the textbook best fit of
# devrt_bench_yardstick, placing bytes with no granules or mappings, already needs 1.050 times its
# peak of live bytes without a cap, and with mappings of up to 1/64 of the limit it failed one of
# its 161,218 reserves (BENCHMARKS.md, "Mappings of 1/128 of a memory limit").
for t in "${src}"/tools/replay/traces/*.trace.gz "${src}"/tools/replay/traces/torch/*.trace.gz; do
  check "$(basename "${t}" .trace.gz) behind the GPU" 0 "${t}" --gpu-lag 16
done
# The same idle.
check "llama_gen idle" 0 "${src}/tools/replay/traces/torch/llama_gen.trace.gz"
exit ${status}

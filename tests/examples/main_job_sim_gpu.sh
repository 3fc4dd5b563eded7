#!/usr/bin/env bash
# The main job on the simulated H200 with a stream per worker (the multi-stream policy without a
# GPU): `devrt_inference_server --device sim-gpu` at its defaults and with `--hidden 4096 --threads
# 16`, RUNS times each (default 9). Every run must pass its checks and keep the pools' invariants;
# the median memory efficiency (peak in use / peak reserved) of each configuration must reach its
# floor.
#
#   main_job_sim_gpu.sh SERVER [RUNS] [FLOOR_DEFAULTS] [FLOOR_16_THREADS]
#
# Single runs move with the threads' interleaving (72-96% at the defaults and 84-97% with 16 threads
# on a 2-core machine), so the check is on medians. The targets are 80% and 90%; the floors (78%
# and 88% by default) sit two points under them so that a slow, loaded machine does not fail a
# policy that meets them: medians of 7 runs on 2026-12-06 were 84-85% and 92.5-92.7% in the debug,
# asan and tsan builds, 35% and 42% before devrt reused memory across streams.
set -euo pipefail
server=$1
runs=${2:-9}
floors=("${3:-78}" "${4:-88}")
configs=("" "--hidden 4096 --threads 16")
status=0
for k in 0 1; do
  args=${configs[$k]}
  name=${args:-defaults}
  effs=()
  for ((i = 1; i <= runs; ++i)); do
    rc=0
    # shellcheck disable=SC2086
    out=$("${server}" --device sim-gpu --no-progress ${args} 2>&1) || rc=$?
    if [ "${rc}" -ne 0 ]; then
      echo "${out}"
      echo "FAIL: exit code ${rc} (${name}, run ${i})"
      exit 1
    fi
    [ "${i}" -eq 1 ] && echo "${out}" | grep -E "^(throughput|memory efficiency|statistics|streams|invariants):"
    echo "${out}" | grep -q "^PASS$" || { echo "${out}"; echo "FAIL: no PASS (${name}, run ${i})"; status=1; }
    echo "${out}" | grep -q "^invariants: hold$" || { echo "FAIL: invariants (${name}, run ${i})"; status=1; }
    eff=$(echo "${out}" | sed -n 's/^memory efficiency: .* = \([0-9.]*\)%$/\1/p')
    [ -n "${eff}" ] || { echo "FAIL: no memory efficiency line (${name}, run ${i})"; status=1; continue; }
    effs+=("${eff}")
  done
  [ ${#effs[@]} -gt 0 ] || continue
  median=$(printf '%s\n' "${effs[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  echo "memory efficiency (${name}): median ${median}% of ${#effs[@]} runs (${effs[*]}), floor ${floors[$k]}%"
  if awk -v e="${median}" -v f="${floors[$k]}" 'BEGIN { exit !(e < f) }'; then
    echo "FAIL: median memory efficiency ${median}% under ${floors[$k]}% (${name})"
    status=1
  fi
done
exit ${status}

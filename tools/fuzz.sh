#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (preset `fuzz`: clang, AddressSanitizer + UBSan) and
# runs each for a while, starting from its seed corpus in tests/fuzz/corpus/<target>.
#
#   tools/fuzz.sh [--time SECONDS] [--update-corpus] [TARGET...]
#
#   --time S          seconds per target (default 25)
#   --update-corpus   afterwards, merge what the run found into tests/fuzz/corpus/<target>
#   TARGET            fuzz_size, fuzz_layout, fuzz_config, fuzz_ops, fuzz_trace (default: all)
#
# Inputs found during the run go to build/fuzz/corpus/<target>. A failing input is saved as
# build/fuzz/artifacts/<target>/crash-* (reproduce: build/fuzz/tests/fuzz/<target> FILE) and the
# script exits 1. Each target ends with a line: executions, coverage (cov, ft), corpus size.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=25
update=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) seconds="$2"; shift 2 ;;
    --update-corpus) update=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_size fuzz_layout fuzz_config fuzz_ops fuzz_trace)

if ! command -v clang++ >/dev/null; then
  echo "tools/fuzz.sh: clang++ is missing; run tools/setup.sh" >&2
  exit 2
fi

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)" --target "${targets[@]}"

build=build/fuzz
status=0
summary=()
for t in "${targets[@]}"; do
  corpus="${build}/corpus/${t}"
  artifacts="${build}/artifacts/${t}"
  log="${build}/${t}.log"
  mkdir -p "${corpus}" "${artifacts}"
  dict=()
  [ -f "tests/fuzz/${t}.dict" ] && dict=(-dict="tests/fuzz/${t}.dict")
  echo "== fuzz ${t}: ${seconds} s"
  rc=0
  "${build}/tests/fuzz/${t}" "${corpus}" "tests/fuzz/corpus/${t}" "${dict[@]}" \
    -max_total_time="${seconds}" -max_len=4096 -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="${artifacts}/" >"${log}" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "${log}" | grep -o '[0-9]*$' || echo "?")
  last=$(grep -E '^#[0-9]+' "${log}" | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"${last}")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"${last}")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"${last}")
  if [ "${rc}" -ne 0 ]; then
    status=1
    echo "!! ${t} failed (exit ${rc}); log: ${log}; inputs: ${artifacts}/" >&2
    grep -E 'fuzz_[a-z]+: |ERROR|SUMMARY' "${log}" | head -n 20 >&2 || true
    summary+=("${t}: FAILED (exit ${rc}) after ${execs} executions")
  else
    summary+=("${t}: ${execs} executions, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, no failure")
  fi
  if [ "${update}" -eq 1 ] && [ "${rc}" -eq 0 ]; then
    "${build}/tests/fuzz/${t}" -merge=1 "tests/fuzz/corpus/${t}" "${corpus}" >>"${log}" 2>&1
  fi
done
echo "== fuzz summary (${seconds} s per target)"
printf '   %s\n' "${summary[@]}"
exit "${status}"

#!/usr/bin/env bash
# Replays traces through devrt's core on the simulated H200 with several layouts and prints one
# markdown table row per trace and layout (median ns/event of RUNS runs, peak reserved, ratio,
# driver calls).
#
#   tools/replay/layout_table.sh [-r RUNS] [-l "LAYOUT;LAYOUT;..."] TRACE...
#   (default layouts: auto, sub-slices, exclusive-pages; RUNS 3; devrt-replay from build/release)
set -euo pipefail
runs=3
layouts="auto|sub-slices|exclusive-pages"
replay=${DEVRT_REPLAY:-build/release/tools/devrt-replay}
while getopts "r:l:" o; do
  case $o in
    r) runs=$OPTARG ;;
    l) layouts=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: layout_table.sh [-r RUNS] [-l 'L1|L2'] TRACE..." >&2; exit 2; }
echo "| trace | layout | ns/event (median of $runs) | peak live | peak reserved | ratio | driver allocs / frees | maps / unmaps |"
echo "|---|---|---|---|---|---|---|---|"
IFS='|' read -r -a list <<< "$layouts"
for t in "$@"; do
  for l in "${list[@]}"; do
    for _ in $(seq "$runs"); do "$replay" "$t" --layout "$l" --json --no-progress; echo; done |
      python3 -c '
import json, statistics, sys, os
runs = [json.loads(x) for x in sys.stdin if x.strip()]
r = runs[0]
ns = statistics.median(x["ns_per_event"] for x in runs)
gib = 1 << 30
print("| {} | {} | {:.1f} | {:.3f} GiB | {:.3f} GiB | {:.3f} | {:,} / {:,} | {:,} / {:,} |".format(
    os.path.basename(sys.argv[1]).replace(".trace.gz", ""), sys.argv[2], ns, r["peak_live_bytes"] / gib,
    r["peak_reserved_bytes"] / gib, r["ratio"], r["driver_allocs"], r["driver_frees"], r.get("maps", 0), r.get("unmaps", 0)))
' "$t" "$l"
  done
done

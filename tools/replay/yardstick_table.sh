#!/usr/bin/env bash
# devrt's core against the yardstick (a textbook coalescing best fit: std::set by size, std::map by
# address) on the simulated H200, in one process per trace, alternating round by round, and one
# markdown table row per trace: the median ns/event of each, the median of the rounds' ratios,
# peak reserved / peak live, and devrt's maps / unmaps (tools/bench/yardstick.cpp).
#
#   tools/replay/yardstick_table.sh [-r ROUNDS] [-l LAYOUT] TRACE...
#   (ROUNDS 11; LAYOUT auto; devrt_bench_yardstick from build/release, or $DEVRT_BENCH_YARDSTICK)
set -euo pipefail
rounds=11
layout=auto
bench=${DEVRT_BENCH_YARDSTICK:-build/release/tools/devrt_bench_yardstick}
while getopts "r:l:" o; do
  case $o in
    r) rounds=$OPTARG ;;
    l) layout=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: yardstick_table.sh [-r ROUNDS] [-l LAYOUT] TRACE..." >&2; exit 2; }
exec "$bench" "$@" --rounds "$rounds" --layout "$layout"

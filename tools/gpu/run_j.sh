#!/usr/bin/env bash
# GPU run J: the actor benchmark three times on the H200 host (host device), then run_h.sh (the CUDA
# tests and their memcheck runs). Packed with devrt_cuda_tests and devrt_bench_actor and run_h.sh
# in .gpu: `bash .gpu/run_j.sh` from the repository root with $OUT set.
here=$(cd "$(dirname "$0")" && pwd); export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for i in 1 2 3; do $here/bin/devrt_bench_actor --benchmark_filter='round_trip/|churn_(reserve|create)/real_time/threads:(1|16)$' --benchmark_min_time=0.2 2>&1 | grep -E 'round|churn'; done > $OUT/actor.log
bash $here/run_h.sh
cat $OUT/actor.log

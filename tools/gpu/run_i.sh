#!/usr/bin/env bash
# GPU run I (the code of the tables in BENCHMARKS.md, "On the H200 in one run"): the CUDA
# tests, then per trace, in one run: devrt on the GPU three times (--json, with the driver's
# time per call), cudaMallocAsync, and PyTorch's caching allocator (default and expandable
# segments; devrt-torch-baseline built there), twice each. Packed like run_c.sh:
# `bash .gpu/run_i.sh` from the repository root with $OUT set; the logs land in $OUT.
here=$(cd "$(dirname "$0")" && pwd); export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$here/bin; T=$here/traces
run() { echo "== $*"; local t0=$SECONDS; "$@"; local rc=$?; echo "== exit $rc ($((SECONDS - t0)) s)"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
(bash tools/replay/build_torch_baseline.sh /tmp/devrt-torch-baseline > $OUT/torch_build.log 2>&1; echo "build exit $?" >> $OUT/torch_build.log) &
builder=$!
run timeout 60 $B/devrt_cuda_tests --gtest_brief=1 > $OUT/tests.log 2>&1
wait $builder
{
for t in llama_serve gpt2_train bert_serve cnn_train moe_train unet_train; do
  run timeout 30 $B/devrt-replay $T/$t.trace.gz --device cuda --json --no-progress
  for i in 1 2; do
    run timeout 30 $B/devrt-replay $T/$t.trace.gz --device cuda --json --no-progress
    run timeout 30 $B/devrt-replay $T/$t.trace.gz --baseline cudaMallocAsync --json --no-progress
    run timeout 60 /tmp/devrt-torch-baseline $T/$t.trace.gz --json
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run timeout 60 /tmp/devrt-torch-baseline $T/$t.trace.gz --json
  done
done
} > $OUT/replay.log 2>&1
grep -E 'PASSED|FAILED' $OUT/tests.log; grep -c '"ns_per_event"' $OUT/replay.log; tail -1 $OUT/torch_build.log

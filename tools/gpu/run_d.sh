#!/usr/bin/env bash
# GPU run D: the CUDA tests (the idle-release test among them), memcheck of the unmap tests, and
# the devrt replays of the six traces on the H200 (the arena over cuda_storage). Packed and run
# like run_c.sh: `bash .gpu/run_d.sh` with $OUT set; the log lands in $OUT/runD.log.
here=$(cd "$(dirname "$0")" && pwd); export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$here/bin; T=$here/traces; CS=$(ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
run() { echo "== $*"; local t0=$SECONDS; "$@"; local rc=$?; echo "== exit $rc ($((SECONDS - t0)) s)"; }
{
for t in llama_serve gpt2_train bert_serve cnn_train moe_train unet_train; do
  run timeout 25 $B/devrt-replay $T/$t.trace.gz --device cuda --no-progress
done
run timeout 60 $B/devrt_cuda_tests --gtest_brief=1
run timeout 40 $CS --tool memcheck --error-exitcode 3 $B/devrt_cuda_tests --gtest_brief=1 --gtest_filter='CudaStreams.Unmaps*:CudaStreams.ARevived*:CudaStreams.Mapping*:CudaStorage.AddressRanges*'
} 2>&1 | tee $OUT/runD.log

#!/usr/bin/env bash
# GPU run E: the CUDA tests again after the unmap tests hold their streams with host-function
# gates, memcheck of the unmap tests, then memcheck of the 16-thread stream tests. Packed and run
# like run_c.sh: `bash .gpu/run_e.sh` with $OUT set; the log lands in $OUT/runE.log.
here=$(cd "$(dirname "$0")" && pwd); export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$here/bin; CS=$(ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
run() { echo "== $*"; local t0=$SECONDS; "$@"; local rc=$?; echo "== exit $rc ($((SECONDS - t0)) s)"; }
{
run timeout 60 $B/devrt_cuda_tests --gtest_brief=1
run timeout 40 $CS --tool memcheck --error-exitcode 3 $B/devrt_cuda_tests --gtest_brief=1 --gtest_filter='CudaStreams.Unmaps*:CudaStreams.ARevived*:CudaStreams.Mapping*:CudaStorage.AddressRanges*'
run timeout 80 $CS --tool memcheck --error-exitcode 3 $B/devrt_cuda_tests --gtest_brief=1 --gtest_filter='CudaStreams.SixteenThreads*'
} 2>&1 | tee $OUT/runE.log

#!/usr/bin/env bash
# GPU run H: the CUDA tests, then memcheck of the unmap and mapping tests one at a time (the unmap
# tests hold their streams with spinning kernels) and of the 16-thread stream tests. Packed like
# run_c.sh: `bash .gpu/run_h.sh` from the repository root with $OUT set; the log lands in
# $OUT/tests.log. (The run that took these figures also ran the replays of run_i.sh.)
here=$(cd "$(dirname "$0")" && pwd); export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$here/bin; T=$here/traces; CS=$(ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
run() { echo "== $*"; local t0=$SECONDS; "$@"; local rc=$?; echo "== exit $rc ($((SECONDS - t0)) s)"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
{
run timeout 60 $B/devrt_cuda_tests --gtest_brief=1
for t in AnUnmapDoneAtOnceLendsItsMemoryToTheNextMapOfItsSize MemoryABusyStreamMayStillUseIsNeverLent \
         UnmapsGoBackAtOnceOnlyWhenNoStreamIsBusy MappingOverAPendingUnmapNeverWaits \
         MemoryFreedOnABusyStreamIsNotGivenToAnotherBeforeItsFence RecordStreamKeepsMemoryFromItsOwnStreamToo; do
  run timeout 20 $CS --tool memcheck --error-exitcode 3 $B/devrt_cuda_tests --gtest_filter="CudaStreams.$t"
done
run timeout 20 $CS --tool memcheck --error-exitcode 3 $B/devrt_cuda_tests --gtest_filter='CudaStorage.AddressRanges*'
run timeout 60 $CS --tool memcheck --error-exitcode 3 $B/devrt_cuda_tests --gtest_filter='CudaStreams.SixteenThreadsOnTheLegacyDefaultStream:CudaStreams.SixteenThreadsOnTheirPerThreadDefaultStreams'
run timeout 120 $CS --tool memcheck --error-exitcode 3 $B/devrt_cuda_tests --gtest_filter='CudaStreams.SixteenThreadsEachWithItsOwnStream'
} > $OUT/tests.log 2>&1
grep -E '^== exit|PASSED|FAILED|ERROR SUMMARY' $OUT/tests.log | head -40

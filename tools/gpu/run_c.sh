#!/usr/bin/env bash
# How the H200 figures of BENCHMARKS.md and RELIABILITY.md were taken. Pack the release binaries
# first (../shared/gpu/pack.sh build/release/tests/devrt_cuda_tests build/release/examples/...
# build/release/tools/devrt-replay build/release/tools/devrt_bench_streams ...), copy the traces
# into .gpu/traces and libdevrt_c.so into .gpu/lib, copy this script into .gpu/, and run it on the
# GPU machine as `bash .gpu/<script>` with $OUT set; the logs land in $OUT.
# GPU run C (final): CUDA tests, memcheck of the tests not checked before, devrt replays, stream
# benchmark, the inference server, PyTorch and CuPy workloads.
here=$(cd "$(dirname "$0")" && pwd); export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$here/bin; T=$here/traces; CS=$(ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
run() { echo "== $*"; local t0=$SECONDS; "$@"; local rc=$?; echo "== exit $rc ($((SECONDS - t0)) s)"; }
{
run timeout 45 $B/devrt_cuda_tests --gtest_brief=1
run timeout 90 $CS --tool memcheck --error-exitcode 3 $B/devrt_cuda_tests --gtest_brief=1 --gtest_filter='CudaStreams.RecordStream*:CudaStreams.Mapping*:CudaStreams.ABlocked*:CudaStreams.Reads*:MultiGpu.*:CudaStorage.AddressRanges*'
for t in llama_serve gpt2_train bert_serve cnn_train moe_train unet_train; do
  run timeout 25 $B/devrt-replay $T/$t.trace.gz --device cuda --no-progress
done
run timeout 30 $B/devrt_bench_streams --trace $T/llama_serve.trace.gz --seconds 1
run timeout 20 $B/devrt_inference_server --device cuda --no-progress
} 2>&1 | tee $OUT/runC.log
cd "$here/.."
export DEVRT_LIBRARY=$here/lib/libdevrt_c.so PYTHONPATH=python
run timeout 320 python3 tools/torch_bench/run_all.py --lib $DEVRT_LIBRARY --runs 3 --workloads side_stream,cupy_two_streams,gpt2_train --out $OUT/torch_bench2.json > $OUT/torch2.log 2>&1
tail -3 $OUT/torch2.log

#!/usr/bin/env bash
# How the H200 figures of BENCHMARKS.md and RELIABILITY.md were taken. Pack the release binaries
# first (../shared/gpu/pack.sh build/release/tests/devrt_cuda_tests build/release/examples/...
# build/release/tools/devrt-replay build/release/tools/devrt_bench_streams ...), copy the traces
# into .gpu/traces and libdevrt_c.so into .gpu/lib, copy this script into .gpu/, and run it on the
# GPU machine as `bash .gpu/<script>` with $OUT set; the logs land in $OUT.
# GPU run A: CUDA tests, memcheck, examples, soak, stream benchmark, trace replays.
here=$(cd "$(dirname "$0")" && pwd); export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$here/bin; T=$here/traces; CS=$(ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
run() { echo "== $*"; local t0=$SECONDS; "$@"; local rc=$?; echo "== exit $rc ($((SECONDS - t0)) s)"; }
{
run timeout 240 $B/devrt_cuda_tests
run timeout 200 $CS --tool memcheck --error-exitcode 3 $B/devrt_cuda_tests --gtest_filter='CudaStreams.*:MultiGpu.*:CudaGraph.*:CudaRuntime.Kernels*'
run timeout 120 $B/devrt_inference_server --device cuda --no-progress
run timeout 60 $B/devrt_graph_capture
run timeout 60 $B/devrt_model_reload --device cuda
run timeout 120 $B/devrt-soak --device cuda --layout auto --ops 2000000 --threads 16 --progress 0
run timeout 120 $CS --tool memcheck --error-exitcode 3 $B/devrt-soak --device cuda --layout auto --ops 200000 --threads 16 --progress 0
run timeout 120 $B/devrt_bench_streams --trace $T/llama_serve.trace.gz --seconds 1
} 2>&1 | tee $OUT/runA.log
{
for t in llama_serve gpt2_train bert_serve cnn_train moe_train unet_train; do
  run timeout 150 $B/devrt-replay $T/$t.trace.gz --compare --no-progress
done
} 2>&1 | tee $OUT/replay.log

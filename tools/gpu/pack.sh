#!/usr/bin/env bash
# Packs what the GPU machine runs into .gpu/ (ignored by git; pass it as the device tool's carry):
# the release build's binaries (built for the H200, sm_90), libdevrt_c.so, the shared libraries the
# GPU machine may lack (never the driver), and the allocation traces.
#
#   bash tools/gpu/pack.sh [TRACES_DIR]      TRACES_DIR: a folder holding llama_serve and gpt2_train
#                                            (large, not in the repository); without it only the
#                                            traces in tools/replay/traces are packed
# Then, on the GPU machine (device tool, carry [".gpu"]):  bash tools/gpu/run.sh STEP...
set -euo pipefail
cd "$(dirname "$0")/../.."
traces=${1:-}
bash tools/setup.sh
cmake --preset release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build --preset release -j "$(nproc)"
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib .gpu/traces
bins=(tests/devrt_cuda_tests tests/devrt_cuda_c_tests examples/devrt_inference_server examples/devrt_graph_capture
      examples/devrt_model_reload tools/devrt-replay tools/devrt-soak tools/devrt_bench_streams tools/devrt_bench_actor tools/devrt_bench_events tools/devrt_bench_gap tools/devrt_bench_pinned tools/devrt_bench_vmm_gpu)
for b in "${bins[@]}"; do
  f=build/release/$b
  [ -x "$f" ] || { echo "pack: $f was not built" >&2; continue; }
  cp -f "$f" .gpu/bin/
  ldd "$f" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*|libcuda.so*|libnvidia*) ;;
      *) cp -fL "$lib" .gpu/lib/ ;;
    esac
  done
done
cp -f build/release/runtime/libdevrt_c.so .gpu/lib/
cp -f tools/replay/traces/*.trace.gz .gpu/traces/
for t in llama_serve gpt2_train; do
  [ -n "$traces" ] || break
  if [ -f "$traces/$t.trace.gz" ]; then cp -f "$traces/$t.trace.gz" .gpu/traces/; else echo "pack: no $traces/$t.trace.gz" >&2; fi
done
du -sh .gpu

#!/usr/bin/env bash
# The main job: builds devrt in the release preset (the libraries, libdevrt_c.so and the programs
# the README lists: everything `cmake --install build/release` installs; not the tests or the
# benchmarks) and runs the multi-threaded inference server example (on the first CUDA GPU when
# there is one, else on the host device). Arguments go to the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake --preset release >/dev/null
targets=(devrt_memory devrt_devices devrt_runtime devrt_c devrt_inference_server devrt_model_reload devrt_demo
         devrt_core_tour devrt_inspect devrt_replay devrt_soak)
# With the CUDA toolkit: the CUDA backend and the graph capture example.
if cmake --build --preset release --target help | grep '^devrt_graph_capture:' >/dev/null; then
  targets+=(devrt_cuda devrt_graph_capture)
fi
cmake --build --preset release --target "${targets[@]}"
./build/release/examples/devrt_inference_server "$@"

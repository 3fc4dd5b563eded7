#!/usr/bin/env bash
# The main job: builds devrt (release preset) and runs the multi-threaded inference server example
# (on the first CUDA GPU when there is one, else on the host device).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target devrt_inference_server
./build/release/examples/devrt_inference_server "$@"

#!/usr/bin/env bash
# The main job: builds devrt (release preset) and runs the multi-threaded demo on the host device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target devrt_demo
./build/release/examples/devrt_demo "$@"

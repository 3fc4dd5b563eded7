#!/usr/bin/env bash
# The main job: builds devrt (release preset) and runs the host demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target devrt_host_demo
./build/release/examples/devrt_host_demo "$@"

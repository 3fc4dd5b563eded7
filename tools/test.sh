#!/usr/bin/env bash
# Builds and runs every test. Presets to run may be given (default: debug, then asan, then tsan).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(debug asan tsan)
jobs=$(nproc)
for preset in "${presets[@]}"; do
  echo "== devrt tests: preset ${preset}"
  cmake --preset "${preset}" >/dev/null
  cmake --build --preset "${preset}" -j "${jobs}"
  ctest --preset "${preset}" -j "${jobs}"
done

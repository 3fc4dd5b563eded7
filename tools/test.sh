#!/usr/bin/env bash
# Builds and runs every test. Presets to run may be given (default: debug, then asan, then tsan,
# then fuzz). `fuzz` is not a ctest preset: it builds the libFuzzer targets with clang and runs each
# for DEVRT_FUZZ_SECONDS (default 20) seconds on its seed corpus (tools/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(debug asan tsan fuzz)
jobs=$(nproc)
for preset in "${presets[@]}"; do
  echo "== devrt tests: preset ${preset}"
  if [ "${preset}" = fuzz ]; then
    bash tools/fuzz.sh --time "${DEVRT_FUZZ_SECONDS:-20}"
    continue
  fi
  cmake --preset "${preset}" >/dev/null
  cmake --build --preset "${preset}" -j "${jobs}"
  ctest --preset "${preset}" -j "${jobs}"
done

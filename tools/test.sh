#!/usr/bin/env bash
# Builds and runs every test. Presets to run may be given (default: debug, then python, then asan,
# then tsan, then fuzz). `fuzz` is not a ctest preset: it builds the libFuzzer targets with clang and
# runs each for DEVRT_FUZZ_SECONDS (default 20) seconds on its seed corpus (tools/fuzz.sh). `python`
# neither: it installs the Python package with pip into a fresh virtual environment and tests the
# installed copy (tools/python_package_test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(debug python asan tsan fuzz)
jobs=$(nproc)
for preset in "${presets[@]}"; do
  echo "== devrt tests: preset ${preset}"
  if [ "${preset}" = fuzz ]; then
    bash tools/fuzz.sh --time "${DEVRT_FUZZ_SECONDS:-20}"
    continue
  fi
  if [ "${preset}" = python ]; then
    bash tools/python_package_test.sh
    continue
  fi
  cmake --preset "${preset}" >/dev/null
  cmake --build --preset "${preset}" -j "${jobs}"
  ctest --preset "${preset}" -j "${jobs}"
done

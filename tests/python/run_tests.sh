#!/usr/bin/env sh
# Runs the Python tests against a built libdevrt_c.so; exits 77 (CTest's skip) with the reason
# when they cannot run here.
#
#   run_tests.sh LIBRARY PYTHON_PACKAGE_DIR TESTS_DIR [SANITIZERS]
lib=$1 pkg=$2 tests=$3 sanitize=${4:-}
if ! command -v python3 >/dev/null 2>&1; then
  echo "devrt_python_tests: skipped: python3 is not installed"
  exit 77
fi
if [ -n "${sanitize}" ]; then
  # python3 is not instrumented: loading a sanitized library needs the sanitizer's runtime
  # preloaded, which these tests do not set up. The debug and release builds run them.
  echo "devrt_python_tests: skipped: a sanitizer build (${sanitize})"
  exit 77
fi
DEVRT_LIBRARY=${lib} PYTHONPATH=${pkg}${PYTHONPATH:+:${PYTHONPATH}} exec python3 -m unittest discover -s "${tests}" -v

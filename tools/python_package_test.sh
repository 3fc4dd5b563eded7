#!/usr/bin/env bash
# The Python package as pip installs it: in a fresh virtual environment, `pip install .` builds
# libdevrt_c.so (build/pip) and installs the devrt package with it; the library may need only the C
# and C++ runtimes; the Python tests run against the installed copy from outside the repository;
# `pip uninstall` leaves site-packages as it was; `pip wheel .` gives a platform wheel holding the
# library. DEVRT_PYTHON names the interpreter (default: python3, else /usr/bin/python3, the first
# that has venv, setuptools and wheel support).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset DEVRT_LIBRARY PYTHONPATH

py=""
for c in ${DEVRT_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c '
import ensurepip, setuptools
from importlib.util import find_spec
assert find_spec("wheel") or find_spec("setuptools.command.bdist_wheel")' 2>/dev/null; then
    py=$c
    break
  fi
done
if [ -z "$py" ]; then
  echo "python package test: no python3 with venv, setuptools and wheel (tools/setup.sh installs them)" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv --system-site-packages "$tmp/venv"
vpy=$tmp/venv/bin/python
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
platsite=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
listing() { (find "$site" "$platsite" -print 2>/dev/null || true) | sort -u; }
listing >"$tmp/before"
echo "== python package: $("$vpy" --version), pip install into $tmp/venv"

"$vpy" -m pip install -v --no-index --no-build-isolation "$repo"

# The installed copy: its own library, nothing from the repository.
cd "$tmp"
"$vpy" - "$repo" <<'EOF'
import os, sys
import devrt
repo = os.path.realpath(sys.argv[1])
pkg = os.path.dirname(os.path.realpath(devrt.__file__))
lib = os.path.realpath(devrt.library_path())
assert not pkg.startswith(repo + os.sep), f"devrt imported from the repository: {pkg}"
assert lib == os.path.join(pkg, "libdevrt_c.so"), f"devrt loads {lib}, not its own library"
devrt.lib()
print("installed:", pkg, "library:", lib)
EOF
so=$("$vpy" -c 'import devrt; print(devrt.library_path())')
echo "== ldd ${so}"
ldd "$so"
# Allowed at run time: the C and C++ runtimes (shared with the process: PyTorch catches what
# devrt_torch_malloc throws); the CUDA driver is opened by the statically linked CUDA runtime.
bad=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
      grep -Ev '^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$' || true)
if [ -n "$bad" ]; then
  echo "python package test: libdevrt_c.so needs libraries a user may not have: $bad" >&2
  exit 1
fi

# The tests, copied out of the repository so that they import the installed package: the same
# layout (tests/python beside python/examples, whose scripts the PyTorch and CuPy tests run), with
# no python/devrt in it.
mkdir -p "$tmp/src/tests/python" "$tmp/src/python/examples"
cp "$repo"/tests/python/*.py "$tmp/src/tests/python/"
cp "$repo"/python/examples/*.py "$tmp/src/python/examples/"
"$vpy" -m unittest discover -s "$tmp/src/tests/python" -v

"$vpy" -m pip uninstall -y devrt
listing >"$tmp/after"
if ! diff -u "$tmp/before" "$tmp/after"; then
  echo "python package test: pip uninstall left files behind (above)" >&2
  exit 1
fi

"$vpy" -m pip wheel --no-index --no-build-isolation --no-deps -w "$tmp/wheels" "$repo"
wheels=("$tmp"/wheels/devrt-*.whl)
[ -f "${wheels[0]}" ] || { echo "python package test: pip wheel made no wheel" >&2; exit 1; }
"$vpy" - "${wheels[@]}" <<'EOF'
import sys, zipfile
assert len(sys.argv) == 2, f"one wheel expected: {sys.argv[1:]}"
path = sys.argv[1]
name = path.rsplit("/", 1)[-1]
assert "-py3-none-linux_" in name, f"not a platform wheel: {name}"
files = zipfile.ZipFile(path).namelist()
for f in ("devrt/__init__.py", "devrt/torch.py", "devrt/cupy.py", "devrt/libdevrt_c.so"):
    assert f in files, f"{name} lacks {f}"
print("wheel:", name)
EOF
echo "== python package: passed in $((SECONDS - start)) s"

#!/usr/bin/env bash
# Installs what devrt needs to build and test, from Debian's packages, when it is missing.
set -euo pipefail
packages=(cmake ninja-build g++ libboost1.81-dev libboost-container1.81-dev libspdlog-dev libfmt-dev
          libgtest-dev libbenchmark-dev zlib1g-dev gnuplot-nox
          clang libclang-rt-14-dev  # the fuzz targets: clang++ and its libFuzzer runtime
          python3-venv python3-pip python3-setuptools python3-wheel)  # pip install . (the Python package)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "devrt setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

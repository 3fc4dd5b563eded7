#!/usr/bin/env bash
# Builds devrt-torch-baseline (tools/replay/torch_baseline.cpp) against the PyTorch that python3
# imports. Run on the GPU machine from the repository root:
#     tools/replay/build_torch_baseline.sh [OUTPUT]      (default build/release/tools/devrt-torch-baseline)
# Needs: g++ (C++17), PyTorch with its C++ headers, the CUDA headers and libcudart
# (CUDA_HOME, default /usr/local/cuda), zlib (zlib.h and libz).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-build/release/tools/devrt-torch-baseline}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
torch_dir="$(python3 -c 'import torch,os; print(os.path.dirname(torch.__file__))')"
abi="$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')"
mkdir -p "$(dirname "$out")"
cudart_dir="$cuda/lib64"
[ -d "$cudart_dir" ] || cudart_dir="$cuda/lib"
set -x
g++ -std=c++17 -O2 -D_GLIBCXX_USE_CXX11_ABI="$abi" \
  -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include" -isystem "$cuda/include" \
  "$here/torch_baseline.cpp" -o "$out" \
  -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib" -lc10_cuda -lc10 \
  -L"$cudart_dir" -Wl,-rpath,"$cudart_dir" -lcudart -lz

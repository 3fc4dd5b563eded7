#!/usr/bin/env bash
# Installs a devrt build into a scratch prefix, then configures, builds and runs the consumer
# project (tests/install/consumer) against it with find_package(devrt).
#
#   run_consumer_test.sh CMAKE BUILD_DIR CONSUMER_SOURCE WORK_DIR GENERATOR CXX BUILD_TYPE [CXX_FLAGS]
#
# CXX_FLAGS (sanitizer builds: the sanitizer flags) are used to compile the consumer too.
set -euo pipefail
cmake_cmd=$1 build_dir=$2 consumer_src=$3 work=$4 generator=$5 cxx=$6 build_type=$7 cxx_flags=${8:-}

rm -rf "${work}"
mkdir -p "${work}"
prefix=${work}/prefix

echo "== cmake --install ${build_dir} --prefix ${prefix}"
"${cmake_cmd}" --install "${build_dir}" --prefix "${prefix}" >"${work}/install.log"
for f in include/devrt/runtime/runtime.hpp include/devrt/memory/config.hpp include/devrt/devices/host_storage.hpp \
         include/devrt/c_api.h; do
  [ -f "${prefix}/${f}" ] || { echo "missing after install: ${f}"; exit 1; }
done
config=$(find "${prefix}" -name devrtConfig.cmake -print -quit)
[ -n "${config}" ] || { echo "missing after install: devrtConfig.cmake"; exit 1; }
echo "package: ${config#"${prefix}"/}"

echo "== configure the consumer"
"${cmake_cmd}" -S "${consumer_src}" -B "${work}/build" -G "${generator}" -DCMAKE_CXX_COMPILER="${cxx}" \
  -DCMAKE_BUILD_TYPE="${build_type}" -DCMAKE_PREFIX_PATH="${prefix}" -DCMAKE_CXX_FLAGS="${cxx_flags}"
echo "== build the consumer"
"${cmake_cmd}" --build "${work}/build"
echo "== run the consumer"
out=$("${work}/build/devrt_consumer")
echo "${out}"
grep -q '^devrt consumer: reserved 1048576 bytes on host$' <<<"${out}"
grep -q '^devrt consumer: ok$' <<<"${out}"
echo "== run the C consumer"
out=$("${work}/build/devrt_c_consumer")
echo "${out}"
grep -q '^devrt c consumer: ok$' <<<"${out}"
rm -rf "${work}"
echo "== consumer test passed"

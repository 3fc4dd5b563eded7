#!/usr/bin/env bash
# Installs a devrt build into a scratch prefix, then configures, builds and runs the consumer
# project (tests/install/consumer) against it with find_package(devrt), and with it every C++ block
# of README.md (readme_snippets.sh says how fragments are wrapped): a block that does not compile
# fails the test, and a block that is a whole program must run and exit 0.
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

echo "== the C++ blocks of README.md"
readme=$(cd "$(dirname "$0")/../.." && pwd)/README.md
bash "$(dirname "$0")/readme_snippets.sh" "${readme}" "${work}/snippets"
has_cuda=0
grep -q 'set(devrt_HAS_CUDA ON)' "${config}" && has_cuda=1

echo "== configure the consumer"
"${cmake_cmd}" -S "${consumer_src}" -B "${work}/build" -G "${generator}" -DCMAKE_CXX_COMPILER="${cxx}" \
  -DCMAKE_BUILD_TYPE="${build_type}" -DCMAKE_PREFIX_PATH="${prefix}" -DCMAKE_CXX_FLAGS="${cxx_flags}" \
  -DDEVRT_README_SNIPPETS="${work}/snippets"
echo "== build the consumer and the README's blocks"
keep_going=()  # every error at once, not only the first block's
case "${generator}" in
  Ninja*) keep_going=(-- -k 0) ;;
  *Makefiles) keep_going=(-- -k) ;;
esac
if ! "${cmake_cmd}" --build "${work}/build" "${keep_going[@]}" 2>&1; then
  echo "the consumer or a C++ block of README.md does not build (the errors above name the README's lines)"
  exit 1
fi
echo "== the README's blocks"
for src in "${work}"/snippets/snippet_*.cpp; do
  file=$(basename "${src}")
  name=${file%%.*}
  where=$(head -1 "${src}" | sed 's|^// ||; s| (.*||')
  if [[ ${file} == *.cuda.cpp && ${has_cuda} == 0 ]]; then
    echo "${where}: needs CUDA, which this devrt was built without: not built"
    continue
  fi
  [ -x "${work}/build/readme_${name}" ] || { echo "${where}: not built"; exit 1; }
  if [[ ${file} == *.main.cpp ]]; then
    if ! "${work}/build/readme_${name}" >"${work}/${name}.log" 2>&1; then
      cat "${work}/${name}.log"
      echo "${where}: the program fails"
      exit 1
    fi
    echo "${where}: builds and runs"
  else
    echo "${where}: builds"
  fi
done
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

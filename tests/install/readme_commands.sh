#!/usr/bin/env bash
# Runs the command blocks (```sh) of README.md, each as one bash script with `set -eo pipefail`,
# from the root of a scratch tree whose files are the repository's and whose build/release is the
# build under test, with HOME in that scratch tree (what the commands install goes there).
#
#   readme_commands.sh SOURCE_DIR BUILD_DIR WORK_DIR
#
# A block is skipped only when the line before it is `<!-- not run in CI: REASON -->`: those that
# need a GPU or take minutes: tools/demo.sh builds the release preset and serves 2000 requests,
# tools/test.sh builds and tests every preset, and pip builds libdevrt_c.so (tools/test.sh's python
# step, tools/python_package_test.sh, runs the pip commands). Every other block must exit 0. Exit
# code 1 when a block fails or when the README has no block that runs.
set -euo pipefail
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd) work=$3
readme=${src}/README.md

rm -rf "${work}"
mkdir -p "${work}/tree/build" "${work}/home" "${work}/blocks"
for entry in "${src}"/* "${src}"/.[!.]*; do
  [ -e "${entry}" ] || continue
  case "$(basename "${entry}")" in build | .git) continue ;; esac
  ln -s "${entry}" "${work}/tree/$(basename "${entry}")"
done
ln -s "${build}" "${work}/tree/build/release"

# One file per block: blocks/NN.sh (commands) with the README's lines on its first line, or
# blocks/NN.skip holding the reason.
awk -v dir="${work}/blocks" '
  inblock && /^```[[:space:]]*$/ { close(file); inblock = 0; previous = $0; next }
  inblock { print > file; next }
  /^```(sh|bash)[[:space:]]*$/ {
    n++
    if (previous ~ /^<!-- not run in CI: .* -->$/) {
      reason = previous
      sub(/^<!-- not run in CI: /, "", reason)
      sub(/ -->$/, "", reason)
      file = sprintf("%s/%02d.skip", dir, n)
      printf "README.md, line %d: %s\n", NR, reason > file
    } else {
      file = sprintf("%s/%02d.sh", dir, n)
      printf "# README.md, line %d\n", NR > file
    }
    inblock = 1
    next
  }
  /[^[:space:]]/ { previous = $0 }
  END { if (inblock) { print "README.md: a command block is not closed" > "/dev/stderr"; exit 1 } }
' "${readme}"

ran=0 skipped=0
for block in "${work}"/blocks/*; do
  [ -e "${block}" ] || continue
  if [[ ${block} == *.skip ]]; then
    echo "== not run: $(cat "${block}")"
    skipped=$((skipped + 1))
    continue
  fi
  echo "== $(head -1 "${block}" | sed 's|^# ||')"
  sed 1d "${block}"
  if ! (cd "${work}/tree" && HOME="${work}/home" bash -eo pipefail "${block}" >"${block}.log" 2>&1); then
    cat "${block}.log"
    echo "== FAILED: $(head -1 "${block}" | sed 's|^# ||')"
    exit 1
  fi
  tail -3 "${block}.log" | sed 's|^|   |'
  ran=$((ran + 1))
done
[ "${ran}" -gt 0 ] || { echo "README.md: no command block runs"; exit 1; }
echo "== ${ran} command blocks of README.md ran, ${skipped} not run"
rm -rf "${work}"

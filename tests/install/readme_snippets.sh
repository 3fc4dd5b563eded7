#!/usr/bin/env bash
# Extracts every ```cpp block of README.md into a C++ source file of its own, for the consumer
# project (tests/install/consumer) to build against the installed package.
#
#   readme_snippets.sh README OUT_DIR
#
# The README's convention:
#
# - A block with a line that starts with `int main(` is a whole program: the file is the block.
#   The install test also runs it (on the host; it must exit 0).
# - Any other block is a fragment. Its leading `#include`, `namespace x = y;` and `using` lines stay
#   at file scope; the rest becomes the body of `int main()`, after
#   `#include "devrt/runtime/runtime.hpp"`, the only devrt header a fragment may rely on.
# - An HTML comment on the line before the block (invisible on GitHub) says what the fragment
#   needs: `<!-- snippet: CODE -->` puts CODE at the start of main() (the names it declares are
#   those the fragment uses); `<!-- snippet cuda: CODE -->` does the same and includes
#   <cuda_runtime.h>: such a block is built only where devrt was built with CUDA.
#
# Files: OUT_DIR/snippet_NN[.main][.cuda].cpp, with #line directives so that a compiler error names
# the README's line. Exit code 1 when the README has no C++ block or an unterminated one.
set -euo pipefail
readme=$1 out=$2
mkdir -p "${out}"
rm -f "${out}"/snippet_*.cpp

awk -v out="${out}" -v name="$(basename "${readme}")" '
  function flush(   i, file, hoisting, line, first) {
    n++
    whole = 0
    for (i = 1; i <= count; i++) if (body[i] ~ /^int main\(/) whole = 1
    file = sprintf("%s/snippet_%02d%s%s.cpp", out, n, whole ? ".main" : "", cuda ? ".cuda" : "")
    printf "// %s, lines %d-%d (tests/install/readme_snippets.sh)\n", name, start, start + count - 1 > file
    if (whole) {
      printf "#line %d \"%s\"\n", start, name > file
      for (i = 1; i <= count; i++) print body[i] > file
    } else {
      print "#include \"devrt/runtime/runtime.hpp\"" > file
      if (cuda) print "#include <cuda_runtime.h>" > file
      first = 1
      for (i = 1; i <= count; i++) {
        line = body[i]
        if (line !~ /^(#include |namespace [A-Za-z_:]+ = |using |[[:space:]]*$)/) break
      }
      printf "#line %d \"%s\"\n", start, name > file
      for (first = 1; first < i; first++) print body[first] > file
      print "int main() {" > file
      if (context != "") print context > file
      printf "#line %d \"%s\"\n", start + i - 1, name > file
      for (; i <= count; i++) print body[i] > file
      print "  return 0;" > file
      print "}" > file
    }
    close(file)
    if (whole) wholes++
    if (cuda) cudas++
  }
  inblock && /^```[[:space:]]*$/ { flush(); inblock = 0; previous = $0; next }
  inblock { body[++count] = $0; next }
  /^```cpp[[:space:]]*$/ {
    inblock = 1; count = 0; start = NR + 1; cuda = 0; context = ""
    if (previous ~ /^<!-- snippet( cuda)?(:.*)? -->$/) {
      marker = previous
      sub(/^<!-- snippet/, "", marker)
      sub(/ -->$/, "", marker)
      if (marker ~ /^ cuda/) { cuda = 1; sub(/^ cuda/, "", marker) }
      sub(/^:[[:space:]]*/, "", marker)
      context = marker
    }
    next
  }
  /[^[:space:]]/ { previous = $0 }
  END {
    if (inblock) { printf "%s: the ```cpp block from line %d is not closed\n", name, start > "/dev/stderr"; exit 1 }
    if (n == 0) { printf "%s: no ```cpp block\n", name > "/dev/stderr"; exit 1 }
    printf "%s: %d C++ blocks (%d whole programs, %d fragments; %d need CUDA)\n", name, n, wholes, n - wholes, cudas
  }
' "${readme}"

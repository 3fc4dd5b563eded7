# Sourced by tools/gpu/run.sh and tools/gpu/ab.sh: one replay of a trace on the GPU machine.
#
#   replay_one BIN_DIR ALLOCATOR TRACE_FILE
#
# ALLOCATOR: devrt (BIN_DIR/devrt-replay on cuda storage), cudaMallocAsync (devrt-replay's
# baseline), torch_default or torch_expandable (/tmp/devrt-torch-baseline, built by
# tools/replay/build_torch_baseline.sh; expandable: PYTORCH_CUDA_ALLOC_CONF=expandable_segments).
# $CAP (say "--memory-limit 1.05x") goes to every replay. Prints the replay's JSON line, nothing
# when it failed.
replay_one() {
  local bin=$1 alloc=$2 trace=$3 out=""
  case $alloc in
    devrt) out=$(timeout 60 "$bin/devrt-replay" "$trace" --device cuda --json --no-progress ${CAP:-} 2>/dev/null) ;;
    cudaMallocAsync) out=$(timeout 60 "$bin/devrt-replay" "$trace" --baseline cudaMallocAsync --json --no-progress ${CAP:-} 2>/dev/null) ;;
    torch_default) out=$(timeout 90 /tmp/devrt-torch-baseline "$trace" --json ${CAP:-} 2>/dev/null) ;;
    torch_expandable) out=$(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 90 /tmp/devrt-torch-baseline "$trace" --json ${CAP:-} 2>/dev/null) ;;
  esac
  [ -n "$out" ] && echo "$out" | tail -1
  return 0
}

#!/usr/bin/env bash
# `make test`: every stage, in order, each one's output shown and kept in .cache/test-logs/<stage>.log.
# A failing stage does not stop the others; the summary says what ran, and the exit status is non-zero
# when any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
logs=.cache/test-logs
mkdir -p "$logs"
stages=(changelog argspecs sanity units pytest lint molecule build)
[ $# -gt 0 ] && stages=("$@")
declare -A status seconds
start_all=$SECONDS
for stage in "${stages[@]}"; do
  printf '\n===== make %s =====\n' "$stage"
  t0=$SECONDS
  make --no-print-directory "$stage" 2>&1 | tee "$logs/$stage.log"
  rc=${PIPESTATUS[0]}
  seconds[$stage]=$((SECONDS - t0))
  if [ "$rc" -eq 0 ]; then status[$stage]=passed; else status[$stage]="FAILED (exit $rc)"; fi
done
passed=0; failed=0
printf '\n===== summary (%ss in all) =====\n' "$((SECONDS - start_all))"
for stage in "${stages[@]}"; do
  printf '  %-10s %-16s %5ss   %s\n' "$stage" "${status[$stage]}" "${seconds[$stage]}" "$(scripts/stage_summary.sh "$stage" "$logs/$stage.log")"
  if [ "${status[$stage]}" = passed ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "stages: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

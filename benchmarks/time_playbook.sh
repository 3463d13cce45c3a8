#!/usr/bin/env bash
# Time playbook runs, for the benchmarks whose subject is a playbook itself (bench_site.py, bench_verify.py): RUNS runs of
# PLAYBOOK (-i inventories/local) with the collection's callback inference_cache.substrate.timings, each one's wall seconds,
# exit code, output and task timings written into FOLDER (run-N.log, run-N.json, runs.tsv: N, exit code, seconds). A hook
# runs after each run (AFTER_RUN="command", with RUN=N and FOLDER set): bench_site.py reads the engine's CPU there, while it
# runs. Nothing is started or stopped here beyond the playbook itself; the benchmark's Python reads FOLDER.
#
#   benchmarks/time_playbook.sh FOLDER RUNS PLAYBOOK [ansible-playbook arguments...]
set -uo pipefail
folder=$1 runs=$2 playbook=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$folder"
: > "$folder/runs.tsv"
for run in $(seq 1 "$runs"); do
  t0=$(date +%s%N)
  ANSIBLE_CALLBACKS_ENABLED=inference_cache.substrate.timings INFERENCE_CACHE_TIMINGS_PATH="$folder/run-$run.json" \
    "$root/.venv/bin/ansible-playbook" -i "$root/inventories/local" "$playbook" "$@" > "$folder/run-$run.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s\t%s\t%d.%03d\n' "$run" "$rc" $((ms / 1000)) $((ms % 1000)) >> "$folder/runs.tsv"
  if [ -n "${AFTER_RUN:-}" ]; then RUN=$run FOLDER=$folder bash -c "$AFTER_RUN"; fi
  [ "$rc" -eq 0 ] || exit "$rc"
done

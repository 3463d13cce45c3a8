#!/usr/bin/env bash
# `make bench-verify`: how long `make verify` takes on a warm engine (run `make site` first): RUNS runs of playbooks/verify.yml
# on the local default, timed as whole processes and task by task (benchmarks/time_playbook.sh); benchmarks/bench_verify.py
# reports the minimum, median and maximum and the slowest tasks of the last run (LIMIT: fail when the median is over it;
# JSON=1: one JSON object). Its scratch folder is removed at the end.
#
#   benchmarks/bench_verify.sh [RUNS] [ansible-playbook arguments...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-5}
shift || true
folder=$(mktemp -d "${TMPDIR:-/tmp}/bench-verify.XXXXXX")
trap 'rm -rf "$folder"' EXIT
load=$(cut -d' ' -f1 /proc/loadavg)
"$root/benchmarks/time_playbook.sh" "$folder" "$runs" "$root/playbooks/verify.yml" "$@" \
  || { echo "make verify failed; its output ends:"; tail -40 "$folder/run-$(wc -l < "$folder/runs.tsv").log"; exit 1; }
exec "$root/.venv/bin/python" "$root/benchmarks/bench_verify.py" --report "$folder" --load "$load" ${LIMIT:+--limit "$LIMIT"} ${JSON:+--json}

#!/usr/bin/env bash
# `make bench-site`: where the time of a newcomer's first `make site` goes. playbooks/site.yml on a fresh HOME (made empty
# here, as .ci/run does), twice: cold, then warm (it must report changed=0 within --warm-limit seconds), each timed task by
# task (benchmarks/time_playbook.sh); benchmarks/bench_site.py reports. The engine runs on ports of its own (PORT 8500,
# events KV_PORT 5900, replay REPLAY_PORT 5901), so that an engine of `make site` may run beside it; it is stopped at the
# end (playbooks/teardown.yml with the same HOME), also on failure, and the fresh HOME removed (--keep-home keeps it).
# Download caches are shared with the machine's (uv's and pip's under ~/.cache/substrate-ci of the real HOME, or
# UV_CACHE_DIR / PIP_CACHE_DIR when set), as CI shares them; --no-shared-cache leaves them in the fresh HOME too.
#
#   benchmarks/bench_site.sh [--keep-home] [--no-shared-cache] [bench_site.py report options: --json, --warm-limit N]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
keep=0 shared=1 report=()
for arg in "$@"; do
  case $arg in
    --keep-home) keep=1 ;;
    --no-shared-cache) shared=0 ;;
    *) report+=("$arg") ;;
  esac
done
real_home=$HOME
home=$(mktemp -d "${TMPDIR:-/tmp}/substrate-bench-site-home.XXXXXX")
export HOME=$home ANSIBLE_ASYNC_DIR=$home/.ansible_async ANSIBLE_CONFIG=$root/ansible.cfg ANSIBLE_FORCE_COLOR=0 ANSIBLE_NOCOLOR=1
unset UV_CACHE_DIR PIP_CACHE_DIR
if [ "$shared" = 1 ]; then
  export UV_CACHE_DIR=${SUBSTRATE_UV_CACHE_DIR:-$real_home/.cache/substrate-ci/uv} PIP_CACHE_DIR=${SUBSTRATE_PIP_CACHE_DIR:-$real_home/.cache/substrate-ci/pip}
fi
engine=$(printf '{"local_engine_port": %d, "local_engine_kv_events_endpoint": "tcp://127.0.0.1:%d", "local_engine_kv_events_replay_endpoint": "tcp://127.0.0.1:%d"}' \
  "${PORT:-8500}" "${KV_PORT:-5900}" "${REPLAY_PORT:-5901}")
# shellcheck disable=SC2317  # run by the EXIT trap
stop() {
  "$root/.venv/bin/ansible-playbook" -i "$root/inventories/local" "$root/playbooks/teardown.yml" -e "$engine" > "$home/teardown.log" 2>&1 \
    || { echo "teardown failed; its output:"; tail -40 "$home/teardown.log"; }
  if [ "$keep" = 1 ]; then echo "the fresh HOME is kept: $home"; else rm -rf "$home"; fi
}
trap stop EXIT
trap 'exit 130' INT TERM
# The engine's CPU is read right after the cold run, while it runs (the report adds it to the engine start).
AFTER_RUN="[ \"\$RUN\" != 1 ] || '$root/.venv/bin/python' '$root/benchmarks/bench_site.py' --engine-cpu '$home' > '$home/runs/engine-cpu.json'" \
  "$root/benchmarks/time_playbook.sh" "$home/runs" 2 "$root/playbooks/site.yml" -e "$engine"
rc=$?
"$root/.venv/bin/python" "$root/benchmarks/bench_site.py" --report "$home/runs" --home "$home" \
  --shared-caches "${UV_CACHE_DIR:-}" "${PIP_CACHE_DIR:-}" "${report[@]}" || { [ "$rc" -ne 0 ] || rc=1; }
exit "$rc"

#!/usr/bin/env bash
# `make test`: every stage, each one a make target, its output kept in .cache/test-logs/<stage>.log.
#
# The stages run in three lanes at once, because the slow parts wait on different things:
#   engine  the real vLLM engine on CPU: molecule `default` installs and starts it (converge = site.yml) and,
#           with --destroy=never, hands it to pytest, whose last test restarts and stops it; molecule destroy
#           then checks that no engine process is left. One install, two engine starts in all; then molecule
#           `kv_index` starts two more instances of that install (small KV caches) for the KV-block index proof,
#           and molecule `kwok` runs the Kubernetes path on a kwok cluster with real engines behind its engine pods
#           and the GIE EPP routing real requests to them;
#   builds  the Go builds (kwok cluster, helm, the GIE EPP and its CRDs), once per version: a test that needs one before
#           it is done waits on its lock (inference_cache.substrate.go_build), so each is built once. Every test and
#           scenario asks for its builds through go_build (playbooks/go_build.yml, or the roles that build what they run),
#           never by looking for a binary: the engine lane's EPP tests (test_epp_route_engine.py) may reach the GIE EPP
#           long before a cold build of it ends, and wait for it; the simulator (llm-d-inference-sim), which this lane does
#           not build, is built on first use the same way (molecule kwok_fleet, test_simulated_engine.py);
#           then the ansible-core matrix (scripts/core_matrix.py: the floor and the newest release, sanity, units and the
#           installed tarball), and the release checks (scripts/check_release.py: galaxy-importer, ansible-builder,
#           antsibull-docs lint);
#   checks  everything else (go test of tools/kvcache_probe, ansible-test sanity and units, lint, the other molecule tests,
#           build, then the other pytest tests, whose kwok cluster modules run last: tests/integration/conftest.py).
# The lanes share no port, file or engine. A stage's output is printed in one block when it ends.
# The builds lane runs at normal priority and the others at nice 5: where the Go builds are cold (a fresh machine,
# about 40 minutes of CPU) they get a larger share of the 2 cores (not all: vLLM threads and ansible forks run too),
# so the stages that wait for them start sooner; with warm builds (a relink, minutes) it changes nothing.
# A failing stage does not stop the others; the summary says what ran, and the exit status is non-zero when
# any stage failed.
#
# Usage: scripts/test_all.sh [stage ...]   (named stages run one after another; TEST_SERIAL=1 runs all that way)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
logs=.cache/test-logs
mkdir -p "$logs"
rm -f "$logs"/*.status

declare -A cmd=(
  [changelog]="make changelog"
  [argspecs]="make argspecs"
  [gotest]="make gotest"  # go test of the collection's own Go program (tools/kvcache_probe)
  [sanity]="make sanity"
  [units]="make units"
  [integration]="make integration"
  [lint]="make lint"
  [go-build]="make go-build"
  [core-floor]="make core-floor"    # ansible-core 2.16 (the declared floor), Python 3.11
  [core-newest]="make core-newest"  # ansible-core 2.21 (the newest), Python 3.13
  [release-check]="make release-check"  # galaxy-importer, ansible-builder, antsibull-docs lint on the built tarball
  [molecule-checks]="make molecule MOLECULE_EXCEPT='default kv_index kwok'"  # every scenario but the engine lane's
  [build]="make build"
  [molecule-engine]="make molecule SCENARIOS=default MOLECULE_TEST_ARGS=--destroy=never"
  [engine]="LOCAL_ENGINE_OWNED=1 make engine"
  [molecule-destroy]="make molecule-destroy SCENARIOS=default"
  [molecule-kv-index]="make molecule SCENARIOS=kv_index"  # two engines of the same install, after the default one stopped
  [molecule-kwok]="make molecule SCENARIOS=kwok"  # the Kubernetes path on kwok, real engines behind its pods, the GIE EPP
)
engine_lane=(molecule-engine engine molecule-destroy molecule-kv-index molecule-kwok)
checks_lane=(changelog argspecs gotest sanity units lint molecule-checks build integration)
builds_lane=(go-build core-floor core-newest release-check)
all=("${builds_lane[@]}" "${checks_lane[@]}" "${engine_lane[@]}")

run_stage() {
  local stage=$1 t0=$SECONDS rc secs niceness=${NICENESS:-0}
  [ -n "${cmd[$stage]:-}" ] || { echo "no stage named $stage (stages: ${all[*]})"; echo "2 0" > "$logs/$stage.status"; return; }
  echo "$(date +%T) start  $stage: ${cmd[$stage]}"
  nice -n "$niceness" bash -c "${cmd[$stage]} --no-print-directory" > "$logs/$stage.log" 2>&1
  rc=$? secs=$((SECONDS - t0))
  echo "$rc $secs" > "$logs/$stage.status"
  {
    flock 9
    printf '\n===== %s: %s (%s, %ss) =====\n' "$stage" "${cmd[$stage]}" "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED, exit $rc")" "$secs"
    cat "$logs/$stage.log"
    printf '===== end of %s =====\n' "$stage"
  } 9> "$logs/.print.lock"
}
run_lane() { local stage; for stage in "$@"; do run_stage "$stage"; done; }

# The whole suite gets a temporary folder of its own: at the end, whatever a stage left there (a scratch folder a
# failed play did not remove, a benchmark's working folder) is listed and fails the run, then the folder is removed,
# so `make test` leaves nothing in the system temporary folder. Two things are kept there by design and are not
# counted: pytest's own base folder (pytest-of-<user>, the last runs' tmp_path folders) and kubernetes.core's API
# discovery cache (k8srcp-<hash>.json, one per user and cluster, which kubernetes.core keeps in the temporary folder on
# every run and offers no option to move); both go with the suite's folder.
suite_tmp=$(mktemp -d "${TMPDIR:-/tmp}/substrate-test.XXXXXX")
export TMPDIR=$suite_tmp
trap 'rm -rf "$suite_tmp"' EXIT

start_all=$SECONDS
if [ $# -gt 0 ]; then
  stages=("$@"); run_lane "${stages[@]}"
elif [ "${TEST_SERIAL:-0}" = 1 ]; then
  stages=("${all[@]}"); run_lane "${stages[@]}"
else
  stages=("${all[@]}")
  run_lane "${builds_lane[@]}" &
  NICENESS=5 run_lane "${engine_lane[@]}" &
  NICENESS=5 run_lane "${checks_lane[@]}" &
  wait
fi

# What a failing stage said last, again, just above the summary: where only the end of this output is kept (a CI
# page's tail), each failure still shows its reason.
for stage in "${stages[@]}"; do
  read -r rc _secs < "$logs/$stage.status" 2>/dev/null || rc=missing
  if [ "$rc" != 0 ]; then
    printf '\n===== the end of the failed stage %s (whole in %s) =====\n' "$stage" "$logs/$stage.log"
    grep -E '^(E  |FAILED|ERROR|fatal:|\[core-matrix\]|\[release\])|Error|error:' "$logs/$stage.log" 2>/dev/null | tail -n 25
    tail -n 15 "$logs/$stage.log" 2>/dev/null
  fi
done

passed=0; failed=0
printf '\n===== summary (%ss in all) =====\n' "$((SECONDS - start_all))"
for stage in "${stages[@]}"; do
  read -r rc secs < "$logs/$stage.status" 2>/dev/null || { rc=missing; secs=0; }
  if [ "$rc" = 0 ]; then state=passed; passed=$((passed + 1)); else state="FAILED (exit $rc)"; failed=$((failed + 1)); fi
  printf '  %-16s %-16s %5ss   %s\n' "$stage" "$state" "$secs" "$(scripts/stage_summary.sh "$stage" "$logs/$stage.log" 2>/dev/null)"
done
echo "stages: $passed passed, $failed failed"
# And once more in a few lines, last of all: a CI page that keeps only the last twenty-odd lines still names the
# failed test (pytest's "FAILED path::test - reason") or task.
for stage in "${stages[@]}"; do
  read -r rc _secs < "$logs/$stage.status" 2>/dev/null || rc=missing
  if [ "$rc" != 0 ]; then
    echo "why $stage failed:"
    { grep -E '^(FAILED|ERROR) |fatal:|^\[core-matrix\].*(FAILED|failed)|^\[release\].*(FAILED|failed)' "$logs/$stage.log" 2>/dev/null \
        || tail -n 3 "$logs/$stage.log" 2>/dev/null; } | tail -n 6 | cut -c1-400 | sed 's/^/  /'
  fi
done
leftovers=$(find "$suite_tmp" -mindepth 1 -maxdepth 1 ! -name "pytest-of-*" ! -name "k8srcp-*.json" -printf '%f\n' | sort)
if [ -n "$leftovers" ]; then
  echo "left in the temporary folder by the stages (each should remove what it makes): $(echo "$leftovers" | tr '\n' ' ')"
  failed=$((failed + 1))
fi
[ "$failed" -eq 0 ]

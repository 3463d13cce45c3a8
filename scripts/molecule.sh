#!/usr/bin/env bash
# Run every molecule scenario under extensions/molecule/ that can run on this machine.
# A scenario that needs more than this machine has (a Docker engine, kind, a GPU) carries a preflight.sh:
# when it exits non-zero, the scenario is skipped and its output is printed as the reason. Nothing else skips.
# Usage: scripts/molecule.sh [scenario ...]   (MOLECULE_TEST_ARGS: more options for `molecule test`, e.g. --destroy=never;
#        MOLECULE_EXCEPT: scenarios to leave out when none is named)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH=$PWD/.venv/bin:$PATH
if [ $# -gt 0 ]; then scenarios=("$@"); else
  # shellcheck disable=SC2086  # MOLECULE_EXCEPT holds names, split on purpose
  mapfile -t scenarios < <(for f in extensions/molecule/*/molecule.yml; do basename "$(dirname "$f")"; done \
                           | grep -vxF -f <(printf '%s\n' ${MOLECULE_EXCEPT:-}))
fi
passed=() failed=() skipped=()
for s in "${scenarios[@]}"; do
  dir=extensions/molecule/$s
  if [ ! -f "$dir/molecule.yml" ]; then echo "molecule: no scenario named $s under extensions/molecule"; failed+=("$s"); continue; fi
  if [ -x "$dir/preflight.sh" ]; then
    if ! reason=$("$dir/preflight.sh" 2>&1); then
      echo "SKIPPED molecule scenario '$s': $reason"
      skipped+=("$s"); continue
    fi
  fi
  echo "----- molecule test -s $s ${MOLECULE_TEST_ARGS:-}"
  # shellcheck disable=SC2086  # MOLECULE_TEST_ARGS holds options, split on purpose
  if molecule test -s "$s" ${MOLECULE_TEST_ARGS:-}; then passed+=("$s"); else failed+=("$s"); fi
done
echo "molecule: ${#passed[@]} passed (${passed[*]:-}), ${#failed[@]} failed (${failed[*]:-}), ${#skipped[@]} skipped (${skipped[*]:-})"
[ "${#failed[@]}" -eq 0 ]

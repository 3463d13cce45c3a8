#!/usr/bin/env bash
# Can the kind scenario run here? Exit 0 when it can; otherwise print the reason and exit non-zero (77), and
# scripts/molecule.sh reports the scenario as skipped with that reason. The check itself is prerequisites.py.
here=$(cd "$(dirname "$0")" && pwd)
python=$here/../../../.venv/bin/python
[ -x "$python" ] || python=python3
exec "$python" "$here/prerequisites.py"

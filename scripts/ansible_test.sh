#!/usr/bin/env bash
# Run `ansible-test <args>` on a staged copy of the collection (ansible-test needs
# .../ansible_collections/<namespace>/<name>/ as a real directory, not a symlink).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# ANSIBLE_TEST_VENV: another environment (an ansible-core of scripts/core_matrix.py) in place of the toolchain.
VENV=${ANSIBLE_TEST_VENV:-$ROOT/.venv}
# ANSIBLE_TEST_STAGE: another folder for the staged copy, so that two runs at once do not share one.
STAGE=${ANSIBLE_TEST_STAGE:-$ROOT/.cache/stage}/ansible_collections/inference_cache/substrate

# ansible-test downloads a get-pip script; give it the offline stand-in for the pip version it pins.
pip_version=$("$VENV/bin/python" - <<'PY'
import pathlib, re, ansible_test
src = (pathlib.Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py").read_text()
match = re.search(r"pip='([0-9.]+)'", src)
print(match.group(1) if match else "")
PY
)
cache=$HOME/.ansible/test/cache
mkdir -p "$cache"
[ -n "$pip_version" ] && cp "$ROOT/scripts/get_pip_offline.py" "$cache/get_pip_${pip_version//./_}.py"

# Stage a copy of what git tracks or would track (a fresh copy each time: no stale files).
rm -rf "$STAGE"
mkdir -p "$STAGE"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 -I{} sh -c 'if test -e "{}"; then printf "%s\0" "{}"; fi' | tar --null -cf - -T -) | tar -xf - -C "$STAGE"
# ansible-test only considers files under version control when it finds a repository; give it one.
(cd "$STAGE" && git init -q . && git add -A >/dev/null)

cd "$STAGE"
export PATH=$VENV/bin:$PATH
exec ansible-test "$@"

#!/usr/bin/env bash
# Set up the controller toolchain for this repository, idempotently:
#   .venv/                       pinned development toolchain (requirements-dev.txt)
#   .cache/collections/          kubernetes.core (the copy inside the PyPI `ansible` wheel of ANSIBLE_PKG_VERSION)
#                                and this collection, linked in as inference_cache.substrate
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
VENV=$ROOT/.venv
COLL=$ROOT/.cache/collections
# kubernetes.core comes from Galaxy when reachable; otherwise from this release of the `ansible` package (14.5.0 carries
# kubernetes.core 6.6.0; the package wants Python 3.12, so its wheel is fetched for 3.12: only files are taken from it).
ANSIBLE_PKG_VERSION=${ANSIBLE_PKG_VERSION:-14.5.0}
# uv, which installs the pinned toolchain (pip does it when uv cannot).
UV_VERSION=${UV_VERSION:-0.13.9}

say() { printf '[setup] %s\n' "$*"; }

# One setup at a time: the lanes of `make test` (and a person's make beside them) each run it, and a venv rebuilt with
# --clear under a running one breaks it. The second waits, then finds everything up to date.
mkdir -p "$ROOT/.cache"
exec 9>"$ROOT/.cache/setup.lock"
flock 9

# 1. Virtual environment with the pinned toolchain (skipped when requirements-dev.txt is unchanged).
stamp=$VENV/.requirements-dev.sha256
want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "creating $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv --clear "$VENV"
  # uv installs the toolchain in about 20 s where pip takes about 50 s. It byte-compiles at install time, as pip does:
  # where PYTHONDONTWRITEBYTECODE is set, every ansible command would otherwise compile its imports again.
  # uv does not read pip's configuration, so where it cannot install (a private index, say) pip does the job.
  # (grep drops pip's notes about empty local index folders on some machines)
  pip_quiet() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@" 2>&1 | { grep -v 'is ignored: it is neither' || true; }; return "${PIPESTATUS[0]}"; }
  if pip_quiet install --quiet "uv==$UV_VERSION" \
     && "$VENV/bin/uv" pip install --quiet --compile-bytecode --python "$VENV/bin/python" -r requirements-dev.txt; then
    say "toolchain installed with uv $UV_VERSION"
  else
    say "uv could not install requirements-dev.txt: using pip"
    pip_quiet install --quiet -r requirements-dev.txt || { echo "[setup] pip could not install requirements-dev.txt"; exit 1; }
  fi
  echo "$want" > "$stamp"
else
  say "toolchain up to date in $VENV"
fi

# 2. shellcheck, which ansible-test sanity uses for shell scripts (Debian package; installed when we are root).
if ! command -v shellcheck >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    say "installing shellcheck (Debian package)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck; } >/dev/null 2>&1 \
      || say "could not install shellcheck: ansible-test sanity will skip its shellcheck test"
  else
    say "shellcheck not found: install it (e.g. apt-get install shellcheck) or ansible-test sanity skips that test"
  fi
fi

# 3. kubernetes.core, at the version the tests run: the copy inside the PyPI `ansible` package of ANSIBLE_PKG_VERSION
#    (recorded in .kubernetes-core-from; another release replaces it). SUBSTRATE_GALAXY_K8S=1 takes Galaxy's newest instead
#    (requirements.yml), where Galaxy answers.
mkdir -p "$COLL/ansible_collections"
k8s=$COLL/ansible_collections/kubernetes/core
from=$COLL/.kubernetes-core-from
want_from="ansible==$ANSIBLE_PKG_VERSION"
[ -n "${SUBSTRATE_GALAXY_K8S:-}" ] && want_from=galaxy
if [ -f "$k8s/MANIFEST.json" ] && [ "$(cat "$from" 2>/dev/null)" = "$want_from" ]; then
  say "kubernetes.core already present (from $want_from)"
elif [ "$want_from" = galaxy ]; then
  timeout 60 "$VENV/bin/ansible-galaxy" collection install --force -r requirements.yml -p "$COLL" >/dev/null \
    || { echo "[setup] Galaxy did not answer: unset SUBSTRATE_GALAXY_K8S to take kubernetes.core from the PyPI ansible package"; exit 1; }
  echo galaxy > "$from"
  say "kubernetes.core installed from Galaxy"
else
  say "extracting kubernetes.core from the PyPI ansible==$ANSIBLE_PKG_VERSION wheel"
  wheels=$ROOT/.cache/wheels
  mkdir -p "$wheels"
  "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    -d "$wheels" "ansible==$ANSIBLE_PKG_VERSION"
  rm -rf "$k8s"
  "$VENV/bin/python" - "$wheels/ansible-$ANSIBLE_PKG_VERSION-py3-none-any.whl" "$COLL" <<'PY'
import json, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "ansible_collections/kubernetes/core/"
with zipfile.ZipFile(wheel) as zf:
    members = [m for m in zf.namelist() if m.startswith(prefix)]
    if not members:
        sys.exit(f"{wheel} holds no {prefix}: pick another ANSIBLE_PKG_VERSION")
    zf.extractall(dest, members)
    version = json.loads(zf.read(prefix + "MANIFEST.json"))["collection_info"]["version"]
print(f"[setup] extracted {len(members)} files of kubernetes.core {version}")
PY
  echo "$want_from" > "$from"
fi

# 4. This collection, linked in so playbooks and pytest find inference_cache.substrate.
mkdir -p "$COLL/ansible_collections/inference_cache"
link=$COLL/ansible_collections/inference_cache/substrate
if [ "$(readlink "$link" 2>/dev/null)" != "$ROOT" ]; then
  rm -rf "$link"
  ln -s "$ROOT" "$link"
fi
say "collections under $COLL: $(cd "$COLL/ansible_collections" && echo */*)"

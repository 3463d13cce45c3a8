#!/usr/bin/env bash
# The built collection must carry the collection and nothing of CI, caches or test output.
set -euo pipefail
tarball=$1
listing=$(tar -tzf "$tarball")
bad=$(grep -E '(^|/)(\.ci|\.cache|\.venv|\.git|collections|tests/output|__pycache__|\.pytest_cache|\.hypothesis|benchmarks|scripts|tools)(/|$)' <<<"$listing" || true)
if [ -n "$bad" ]; then
  echo "The collection tarball $tarball carries files it should not:"; echo "$bad" | head -20; exit 1
fi
# No generated study data (its runs, summaries, plots): only the reports ship.
data=$(grep -E '^docs/routing-study/.*\.(jsonl|svg|png)$|^docs/routing-study/(.*/)?summary\.json$' <<<"$listing" || true)
if [ -n "$data" ]; then
  echo "The collection tarball $tarball carries generated study data:"; echo "$data" | head -20; exit 1
fi
for must in MANIFEST.json FILES.json README.md meta/runtime.yml; do
  grep -qx "$must" <<<"$listing" || { echo "The collection tarball $tarball lacks $must."; exit 1; }
done
# Nothing in it imports, loads or runs a file it leaves out (the tarball extracted, every Python file read).
"$(dirname "$0")/../.venv/bin/python" "$(dirname "$0")/check_tarball_imports.py" "$tarball" || exit 1
echo "tarball ok: $(wc -l <<<"$listing") entries, $(du -h "$tarball" | cut -f1) ($tarball)"

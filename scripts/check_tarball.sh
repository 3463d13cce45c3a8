#!/usr/bin/env bash
# The built collection must carry the collection and nothing of CI, caches or test output.
set -euo pipefail
tarball=$1
listing=$(tar -tzf "$tarball")
bad=$(grep -E '(^|/)(\.ci|\.cache|\.venv|\.git|collections|tests/output|__pycache__|\.pytest_cache|\.hypothesis|benchmarks|scripts|tools)(/|$)' <<<"$listing" || true)
if [ -n "$bad" ]; then
  echo "The collection tarball $tarball carries files it should not:"; echo "$bad" | head -20; exit 1
fi
for must in MANIFEST.json FILES.json README.md meta/runtime.yml; do
  grep -qx "$must" <<<"$listing" || { echo "The collection tarball $tarball lacks $must."; exit 1; }
done
echo "tarball ok: $(wc -l <<<"$listing") entries, $(du -h "$tarball" | cut -f1) ($tarball)"

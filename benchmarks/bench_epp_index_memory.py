#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Memory of the precise EPP's KV-block index per key: what router_kv_index_max_keys costs the EPP.

The llm-d EPP v0.9.0 keeps its precise prefix-cache index in llm-d-kv-cache v0.9.0's in-memory index (an LRU of
``inMemoryConfig.size`` block keys, each with an LRU of up to ``podCacheSize`` pod entries, and an engine-key map of the
same size: pkg/kvcache/kvblock/in_memory.go). tools/kvcache_probe ``-index-memory`` fills that very index (the module, not
a copy) with N keys of P pods each and reports the live heap (HeapInuse after two collections). The router role sizes
the EPP's memory from ``_router_kv_index_bytes_per_key`` (roles/router/vars/main.yml): with ``--require`` this exits 1
when a measured row at the role's podCacheSize exceeds it. Go's collector lets the heap grow to about twice the live data
(GOGC=100), which the role's limit (twice the index) allows for.

  .venv/bin/python benchmarks/bench_epp_index_memory.py [--keys 200000] [--pods 1,4,10] [--require] [--json]

Builds the probe first (``make kvcache-probe``: Go, the modules through the Go module proxy).
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, ".cache", "bin", "kvcache_probe")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--keys", type=int, default=200000)
    parser.add_argument("--pods", default="1,4,10", help="pod entries per key, comma-separated")
    parser.add_argument("--require", action="store_true", help="exit 1 when a row exceeds the router role's bytes per key")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    build = subprocess.run(["make", "-s", "kvcache-probe"], cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
    if build.returncode != 0:
        print("make kvcache-probe failed:\n" + (build.stdout + build.stderr)[-3000:], file=sys.stderr)
        return 2
    with open(os.path.join(ROOT, "roles", "router", "vars", "main.yml")) as handle:
        role_vars = yaml.safe_load(handle)
    per_key = int(role_vars["_router_kv_index_bytes_per_key"])
    rows = []
    for pods in [int(p) for p in args.pods.split(",")]:
        run = subprocess.run([PROBE, "-index-memory", str(args.keys), "-pods-per-key", str(pods), "-pod-cache-size", "10"],
                             capture_output=True, text=True, timeout=1800, check=False)
        if run.returncode != 0:
            print("kvcache_probe -index-memory failed: " + run.stderr[-2000:], file=sys.stderr)
            return 2
        rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps({"rows": rows, "role_bytes_per_key": per_key}))
    else:
        print("%10s %12s %14s %14s" % ("keys", "pods/key", "heap MiB", "bytes/key"))
        for row in rows:
            print("%10d %12d %14.1f %14.0f" % (row["keys"], row["pods_per_key"], row["heap_bytes"] / 1048576.0, row["bytes_per_key"]))
        print("router role: %d bytes per key (_router_kv_index_bytes_per_key), the limit twice the index" % per_key)
    over = [row for row in rows if row["bytes_per_key"] > per_key]
    if args.require and over:
        print("measured above the role's %d bytes per key: %s" % (per_key, [(r["pods_per_key"], round(r["bytes_per_key"])) for r in over]),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Memory per block, updates/s and lookups/s of the KV-block index (``_kv_index.KVBlockIndex``).

For 10^4, 10^5 and 10^6 blocks held over two engines: the index is filled with BlockStored events of 16 blocks
of 32 tokens (chained, as vLLM sends a prompt's blocks), then measured:

* memory per block: Python heap traced by tracemalloc while filling (a first fill; the times come from a second,
  untraced one), divided by the blocks held;
* stores/s: blocks applied per second through ``stored`` (request keys hashed from token ids, engine hashes mapped);
* removals/s: blocks applied per second through ``removed``;
* lookups/s: prompts of 16 blocks looked up on both engines per second, keys computed beforehand;
* keys/s: request keys computed per second from token ids (what a lookup of a new prompt costs first).

  .venv/bin/python benchmarks/bench_kv_index.py [--sizes 10000,100000,1000000] [--json]
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import random
import sys
import time
import tracemalloc

import _lab  # noqa: F401  pylint: disable=unused-import
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index as kvi  # noqa: E402  pylint: disable=wrong-import-order

BLOCK = 32
CHAIN = 16
ENGINES = ("kv@10.0.0.1:8000@m", "kv@10.0.0.2:8000@m")


def events(blocks, seed=0):
    """(engine, engine hashes, parent, token ids) for ``blocks`` blocks in chains of CHAIN."""
    rng = random.Random(seed)
    out = []
    next_hash = 1
    for chain in range(blocks // CHAIN):
        tokens = [rng.randrange(32000) for _i in range(CHAIN * BLOCK)]
        hashes = list(range(next_hash, next_hash + CHAIN))
        next_hash += CHAIN
        out.append((ENGINES[chain % 2], hashes, None, tokens))
    return out


def measure(blocks):
    evs = events(blocks)
    index = kvi.KVBlockIndex(BLOCK, "m")
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for engine, hashes, parent, tokens in evs:
        index.stored(engine, hashes, parent, tokens, BLOCK)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    index = kvi.KVBlockIndex(BLOCK, "m")   # again without tracing, for the time
    start = time.perf_counter()
    for engine, hashes, parent, tokens in evs:
        index.stored(engine, hashes, parent, tokens, BLOCK)
    store_s = time.perf_counter() - start
    held = index.size()

    prompts = [tokens for _e, _h, _p, tokens in evs[:min(len(evs), 2000)]]
    start = time.perf_counter()
    keys = [index.prompt_keys(tokens) for tokens in prompts]
    keys_s = time.perf_counter() - start

    start = time.perf_counter()
    rounds = 0
    while time.perf_counter() - start < 1.0:
        for prompt_keys in keys:
            for engine in ENGINES:
                index.lookup(engine, prompt_keys)
        rounds += 1
    lookup_s = time.perf_counter() - start

    start = time.perf_counter()
    for engine, hashes, _parent, _tokens in evs:
        index.removed(engine, hashes)
    remove_s = time.perf_counter() - start
    assert index.size() == 0
    return {
        "blocks": held,
        "bytes_per_block": round(used / float(held), 1),
        "stores_per_s": int(held / store_s),
        "removals_per_s": int(held / remove_s),
        "lookups_per_s": int(rounds * len(keys) * len(ENGINES) / lookup_s),
        "keys_per_s": int(len(prompts) * CHAIN / keys_s),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="blocks held, comma-separated")
    parser.add_argument("--json", action="store_true", help="one JSON object per size instead of a table")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not args.json:
        print("KV-block index (%d-token blocks, %d-block prompts, %d engines), Python %s" % (
            BLOCK, CHAIN, len(ENGINES), sys.version.split()[0]))
        print("%10s %14s %12s %12s %14s %12s" % ("blocks", "bytes/block", "stores/s", "removals/s", "lookups/s", "keys/s"))
    for size in sizes:
        row = measure(size)
        if args.json:
            print(json.dumps(row, sort_keys=True))
        else:
            print("%10d %14.1f %12d %12d %14d %12d" % (row["blocks"], row["bytes_per_block"], row["stores_per_s"],
                                                       row["removals_per_s"], row["lookups_per_s"], row["keys_per_s"]))
    if not args.json:
        print("lookups/s: prompts of %d blocks looked up on one engine (keys computed beforehand); keys/s: request keys "
              "hashed from token ids" % CHAIN)


if __name__ == "__main__":
    main()

# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The approximate prefix predictor of the llm-d router (pure Python, no Ansible).

What ``approx-prefix-cache-producer`` believes, without any KV event: it remembers which prompt blocks it
routed to which engine and assumes the engine still holds them, forgetting per engine in LRU order. Facts read
at llm-d/llm-d-router@v0.9.0, ``pkg/epp/framework/plugins/requestcontrol/dataproducer/``:

* Without a ``token-producer`` the framework creates the ``estimate`` backend, which packs the prompt's bytes
  into pseudo-tokens of 4 bytes (zero-padded; ``tokenizer/estimate.go`` ``packBytes``, ``bytesPerToken``):
  the blocks are character blocks.
* Blocks of ``blockSizeTokens`` pseudo-tokens; with ``autoTune`` the engine's block size from its metrics,
  raised to at least 64 (``approximateprefix/plugin.go`` ``GetBlockSize``, ``minBlockSizeTokens``). The last,
  partial block is hashed too (``hashing.go`` ``getKVCacheBlocksFromTokens``). The first hash covers the model
  name and the cache salt; each block's hash chains the previous one (``hashing.go`` ``computeBlockHashes``).
* Matching is greedy from the first block: for each block, every engine that has it gets one more; it stops at
  the first block no engine has (``plugin.go`` ``matchLongestPrefix``).
* After routing, the chosen engine's block hashes are added to its LRU (``PreRequest``); each engine's LRU holds
  ``NumOfGPUBlocks`` entries (its ``num_gpu_blocks`` metric with ``autoTune``, else ``lruCapacityPerServer``,
  default 31250) and evicting from it forgets the engine for that hash (``indexer.go``, ``types.go``).

Hashes here are this module's own (BLAKE2b): the predictor only compares its own hashes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import collections
import hashlib
import struct

BYTES_PER_TOKEN = 4
MIN_BLOCK_SIZE_TOKENS = 64
DEFAULT_LRU_CAPACITY = 31250


def pseudo_tokens(text):
    """The ``estimate`` backend's pseudo-tokens: the UTF-8 bytes, zero-padded to 4, read as little-endian uint32."""
    raw = text.encode("utf-8")
    if len(raw) % BYTES_PER_TOKEN:
        raw += b"\x00" * (BYTES_PER_TOKEN - len(raw) % BYTES_PER_TOKEN)
    return struct.unpack("<%dI" % (len(raw) // BYTES_PER_TOKEN), raw)


def effective_block_size(engine_block_size=None, configured=16, auto_tune=True):
    """The block size in pseudo-tokens the producer uses: the engine's (auto-tuned) or the configured one, at least 64."""
    size = engine_block_size if (auto_tune and engine_block_size) else configured
    return max(int(size), MIN_BLOCK_SIZE_TOKENS)


def block_hashes(text, block_size, model, cache_salt=""):
    """Chained hashes of the pseudo-token blocks of ``text`` (the last, partial block included)."""
    tokens = pseudo_tokens(text)
    prev = hashlib.blake2b(("%s\x00%s" % (model, cache_salt or "")).encode("utf-8"), digest_size=8).digest()
    hashes = []
    for start in range(0, len(tokens), block_size):
        block = struct.pack("<%dI" % len(tokens[start:start + block_size]), *tokens[start:start + block_size])
        prev = hashlib.blake2b(hashlib.blake2b(block, digest_size=8).digest() + prev, digest_size=8).digest()
        hashes.append(int.from_bytes(prev, "big"))
    return hashes


class ApproxPrefixPredictor:
    """Routing history with an LRU per engine, as the approximate producer keeps it."""

    def __init__(self, block_size, capacity=None):
        self.block_size = block_size
        self.default_capacity = capacity or DEFAULT_LRU_CAPACITY
        self.capacities = {}
        self.lrus = {}
        self.hash_to_engines = {}
        self.forgotten = 0

    def set_capacity(self, engine, capacity):
        """The engine's LRU size (its ``num_gpu_blocks``); takes effect when the engine's LRU is created."""
        if capacity and capacity > 0:
            self.capacities[engine] = int(capacity)

    def match(self, hashes):
        """Per engine, the number of prompt blocks the producer believes it holds (its greedy walk)."""
        result = {}
        for value in hashes:
            engines = self.hash_to_engines.get(value)
            if not engines:
                break
            for engine in engines:
                result[engine] = result.get(engine, 0) + 1
        return result

    def routed(self, engine, hashes):
        """Remember that the request with these block hashes went to ``engine``."""
        lru = self.lrus.get(engine)
        if lru is None:
            lru = self.lrus[engine] = collections.OrderedDict()
        capacity = self.capacities.get(engine, self.default_capacity)
        for value in hashes:
            if value in lru:
                lru.move_to_end(value)
            else:
                lru[value] = None
                if len(lru) > capacity:
                    old, _none = lru.popitem(last=False)
                    self._forget(old, engine)
        for value in hashes:
            self.hash_to_engines.setdefault(value, set()).add(engine)

    def _forget(self, value, engine):
        engines = self.hash_to_engines.get(value)
        if engines is not None:
            engines.discard(engine)
            if not engines:
                del self.hash_to_engines[value]
        self.forgotten += 1

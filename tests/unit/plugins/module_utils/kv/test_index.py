# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/index.py: the KV-block index (keys, stores, copies counted, removals, clears) and the cached tokens it predicts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index as kvi
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import Event

BS = 4
TOKENS = list(range(100, 118))          # 4 full blocks and 2 tokens
ENGINE_HASHES = [11, 12, 13, 14]


def stored(index, hashes=None, parent=None, tokens=None, engine="a", **kwargs):
    return index.stored(engine, ENGINE_HASHES if hashes is None else hashes, parent, TOKENS[:16] if tokens is None else tokens,
                        BS, **kwargs)


# -- keys -------------------------------------------------------------------------------------------
def test_keys_chain_full_blocks_only():
    keys = kvi.request_keys(TOKENS, BS, 7)
    assert len(keys) == 4
    assert keys[0] == kvi.key_hash(7, TOKENS[:4])
    assert keys[1] == kvi.key_hash(keys[0], TOKENS[4:8])
    assert kvi.request_keys(TOKENS[:3], BS, 7) == []


def test_keys_depend_on_parent_tokens_and_extra():
    base = kvi.request_keys(TOKENS, BS, 7)
    assert kvi.request_keys(TOKENS, BS, 8)[0] != base[0]
    changed = list(TOKENS)
    changed[5] = 999
    other = kvi.request_keys(changed, BS, 7)
    assert other[0] == base[0] and other[1:] != base[1:] and all(a != b for a, b in zip(other[1:], base[1:]))
    salted = kvi.request_keys(TOKENS, BS, 7, [("cache_salt", "s1"), None, None, None])
    assert all(a != b for a, b in zip(salted, base))
    assert kvi.request_keys(TOKENS, BS, 7, [None] * 4) == base


def test_large_token_ids_and_bad_block_size():
    assert kvi.key_hash(0, [1 << 40]) != kvi.key_hash(0, [1])
    with pytest.raises(ValueError, match="positive number of tokens"):
        kvi.request_keys(TOKENS, 0, 0)
    with pytest.raises(ValueError, match="extra-key entries"):
        kvi.request_keys(TOKENS, BS, 0, [None])
    with pytest.raises(ValueError, match="positive number of tokens"):
        kvi.KVBlockIndex(block_size=-1)


def test_lora_name_changes_the_root():
    index = kvi.KVBlockIndex(BS, "tiny")
    assert index.prompt_keys(TOKENS) != index.prompt_keys(TOKENS, lora_name="adapter")
    assert index.root() == kvi.root_key("tiny") != kvi.root_key("tiny", seed="42")


# -- events -----------------------------------------------------------------------------------------
def test_store_lookup_remove():
    index = kvi.KVBlockIndex(BS, "tiny")
    assert stored(index) == 4
    keys = index.prompt_keys(TOKENS)
    assert index.lookup("a", keys) == 4 and index.lookup("b", keys) == 0
    assert index.lookup_all(keys, ["a", "b"]) == {"a": 4, "b": 0}
    assert index.removed("a", [13]) == 1
    assert index.lookup("a", keys) == 2          # the chain breaks at the first missing block
    assert index.removed("a", [99]) == 0 and index.engine("a").removed_unknown == 1
    assert index.size("a") == 3 and index.size() == 3


def test_child_store_chains_from_the_parent_engine_hash():
    index = kvi.KVBlockIndex(BS, "tiny")
    stored(index, hashes=[11, 12], tokens=TOKENS[:8])
    stored(index, hashes=[13], parent=12, tokens=TOKENS[8:12])
    assert index.lookup("a", index.prompt_keys(TOKENS)) == 3


def test_store_with_unknown_parent_is_skipped():
    index = kvi.KVBlockIndex(BS, "tiny")
    assert stored(index, hashes=[13], parent=12, tokens=TOKENS[8:12]) == 0
    assert index.engine("a").stores_skipped == 1 and index.size("a") == 0


@pytest.mark.parametrize("count_copies, after_one_removal", [(True, 4), (False, 3)])
def test_copies_of_one_hash(count_copies, after_one_removal):
    """vLLM can hold two cached blocks with one hash and sends a BlockRemoved for each copy it evicts."""
    index = kvi.KVBlockIndex(BS, "tiny", count_copies=count_copies)
    stored(index)
    stored(index, hashes=[14], parent=13, tokens=TOKENS[12:16])   # the last block recomputed: a second copy
    keys = index.prompt_keys(TOKENS)
    index.removed("a", [14])
    assert index.lookup("a", keys) == after_one_removal
    index.removed("a", [14])
    assert index.lookup("a", keys) == 3
    assert index.engine("a").stored_again == 1


def test_clear_and_engines_are_separate():
    index = kvi.KVBlockIndex(BS, "tiny")
    stored(index, engine="a")
    stored(index, engine="b")
    keys = index.prompt_keys(TOKENS)
    index.cleared("a")
    assert index.lookup("a", keys) == 0 and index.lookup("b", keys) == 4
    assert index.engine("a").clears == 1


def test_block_size_from_first_store_and_bytes_hashes():
    index = kvi.KVBlockIndex(None, "tiny")
    with pytest.raises(ValueError, match="does not know its block size"):
        index.prompt_keys(TOKENS)
    index.stored("a", [b"\x00" * 7 + b"\x0b", 12], None, TOKENS[:8], BS)
    assert index.block_size == BS
    assert index.removed("a", [11]) == 1       # bytes and ints name the same hash
    with pytest.raises(ValueError, match="without token ids"):
        index.stored("a", [1], None, None, BS)


@pytest.mark.parametrize("engine_hashes, held_after_removing_first", [
    ([11, 12], 0),                           # 2 engine blocks of 8 tokens for 4 index blocks (1:many): both keys of 11 go
    ([11, 12, 13, 14, 15, 16, 17, 18], 0),   # 8 engine blocks of 2 tokens for 4 index blocks (many:1): the first key goes
])
def test_mapping_by_ratio(engine_hashes, held_after_removing_first):
    index = kvi.KVBlockIndex(BS, "tiny")
    index.stored("a", engine_hashes, None, TOKENS[:16], 16 // len(engine_hashes))
    keys = index.prompt_keys(TOKENS)
    assert index.lookup("a", keys) == 4
    index.removed("a", [engine_hashes[0]])
    assert index.lookup("a", keys) == held_after_removing_first


def test_apply_decoded_events():
    index = kvi.KVBlockIndex(BS, "tiny")
    assert index.apply("a", Event("BlockStored", [11, 12], None, 8, TOKENS[:8], BS)) == 2
    assert index.apply("a", Event("BlockRemoved", [12])) == 1
    assert index.lookup("a", index.prompt_keys(TOKENS)) == 1
    index.apply("a", Event("AllBlocksCleared"))
    assert index.size("a") == 0


def test_salted_blocks_are_not_the_unsalted_prompt():
    """vLLM hashes a cache salt (first block) and a LoRA name (every block) into a block: so does the index."""
    index = kvi.KVBlockIndex(BS, "tiny")
    salted = [("tenant-salt",), None, None, None]
    assert index.apply("a", Event("BlockStored", ENGINE_HASHES, None, 16, TOKENS[:16], BS, extra_keys=salted)) == 4
    assert index.lookup("a", index.prompt_keys(TOKENS)) == 0
    assert index.lookup("a", index.prompt_keys(TOKENS, extra_keys=salted + [None])) == 4
    # A store without extra keys (or all nil) is the plain prompt.
    index.apply("b", Event("BlockStored", ENGINE_HASHES, None, 16, TOKENS[:16], BS, extra_keys=[None] * 4))
    assert index.lookup("b", index.prompt_keys(TOKENS)) == 4


def test_extra_keys_realigned_to_the_index_blocks():
    """One entry per engine block of 8 tokens, an index of 4-token blocks: each entry covers two index blocks."""
    index = kvi.KVBlockIndex(BS, "tiny")
    index.apply("a", Event("BlockStored", [21, 22], None, 16, TOKENS[:16], 8, extra_keys=[("salt",), None]))
    assert index.lookup("a", index.prompt_keys(TOKENS, extra_keys=[("salt",), ("salt",), None, None])) == 4
    assert index.lookup("a", index.prompt_keys(TOKENS)) == 0


@pytest.mark.parametrize("held, prompt, expected", [
    (0, 100, 0), (2, 100, 64), (3, 100, 96), (4, 100, 96), (4, 128, 96), (4, 129, 128), (9, 0, 0), (1, 33, 32), (1, 32, 0),
])
def test_predicted_cached_tokens(held, prompt, expected):
    assert kvi.predicted_cached_tokens(held, prompt, 32) == expected


# -- approximate producer ---------------------------------------------------------------------------


# -- workload ---------------------------------------------------------------------------------------

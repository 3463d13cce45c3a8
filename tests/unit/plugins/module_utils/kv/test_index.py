# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The KV-block index, the approximate predictor and the workload generator (pure functions and classes)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index as kvi
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index_approx as approx
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import workload
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
def test_pseudo_tokens_pack_four_bytes():
    assert approx.pseudo_tokens("abcd") == (0x64636261,)
    assert approx.pseudo_tokens("abcde") == (0x64636261, 0x65)
    assert approx.pseudo_tokens("") == ()


@pytest.mark.parametrize("engine_bs, configured, auto, expected", [(32, 16, True, 64), (128, 16, True, 128), (None, 16, True, 64),
                                                                   (128, 80, False, 80)])
def test_effective_block_size(engine_bs, configured, auto, expected):
    assert approx.effective_block_size(engine_bs, configured, auto) == expected


def test_block_hashes_include_the_partial_tail_and_model():
    text = "x" * (64 * 4 * 2 + 5)
    hashes = approx.block_hashes(text, 64, "tiny")
    assert len(hashes) == 3
    assert approx.block_hashes(text[:64 * 4], 64, "tiny") == hashes[:1]
    assert approx.block_hashes(text, 64, "other")[0] != hashes[0]
    assert approx.block_hashes(text, 64, "tiny", cache_salt="s")[0] != hashes[0]


def test_predictor_greedy_match_and_lru():
    pred = approx.ApproxPrefixPredictor(64, capacity=3)
    pred.routed("a", [1, 2, 3])
    pred.routed("b", [1, 9])
    assert pred.match([1, 2, 3, 4]) == {"a": 3, "b": 1}
    assert pred.match([5, 1]) == {}
    pred.routed("a", [7])        # evicts the least recently used entry of a (hash 1)
    assert pred.forgotten == 1
    # The walk goes on while any engine has the block and counts every engine that has it, consecutive or not.
    assert pred.match([1, 2]) == {"b": 1, "a": 1}
    assert pred.match([2, 3]) == {"a": 2}
    pred.set_capacity("c", 1)
    pred.routed("c", [5, 6])     # 5 is evicted from c's LRU at once, yet recorded for c after it (as upstream's Add)
    assert pred.match([5, 6]) == {"c": 2}


# -- workload ---------------------------------------------------------------------------------------
def test_workload_is_deterministic_and_mixed():
    steps = workload.build(["a", "b"])
    again = workload.build(["a", "b"])
    assert [(s.family, s.kind, s.base, s.tail, s.targets) for s in steps] == [(s.family, s.kind, s.base, s.tail, s.targets) for s in again]
    assert len(steps) == 48
    kinds = set(s.kind for s in steps)
    assert kinds == {"prefix", "suffix", "repeat"}
    assert sum(len(s.targets) for s in steps) >= 50
    assert any(len(s.targets) == 2 for s in steps)
    assert len(set(s.base for s in steps)) == 8
    assert all(s.base.split("\n")[0] == steps[0].base.split("\n")[0] for s in steps)   # one shared preamble
    assert workload.build(["a", "b"], {"seed": 1})[0].base != steps[0].base


def test_workload_one_engine():
    steps = workload.build(["a"], {"families": 2, "rounds": 2})
    assert all(s.targets == ["a"] for s in steps)


@pytest.mark.parametrize("params, message", [
    ({"families": 0}, "workload.families must be at least 1, got 0."),
    ({"fan_out_every": -1}, "workload.fan_out_every must be at least 0, got -1."),
    ({"rounds": "x"}, "workload.rounds must be an integer, got 'x'."),
    ({"other": 1}, "workload has unknown keys other; known: families, fan_out_every, move_every, "),
    ("3", "workload must be a mapping, got '3'."),
])
def test_workload_validation(params, message):
    with pytest.raises(CheckError) as info:
        workload.build(["a"], params)
    assert info.value.msg.startswith(message), info.value.msg
    with pytest.raises(ValueError, match="at least one engine"):
        workload.build([])

# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/index_approx.py: the approximate prefix-cache producer's model (character blocks, routing history, an LRU per engine)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index_approx as approx


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

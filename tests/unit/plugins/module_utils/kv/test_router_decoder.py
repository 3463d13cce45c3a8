# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/router_decoder.py: what the llm-d router's own KV-event decoder (llm-d-kv-cache v0.9.0's vLLM adapter) takes."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import router_decoder as D

STORED = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, 2, 3, 4], "block_size": 4,
          "lora_id": None, "medium": "GPU", "lora_name": None}


def test_a_batch_of_map_and_array_events_is_taken():
    batch = [1.0, [STORED, ["BlockRemoved", [1], "GPU"], {"type": "AllBlocksCleared"}], 0]
    assert D.problems(batch) == [] and D.tags(batch) == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]


@pytest.mark.parametrize("event, phrase", [
    ({"type": "Mystery"}, "has the type 'Mystery', which the decoder does not know"),
    ({"block_hashes": [1]}, "is a map without a string 'type' tag"),
    ([], "is an array without a string tag first"),
    (3, "is a number, neither an array nor a map"),
    (dict(STORED, block_size="4"), "block_size"),
])
def test_what_the_decoder_refuses_is_a_phrase_naming_the_event(event, phrase):
    found = D.event_problems(event, where="event 0")
    assert found and phrase in found[0] and found[0].startswith("event 0"), found


def test_a_batch_that_is_no_positional_array_is_refused():
    assert D.problems({"ts": 1.0}) == ["the batch is a map, not a positional array"]
    assert D.VERSIONS == (D.ROUTER_VERSION,)

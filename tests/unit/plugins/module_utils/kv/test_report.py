# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/report.py: what a subscriber could not use (bounded), the statistics kv_events_check returns, the JSON lines."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json

import msgspec

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import report as R
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import KVDecoder


def test_other_topics_are_bounded_and_the_first_malformed_reason_kept():
    tally = R.Tally(max_topics=2)
    for topic in ("a", "b", "c", "d", "a"):
        tally.add_other_topic(topic)
    assert tally.other_topics == {"a": 2, "b": 1, R.OTHER_TOPICS_OVERFLOW: 2}
    tally.add_malformed("first")
    tally.add_malformed("second")
    assert (tally.malformed, tally.malformed_reason) == (2, "first")
    tally.topics = {"x": 1, "y": 1}
    assert tally.accepts_topic("x") and not tally.accepts_topic("z")


def _batch(seq, events):
    return KVDecoder("vllm", include_token_ids=True).decode_payload(msgspec.msgpack.encode([1.0, events, 0]), "kv@a:1@m", seq)


STORED = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": list(range(8)), "block_size": 4,
          "lora_id": None, "medium": "GPU", "lora_name": None}


def test_stats_count_batches_events_and_blocks_per_medium():
    stats = R.KVStats()
    stats.add_batch(_batch(0, [STORED]))
    stats.add_batch(_batch(1, [{"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}]))
    facts = stats.facts()
    assert facts["batches"] == 2 and facts["counts"]["BlockStored"] == 1 and facts["counts"]["BlockRemoved"] == 1
    assert facts["stored_blocks"] == 2 and facts["removed_blocks"] == 1 and facts["block_size"] == 4
    assert facts["media"]["GPU"]["stored_blocks"] == 2 and facts["malformed"] == {"count": 0, "first_reason": None}


def test_json_lines_carry_token_ids_only_when_asked():
    batch = _batch(3, [STORED])
    plain = json.loads(R.batch_json_lines(batch)[0])
    assert plain["seq"] == 3 and plain["topic"] == "kv@a:1@m" and "token_ids" not in plain and plain["token_count"] == 8
    assert json.loads(R.batch_json_lines(batch, include_token_ids=True)[0])["token_ids"] == list(range(8))

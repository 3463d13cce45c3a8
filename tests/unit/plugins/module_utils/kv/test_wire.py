# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/wire.py: the KV-event wire formats (msgspec structs of both batch encodings) and what they turn into as JSON."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import msgspec
import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import wire as W
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import KVDecoder


@pytest.mark.parametrize("value, expected", [(2 ** 64 - 1, 2 ** 64 - 1), (b"\x01\xff", "01ff"), (bytearray(b"\x00"), "00")])
def test_hash_to_json_keeps_uint64_and_hexes_bytes(value, expected):
    assert W.hash_to_json(value) == expected


@pytest.mark.parametrize("items, expected", [([], 0), ([1] * 15, 15), ([1] * 16, 16), ([1] * 70000, 70000)])
def test_raw_array_len_reads_the_header_only(items, expected):
    assert W.raw_array_len(msgspec.msgpack.encode(items)) == expected


def test_raw_array_len_of_nil_and_of_what_is_no_array():
    assert W.raw_array_len(msgspec.msgpack.encode(None)) is None and W.raw_array_len(b"") is None
    assert W.raw_array_len(msgspec.msgpack.encode({"a": 1})) == -1


def test_a_decoded_event_as_json_counts_tokens_and_keeps_token_ids_only_when_asked():
    stored = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": list(range(8)), "block_size": 4,
              "lora_id": None, "medium": "GPU", "lora_name": None}
    payload = msgspec.msgpack.encode([1.0, [stored, {"type": "AllBlocksCleared"}], 0])
    plain = KVDecoder("vllm").decode_payload(payload, "kv@a:1@m", 0)
    event = W.event_to_dict(plain.events[0], max_hashes=1)
    assert event["num_blocks"] == 2 and event["block_hashes"] == [1] and event["token_count"] == 8 and "token_ids" not in event
    assert W.event_to_dict(plain.events[1]) == {"type": "AllBlocksCleared"}
    kept = KVDecoder("vllm", include_token_ids=True).decode_payload(payload, "kv@a:1@m", 0)
    assert W.event_to_dict(kept.events[0])["token_ids"] == list(range(8))

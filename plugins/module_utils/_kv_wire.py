# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Typed msgspec shapes of the KV-event wire format (fast path of the decoder).

This file imports msgspec unconditionally; ``_kv_events`` imports it behind a guard.
Token ids and extra keys are declared as ``msgspec.Raw``: they are never decoded into Python
objects unless the caller opts in, which keeps token content out of memory and makes the
common path faster than a plain typed decode.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from typing import Any, ClassVar, List, Optional, Union  # pylint: disable=unused-import


def hash_to_json(value):
    """uint64 hashes stay ints; byte hashes become hex strings."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return value


def event_to_dict(ev, max_hashes=None):
    """JSON-safe dict of a decoded event; ``token_ids`` only when the caller opted in to decoding them."""
    out = {"type": ev.type}
    if ev.type == "AllBlocksCleared":
        return out
    hashes = ev.block_hashes if max_hashes is None else ev.block_hashes[:max_hashes]
    out["num_blocks"] = len(ev.block_hashes)
    out["block_hashes"] = [hash_to_json(h) for h in hashes]
    if ev.type == "BlockStored":
        out["parent_block_hash"] = hash_to_json(ev.parent_block_hash)
        out["token_count"] = ev.token_count
        out["block_size"] = ev.block_size
        out["lora_id"] = ev.lora_id
        out["lora_name"] = ev.lora_name
        out["kv_cache_spec_kind"] = ev.kv_cache_spec_kind
        out["kv_cache_spec_sliding_window"] = ev.kv_cache_spec_sliding_window
        out["has_cache_salt"] = ev.has_cache_salt
        if ev.token_ids is not None:
            out["token_ids"] = list(ev.token_ids)
    out["medium"] = ev.medium
    out["group_idx"] = ev.group_idx
    return out


try:
    import msgspec
    HAS_MSGSPEC = True
except ImportError:  # the importer (_kv_events) reports it; the module fails with missing_required_lib
    msgspec = None
    HAS_MSGSPEC = False

if HAS_MSGSPEC:
    Hash = Union[int, bytes]
    _EMPTY_RAW = msgspec.Raw()

    class BlockStored(msgspec.Struct, tag_field="type", tag=True, gc=False):
        """vLLM >= 0.24 map-encoded BlockStored (extra fields ignored); also the decoded event itself.

        After decoding, the decoder sets ``token_count`` and replaces ``token_ids`` and ``extra_keys``
        (undecoded ``Raw`` bytes) with None, or ``token_ids`` with the decoded list when opted in.
        """

        type: ClassVar[str] = "BlockStored"
        to_dict = event_to_dict
        block_hashes: List[Hash] = []
        parent_block_hash: Optional[Hash] = None
        token_ids: msgspec.Raw = _EMPTY_RAW
        block_size: Optional[int] = None
        lora_id: Optional[int] = None
        medium: Optional[str] = None
        lora_name: Optional[str] = None
        extra_keys: msgspec.Raw = _EMPTY_RAW
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None
        token_count: Optional[int] = None
        has_cache_salt: bool = False

    class BlockRemoved(msgspec.Struct, tag_field="type", tag=True, gc=False):
        """vLLM >= 0.24 map-encoded BlockRemoved."""

        type: ClassVar[str] = "BlockRemoved"
        to_dict = event_to_dict

        block_hashes: List[Hash] = []
        medium: Optional[str] = None
        group_idx: Optional[int] = None

    class AllBlocksCleared(msgspec.Struct, tag_field="type", tag=True, gc=False):
        """vLLM AllBlocksCleared (no fields)."""

        type: ClassVar[str] = "AllBlocksCleared"
        block_hashes: ClassVar[tuple] = ()
        to_dict = event_to_dict

    MapEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]

    class ArrayBatchOfMaps(msgspec.Struct, array_like=True, gc=False):
        """Outer batch as vLLM sends it: ``[ts, events, data_parallel_rank]``."""

        ts: float
        events: List[MapEvent]
        data_parallel_rank: Optional[int] = None

    class MapBatchOfMaps(msgspec.Struct, gc=False):
        """Outer batch encoded as a map (seen in one vLLM revision)."""

        ts: float
        events: List[MapEvent]
        data_parallel_rank: Optional[int] = None
        attn_dp_rank: Optional[int] = None

    TYPED_DECODERS = (
        ("array", msgspec.msgpack.Decoder(ArrayBatchOfMaps)),
        ("map", msgspec.msgpack.Decoder(MapBatchOfMaps)),
    )
    GENERIC_DECODER = msgspec.msgpack.Decoder()
    TOKEN_DECODER = msgspec.msgpack.Decoder(List[int])
    DecodeError = msgspec.DecodeError
    ValidationError = msgspec.ValidationError
    Raw = msgspec.Raw
    encode = msgspec.msgpack.encode

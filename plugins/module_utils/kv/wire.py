# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Typed msgspec shapes of the KV-event wire format (fast path of the decoder).

This file imports msgspec unconditionally; ``events.py`` imports it behind a guard.
Two families of shapes, chosen by the decoder's ``include_token_ids`` flag:

* ``SHAPES`` (default, the check): token ids are kept as an undecoded ``msgspec.Raw`` slice (their
  count is read from the msgpack array header on demand) and ``extra_keys`` (cache salts, multimodal
  hashes) are not declared at all, so msgspec skips them. The decoded batch struct *is* the decoded
  batch (topic and sequence number are set on it), so the common path does no per-event Python work
  and is faster than a plain typed decode that builds the token lists.
* ``SHAPES_WITH_TOKENS`` (opt-in, e.g. a KV-block index that needs the tokens): token ids decoded
  into ``list[int]`` and ``extra_keys`` kept (one entry per block, ``None`` or a list), because they change a
  block's identity. ``event_to_dict`` never reports them.

Both expose the attributes of ``events.Event`` / ``events.DecodedBatch``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from typing import Any, ClassVar, List, Optional, Union  # pylint: disable=unused-import


def hash_to_json(value):
    """uint64 hashes stay ints; byte hashes become hex strings."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return value


def raw_array_len(raw):
    """Length of a msgpack array from its header, without decoding it; None for nil, -1 if not an array."""
    view = memoryview(raw)
    if not view:
        return None
    head = view[0]
    if 0x90 <= head <= 0x9F:
        return head & 0x0F
    if head == 0xDC and len(view) >= 3:
        return int.from_bytes(view[1:3], "big")
    if head == 0xDD and len(view) >= 5:
        return int.from_bytes(view[1:5], "big")
    if head == 0xC0:
        return None
    return -1


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
except ImportError:  # the importer (events.py) reports it; the module fails with missing_required_lib
    msgspec = None
    HAS_MSGSPEC = False


def _batch_shapes(event_union):
    """The two outer batch encodings, over the given event union."""

    class _Batch(msgspec.Struct, gc=False):
        """What both encodings share: the bookkeeping class attributes and the event format."""

        unknown: ClassVar[dict] = {}
        errors: ClassVar[tuple] = ()
        fast: ClassVar[bool] = True

        @property
        def event_format(self):
            return "map" if self.events else None

    class ArrayBatch(_Batch, array_like=True, gc=False):
        """Outer batch as vLLM sends it: ``[ts, events, data_parallel_rank]``; the fields after it are ours.

        A future fourth wire element would land in ``topic``: a non-string fails validation (the tolerant
        path takes over), a string is overwritten by the decoder.
        """

        ts: float
        events: List[event_union]
        data_parallel_rank: Optional[int] = None
        topic: str = ""
        seq: Optional[int] = None
        forced_engine: Optional[str] = None

        batch_format: ClassVar[str] = "array"

        @property
        def rank(self):
            return self.data_parallel_rank

        @property
        def engine_hint(self):
            return self.forced_engine or "vllm"

    class MapBatch(_Batch, gc=False):
        """Outer batch encoded as a map (one vLLM revision; SGLang's ``attn_dp_rank``)."""

        ts: float
        events: List[event_union]
        data_parallel_rank: Optional[int] = None
        attn_dp_rank: Optional[int] = None
        topic: str = ""
        seq: Optional[int] = None
        forced_engine: Optional[str] = None

        batch_format: ClassVar[str] = "map"

        @property
        def rank(self):
            return self.attn_dp_rank if self.data_parallel_rank is None else self.data_parallel_rank

        @property
        def engine_hint(self):
            if self.forced_engine:
                return self.forced_engine
            return "sglang" if self.attn_dp_rank is not None else "vllm"

    return (("array", msgspec.msgpack.Decoder(ArrayBatch)), ("map", msgspec.msgpack.Decoder(MapBatch)))


if HAS_MSGSPEC:
    Hash = Union[int, bytes]
    _EMPTY_RAW = msgspec.Raw()

    class BlockStored(msgspec.Struct, tag_field="type", tag=True, gc=False, rename={"token_raw": "token_ids"}):
        """vLLM >= 0.24 map-encoded BlockStored, token ids left undecoded, extra keys skipped (extra fields ignored)."""

        type: ClassVar[str] = "BlockStored"
        token_ids: ClassVar[None] = None
        has_cache_salt: ClassVar[bool] = False
        to_dict = event_to_dict

        block_hashes: List[Hash] = []
        parent_block_hash: Optional[Hash] = None
        token_raw: msgspec.Raw = _EMPTY_RAW
        block_size: Optional[int] = None
        lora_id: Optional[int] = None
        medium: Optional[str] = None
        lora_name: Optional[str] = None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None

        @property
        def token_count(self):
            """Tokens in the block(s), from the array header; None if absent, -1 if ``token_ids`` is not an array."""
            return raw_array_len(self.token_raw)

    class BlockStoredWithTokens(msgspec.Struct, tag_field="type", tag="BlockStored", gc=False):
        """The same event with token ids decoded and extra keys kept (opt-in)."""

        type: ClassVar[str] = "BlockStored"
        has_cache_salt: ClassVar[bool] = False
        to_dict = event_to_dict

        block_hashes: List[Hash] = []
        parent_block_hash: Optional[Hash] = None
        token_ids: Optional[List[int]] = None
        block_size: Optional[int] = None
        lora_id: Optional[int] = None
        medium: Optional[str] = None
        lora_name: Optional[str] = None
        extra_keys: Optional[List[Optional[List[Any]]]] = None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None

        @property
        def token_count(self):
            return None if self.token_ids is None else len(self.token_ids)

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

    SHAPES = _batch_shapes(Union[BlockStored, BlockRemoved, AllBlocksCleared])
    SHAPES_WITH_TOKENS = _batch_shapes(Union[BlockStoredWithTokens, BlockRemoved, AllBlocksCleared])
    GENERIC_DECODER = msgspec.msgpack.Decoder()
    DecodeError = msgspec.DecodeError
    ValidationError = msgspec.ValidationError
    encode = msgspec.msgpack.encode
